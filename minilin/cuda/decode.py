"""One decode step on the GPU: one token for each of N sequences, their states updated in place.

    gated_linear_step(q, k, v, g=None, *, state, ...)    S_t = S' + k_t v_t^T                          o_t = scale S_t^T q_t
    delta_rule_step(q, k, v, g, beta, *, state, ...)     S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
    with S' = exp(g_t) S_{t-1} (g [N, H]), diag(exp(g_t)) S_{t-1} (g [N, H, K]: GLA, KDA), or S_{t-1} (g None).

These are the NumPy `step` forms (minilin/mixers/_gated_linear.py, _delta_rule.py) as one kernel (csrc/decode/):
a step moves each state through DRAM once (read, then written over) and does about four multiply-adds per state
element, so its time is the state's bytes over the memory bandwidth, and the launch's latency at small N.

Shapes: q, k [N, H, K]; v [N, H, V]; g [N, H] or [N, H, K]; beta [N, H]; o [N, H, V] in v's dtype.
q, k, v float32 or bfloat16 (native or uint16 bits, `bf16`); g, beta and states float32.

The states (`state`):
- [N, H, K, V] float32: row n is sequence n's state;
- [P, H, K, V] with `state_indices` [N] (int32 or int64, on the GPU): sequence n's state is row state_indices[n] of
  a pool of P states, as a serving engine keeps one per request slot (continuous batching); rows not indexed are
  neither read nor written;
- None: zeros (the first token), a new [N, H, K, V] array comes back.
in_place=True (the default) writes each new state over its old row and returns `state` itself; in_place=False
leaves `state` untouched and returns the new states as a new [N, H, K, V] array (row n for sequence n, also with
state_indices: two sequences may then read one state, forking it). out: an [N, H, V] array that receives o.

check_values (device-to-host syncs; False skips them, for timing and serving loops that check elsewhere): g <= 0;
beta in [0, 1] (or [0, 2]) and beta |k|^2 within that bound (front.check_key_strength); state_indices inside
[0, P), and distinct when in place (two sequences writing one state would race). Even unchecked the kernel never
reads or writes outside the pool: a sequence whose index lies outside it gets NaN outputs and no state write.

Returns (o [N, H, V], the new states). Every shape, dtype, contiguity and device check runs first, then the value
checks, then the launch on CuPy's current stream.
"""
from __future__ import annotations

import numpy as np

from ..backend import is_cupy_array
from ..validation import Shapes, check_beta, check_flag, check_log_gate, check_nonempty, check_scale
from . import bf16
from .front import (_describe, check_all_finite, check_input, check_key_strength, cupy_module, extension,
                    runnable_version)

GATES = {None: 0, "scalar": 1, "channel": 2}  # the kernel's gate codes (csrc/minilin_cuda.h, GateKind)
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def check_indices(name: str, x, shapes: Shapes, device: int, dims: str = "N"):
    """state_indices: a CuPy int32 / int64 array of shape [N] (the sequences' letter: `dims`), contiguous, on the
    current device."""
    if not is_cupy_array(x):
        raise TypeError(f"{name}: expected a CuPy integer array on the GPU, got {_describe(x)} "
                        f"(move it with cupy.asarray)")
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name}: expected int32 or int64 (rows of the state pool), got {x.dtype}")
    shapes.bind(name, x.shape, dims)
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array (cupy.ascontiguousarray), got strides {x.strides}")
    if x.device.id != device:
        raise ValueError(f"{name}: expected an array on the current device {device}, got one on device {x.device.id}")
    return x


def check_index_values(indices, pool: int, distinct: bool, pool_dims: str = "P H K V") -> None:
    """Every index inside [0, pool), and, when `distinct`, none twice (two syncs, a third for `distinct`). pool_dims:
    the state pool's dims for the message, its first letter the rows ("S H N P" for Mamba-2's)."""
    if indices.size == 0:
        return
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= pool:
        rows = pool_dims.split()[0]
        raise ValueError(f"state_indices: expected rows of the state pool, in [0, {pool}) (state is "
                         f"[{', '.join(pool_dims.split())}], {rows} = {pool}), got min {low}, max {high}")
    if distinct:
        xp = cupy_module()
        ordered = xp.sort(indices)
        repeated = ordered[1:] == ordered[:-1]
        if bool(repeated.any()):
            first = int(ordered[1:][repeated][0])
            raise ValueError(f"state_indices: expected distinct rows in place (two sequences writing one state would "
                             f"race), got row {first} more than once; in_place=False reads a row for several "
                             f"sequences (a fork) and returns their new states apart")


def _step(delta: bool, q, k, v, g, gate, beta, *, state, scale, state_indices, in_place, out, allow_neg_eigval,
          normalize_qk, check_values, version):
    """Check every argument, then launch decode `version` (None: the last that runs here)."""
    cupy = cupy_module() if is_cupy_array(q) else None
    device = cupy.cuda.Device().id if cupy is not None else 0
    shapes = Shapes()
    q = check_input("q", q, "N H K", shapes, float32_only=False, device=device)
    check_input("k", k, "N H K", shapes, float32_only=False, like=q, device=device)
    check_input("v", v, "N H V", shapes, float32_only=False, like=q, device=device)
    check_nonempty(shapes, (("q", "N H K"), ("v", "N H V")))  # before K ** -0.5
    if gate is not None:  # a gated mixer's g is required: the kernel reads g = None as no decay
        check_input("g", g, "N H K" if gate == "channel" else "N H", shapes, float32_only=True, device=device)
    if delta:
        check_input("beta", beta, "N H", shapes, float32_only=True, device=device)
    if state_indices is not None:
        check_indices("state_indices", state_indices, shapes, device)
        if state is None:
            raise TypeError("state: expected the pool [P, H, K, V] that state_indices index, got None")
        check_input("state", state, "P H K V", shapes, float32_only=True, device=device)
    elif state is not None:
        check_input("state", state, "N H K V", shapes, float32_only=True, device=device)
    if out is not None:
        check_input("out", out, "N H V", shapes, float32_only=False, like=v, like_name="v", device=device)
    in_place = check_flag("in_place", in_place)
    normalize_qk = check_flag("normalize_qk", normalize_qk)
    allow_neg_eigval = check_flag("allow_neg_eigval", allow_neg_eigval)
    scale = check_scale(scale, shapes["K"])
    if check_values:
        if state_indices is not None:
            check_index_values(state_indices, shapes["P"], distinct=in_place)
        rows = state if state is None or state_indices is None else state[state_indices]  # the pool's rows in use
        check_all_finite(("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", rows))
        if g is not None:
            check_log_gate("g", g)
        if delta:
            check_beta(beta, allow_neg_eigval)
            if not normalize_qk:  # normalized keys have |k|^2 < 1: beta's own range is the bound
                check_key_strength(k, beta, allow_neg_eigval)
    return _launch(delta, q, k, v, g, gate, beta, state, state_indices, in_place, out, scale, normalize_qk, version,
                   shapes)


def _launch(delta, q, k, v, g, gate, beta, state, state_indices, in_place, out, scale, normalize_qk, version, shapes):
    cupy = cupy_module()
    is_bf16 = bf16.is_bf16(q.dtype)
    N, H, K, V = (shapes[d] for d in "NHKV")
    info = runnable_version("decode", version, is_bf16, K, V)
    o = cupy.empty(v.shape, v.dtype) if out is None else out
    if state is not None and in_place:
        new_state, out_indices, pool_out = state, state_indices, state.shape[0]
    else:
        new_state, out_indices, pool_out = cupy.empty((N, H, K, V), cupy.float32), None, N
    indices_int64 = state_indices is not None and state_indices.dtype == np.int64
    extension().decode(
        info["version"], q.data.ptr, k.data.ptr, v.data.ptr, 0 if g is None else g.data.ptr, GATES[gate],
        beta.data.ptr if delta else 0,
        0 if state is None else state.data.ptr, 0 if state_indices is None else state_indices.data.ptr,
        0 if state is None else state.shape[0],
        new_state.data.ptr, 0 if out_indices is None else out_indices.data.ptr, pool_out, indices_int64,
        o.data.ptr, N, H, K, V, float(scale), delta, normalize_qk, 1 if is_bf16 else 0,
        cupy.cuda.get_current_stream().ptr)
    return o, new_state


def gated_linear_step(q, k, v, g=None, *, state=None, scale=None, state_indices=None, in_place=True, out=None,
                      version=None, check_values=True):
    """One token of the scalar- or channel-gated linear recurrence for each of N sequences (module docstring).

    g: None (linear attention), [N, H] (one decay per head: simple GLA, RetNet, Lightning, Mamba-2) or [N, H, K]
    (one per key channel: GLA), float32 log-decays <= 0. Returns (o [N, H, V], new states).
    """
    gate = None if g is None else ("channel" if getattr(g, "ndim", 0) == 3 else "scalar")
    return _step(False, q, k, v, g, gate, None, state=state, scale=scale, state_indices=state_indices,
                 in_place=in_place, out=out, allow_neg_eigval=False, normalize_qk=False, check_values=check_values,
                 version=version)


def delta_rule_step(q, k, v, g, beta, *, state=None, scale=None, state_indices=None, in_place=True, out=None,
                    allow_neg_eigval=False, normalize_qk=False, version=None, check_values=True):
    """One token of the (gated) delta rule for each of N sequences (module docstring).

    g: None (DeltaNet), [N, H] (Gated DeltaNet) or [N, H, K] (KDA), float32 log-decays <= 0, applied before the
    correction. beta [N, H] float32 in [0, 1] ([0, 2] with allow_neg_eigval). normalize_qk: divide q and k by
    sqrt(|x|^2 + 1e-6) inside the kernel (FLA's use_qk_l2norm_in_kernel). Returns (o [N, H, V], new states).
    """
    gate = None if g is None else ("channel" if getattr(g, "ndim", 0) == 3 else "scalar")
    return _step(True, q, k, v, g, gate, beta, state=state, scale=scale, state_indices=state_indices,
                 in_place=in_place, out=out, allow_neg_eigval=allow_neg_eigval, normalize_qk=normalize_qk,
                 check_values=check_values, version=version)
