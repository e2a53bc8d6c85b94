"""minilin.nn: the pieces of a small language model, each with its forward and its hand-written backward,
in NumPy alone (no autograd library): every gradient of a trained model comes from code you can read.

    from minilin.nn import LanguageModel, AdamW
    model = LanguageModel(["gated_deltanet", "attention"], vocab=64, d_model=64, heads=2)
    model.zero_grad()
    loss, logits = model.loss_and_grads(tokens, targets)     # forward, cross-entropy, backward
    AdamW(model).step()

module.py       parameters, gradients and sublayers by name; checkpoints (state_dict)
layers.py       Embedding, Linear, RMSNorm, ShortConv, SwiGLU
mixer_layer.py  any causal minilin mixer between its projections (through the mixer's own backward)
model.py        Block (mixer layer + MLP, residuals), LanguageModel, hybrid_pattern
loss.py         softmax cross-entropy over the positions with a target
optim.py        AdamW, gradient clipping, the learning-rate schedule
"""
from .layers import Embedding, Linear, RMSNorm, ShortConv, SwiGLU
from .loss import IGNORE, accuracy, cross_entropy
from .mixer_layer import MixerLayer
from .model import Block, LanguageModel, hybrid_pattern
from .module import Module
from .optim import AdamW, clip_grad_norm, cosine_schedule

__all__ = ["AdamW", "Block", "Embedding", "IGNORE", "LanguageModel", "Linear", "MixerLayer", "Module", "RMSNorm",
           "ShortConv", "SwiGLU", "accuracy", "clip_grad_norm", "cosine_schedule", "cross_entropy", "hybrid_pattern"]
