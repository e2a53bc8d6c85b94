"""Exercise 22: train a two-layer model on associative recall with your own gradients, and watch it learn.

The task is MQAR (multi-query associative recall, `minilin.train.mqar`): a context of key-value pairs
`k1 v1 k2 v2 ...`, then queries `... k2 ...` whose target is the value that followed that key. The model is
minilin.nn's small language model with two blocks of causal softmax attention:

    x      = E[tokens]                                    embedding     [B, T, d]
    x      = block(x)  for each of the two blocks         mixer layer + MLP, residuals (minilin.nn.Block)
    h      = x / r * w,   r = sqrt(mean(x^2) + eps)       the final RMSNorm   (w: final_norm.weight [d])
    logits = h W                                          the head            (W: head.weight [d, vocab])
    L      = -(1/n) sum_{queries} log softmax(logits)[target]      cross-entropy at the n query positions

You write the parts around the blocks, forward and backward, and the optimizer; each block's own forward
and backward come from minilin.nn (`block.forward(x) -> (y, ctx)`, `block.backward(ctx, dy) -> dx`, which
also adds the block's parameter gradients into its `grads`). The backward, line by line from the bottom:

    cross-entropy   dlogits = (softmax(logits) - onehot(target)) / n   at the query positions, 0 elsewhere
    head            dW = h^T dlogits (summed over every position),     dh = dlogits W^T
    RMSNorm         dw = sum(dh * x_hat),   dx = (g - x_hat mean(g * x_hat)) / r   with x_hat = x / r, g = w dh
    blocks          dx = block.backward(ctx, dx), last block first
    embedding       dE[v] += sum of dx over the positions holding token v    (np.add.at: repeated rows add up)

(RMSNorm's dx: r depends on every x_j through mean(x^2), dr/dx_j = x_j / (d r), which gives the second term.)

Then AdamW (Loshchilov & Hutter 2019) moves each parameter p with its gradient g, step t = 1, 2, ...:

    m = b1 m + (1 - b1) g,    v = b2 v + (1 - b2) g^2                 running moments
    p = p - lr wd p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)   decay (matrices only), then Adam

after the gradients are clipped to a global norm of 1 (all parameters together: g *= min(1, 1 / ||g||)).

The model's parameters and gradients, by name (`model.named_params()` yields (name, param, grad) for all):
model.children["embed"].weight [vocab, d], model.children["final_norm"].weight [d],
model.children["head"].weight [d, vocab], model.blocks (the two Blocks); each layer's `grads` dict holds
its gradients under the same keys as `params` ("weight"), to be added into (+=), never replaced.

Shapes: tokens, targets [B, T] integers (targets -100 where nothing is predicted); logits [B, T, vocab].
Check: `minilin check 22` (each piece against minilin.nn's; then a training run of about a hundred and fifty
steps on a fixed seed: the held-out loss must fall and the accuracy rise past the thresholds a correct
solution reaches). Watch it learn: `python exercises/22_train_mqar/train.py` prints the loss as it goes.
"""
import numpy as np

from minilin.nn.model import LanguageModel
from minilin.train.mqar import MQAR, batch, held_out

IGNORE = -100
TASK = MQAR(vocab=32, seq_len=24, num_kv_pairs=4)     # 4 pairs, 16 possible values: chance is 1 / 16


def cross_entropy(logits, targets):
    """Mean softmax cross-entropy over the positions with a target, and its gradient.

    logits: [B, T, vocab]; targets: [B, T] integers, IGNORE (-100) where there is no target.
    Returns (loss, dlogits): a float and [B, T, vocab] in the logits' dtype, zero at ignored positions.
    log softmax(z) = z - m - log sum exp(z - m) with m the row max: no exp can overflow.
    """
    raise NotImplementedError(
        "TODO: log-softmax with the row max subtracted; the loss at the counted positions; (p - onehot) / n there (about 10 lines)")


def rms_norm_backward(x, weight, dy, *, eps=1e-6):
    """The gradients of y = x / r * weight, r = sqrt(mean(x^2, last axis) + eps), given dy = dL/dy.

    x, dy: [..., d]; weight: [d]. Returns (dx [..., d], dweight [d]), dweight summed over every position.
    """
    raise NotImplementedError(
        "TODO: x_hat = x / r; dweight = sum of dy * x_hat; g = weight * dy; dx = (g - x_hat mean(g x_hat)) / r (about 6 lines)")


def adamw_update(param, grad, m, v, step, *, lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1, decay=True):
    """One AdamW step for one parameter (module docstring); step t counts from 1.

    param, grad, m, v: arrays of one shape; decay: whether weight decay applies to this parameter.
    Returns (new param, new m, new v): new arrays (the caller writes them back), the inputs unchanged.
    """
    raise NotImplementedError(
        "TODO: the moments, their bias corrections 1 - b^t, the decoupled weight decay, then the Adam step (about 7 lines)")


def clip_by_global_norm(grads, max_norm=1.0):
    """Scale every gradient by min(1, max_norm / ||g||), ||g|| the norm of all of them together:
    ||g|| = sqrt(sum over every array of the sum of its squares), computed in float64.

    grads: a list of arrays. Returns (the scaled gradients, a list of new arrays; ||g||, a float).
    Unchanged (a factor of 1) when ||g|| <= max_norm.
    """
    raise NotImplementedError(
        "TODO: the global norm over all arrays, then one factor for all of them (about 3 lines)")


def loss_and_grads(model, tokens, targets):
    """Forward and backward through `model` (a minilin.nn.LanguageModel) by hand (module docstring): the
    embedding, each block (block.forward / block.backward), the final RMSNorm, the head and the cross-entropy.

    tokens, targets: [B, T] integers. Adds every parameter's gradient into the model's `grads` (the caller
    zeroes them first) and returns the loss, a float. The head has no bias; the norm's eps is 1e-6.
    """
    raise NotImplementedError(
        "TODO: forward keeping each block's ctx; cross_entropy; back through head, final norm, blocks, embedding (about 15 lines)")


def evaluate(model, tokens, targets):
    """(mean loss, accuracy) of `model` at the positions with a target; the accuracy is the fraction of
    them whose largest logit is the target. model.forward(tokens)[0] gives the logits (no gradients)."""
    raise NotImplementedError(
        "TODO: the logits from model.forward, your cross_entropy, and the fraction of argmax == target where counted (about 4 lines)")


def train(*, steps=150, batch_size=32, lr=1e-2, seed=0, verbose=False):
    """Train a two-block softmax-attention model (d_model 32, 2 heads) on TASK from scratch.

    model = LanguageModel(["attention", "attention"], vocab=TASK.vocab, d_model=32, heads=2, seed=seed);
    step i (i = 0 .. steps - 1) trains on batch(TASK, i, batch_size, seed): zero the gradients, your
    loss_and_grads, your clip_by_global_norm (to 1), your adamw_update on every parameter (weight decay
    only where param.ndim >= 2 and the name does not end with "conv.weight"), constant learning rate lr.
    verbose: print the step and the loss every 25 steps. Returns (model, accuracy): the trained model and
    its accuracy on held_out(TASK, 256, seed), from your evaluate.
    """
    raise NotImplementedError(
        "TODO: the model and AdamW's moments; per step: batch, zero_grad, loss_and_grads, the clip, adamw_update (about 15 lines)")


if __name__ == "__main__":
    trained, accuracy = train(verbose=True)
    print(f"held-out accuracy: {accuracy:.3f} (chance: 1 / {TASK.vocab - TASK.vocab // 2})")
