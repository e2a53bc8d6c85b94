"""The mixers: one module per mixer, each with `recurrent`, `chunked`, `step` and (where one exists)
`parallel`, all returning (o, final_state). See CONVENTIONS.md for shapes and gates."""
from . import (attention, deltanet, gated_deltanet, gla, kda, lightning, linear_attention, mamba2, retnet,
               simple_gla)
from . import linformer, nystromformer, sliding_window
from . import hgrn, hgrn2, mamba, rwkv6, rwkv7, s4

__all__ = ["attention", "linear_attention", "retnet", "lightning", "mamba2", "simple_gla", "gla",
           "s4", "mamba", "hgrn", "hgrn2", "rwkv6", "deltanet", "gated_deltanet", "kda", "rwkv7",
           "sliding_window", "linformer", "nystromformer"]
