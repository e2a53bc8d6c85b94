"""minilin: linear attention, state-space models and the delta rule, built from scratch.

    from minilin.mixers import gated_deltanet
    o, state = gated_deltanet.chunked(q, k, v, g, beta)

Every mixer lives in `minilin.mixers.<name>` with its forms side by side; `minilin.feature_maps` holds the
kernels of linear attention; `minilin.chunking` the pieces all chunked forms share.
"""
from . import feature_maps, mixers
from .mixers import (attention, deltanet, gated_deltanet, gla, kda, lightning, linear_attention, mamba2,
                     retnet, simple_gla)

__all__ = ["feature_maps", "mixers", "attention", "linear_attention", "retnet", "lightning", "mamba2",
           "simple_gla", "gla", "deltanet", "gated_deltanet", "kda"]
__version__ = "0.1.0"
