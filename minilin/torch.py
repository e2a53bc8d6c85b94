"""minilin's mixers as PyTorch autograd functions, with flash-linear-attention's signatures.

    from minilin.torch import chunk_gated_delta_rule     # instead of: from fla.ops import chunk_gated_delta_rule
    o, final_state = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)

Importable only where PyTorch is installed; minilin never depends on it. Five functions, FLA 0.6.0's names
and arguments (the ones FLA has and minilin does not raise a ValueError naming the argument):

    chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None)
    chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
    chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None)
    chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, allow_neg_eigval=False, cu_seqlens=None)
    chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None)

Shapes as FLA and minilin share them: q, k [B, T, H, K], v [B, T, HV, V] (HV = H, or a multiple of it: grouped value
heads), g and beta [B, T, HV] (g the log decay, <= 0; chunk_gla's and chunk_kda's g [B, T, HV, K], one per key channel), g_gamma [HV]
(one log decay per head, RetNet's), initial_state [B, HV, K, V]. Returns (o [B, T, HV, V] in q's dtype, final state
[B, HV, K, V] float32, or None without output_final_state). cu_seqlens [N + 1] (int32 or int64, any device) with B = 1
packs N sequences along T, the states then [N, HV, K, V]; FLA's cu_seqlens_cpu (a host copy of it) and chunk_indices
(a table made from it) are accepted beside cu_seqlens and not needed: minilin reads the offsets on the host once
either way, and refuses either one without cu_seqlens or a cu_seqlens_cpu that differs from it.

Where the work runs, by the tensors' device:
- CUDA tensors: minilin.cuda's kernels, the forward's default version and the backward `<mixer>_backward`,
  zero-copy through DLPack and on torch's current stream. q, k, v float32 or bfloat16; g, beta and the state
  are handed to the kernels in float32 (as FLA computes its gates). The forward saves only its inputs: the
  backward recomputes what it needs (the backward kernel recomputes the states), so training holds no
  [B, T/C, H, K, V] chunk states in memory.
- CPU tensors: the NumPy reference, `minilin.mixers.<mixer>.chunked` and `chunked_backward` (float32 or
  float64; other dtypes are computed in float32). Slow, exact: what the GPU path is checked against.
Every gradient comes back in its input's dtype. `use_qk_l2norm_in_kernel` normalizes q and k in torch, before
the mixer (q / sqrt(|q|^2 + 1e-6), as FLA's l2norm), so its gradient is torch's; `g_gamma` is broadcast to
[B, T, H] the same way. Inputs are checked as minilin checks them (shapes, dtypes, finite values, g <= 0, beta's
range, beta |k|^2 within its bound), with a few device-to-host syncs for the value checks (one for the finiteness of
every input, then about one per range).
"""
from __future__ import annotations

import numpy as np
import torch

from . import catalog
from .activations import L2_EPS
from .validation import check_flag

__all__ = ["chunk_simple_gla", "chunk_gla", "chunk_delta_rule", "chunk_gated_delta_rule", "chunk_kda"]

CPU_CHUNK_SIZE = 64

# mixer -> the arrays its forward takes after q, k, v (minilin's order: g before beta)
GATES = {"linear_attention": (), "simple_gla": ("g",), "gla": ("g",), "deltanet": ("beta",),
         "gated_deltanet": ("g", "beta"), "kda": ("g", "beta")}
DELTA = ("deltanet", "gated_deltanet")  # the mixers that take allow_neg_eigval (KDA keeps beta in [0, 1])


def _refuse(name: str, value, default=None):
    """FLA's arguments that minilin does not implement: an error naming them unless left at their default
    (None or False)."""
    if value is not None and value is not False:
        raise ValueError(f"{name}: not supported by minilin.torch (expected {default!r}, got {value!r})")


def _l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(|x|^2 + eps) over the last axis, eps = minilin.activations.L2_EPS (FLA's l2norm)."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))  # bfloat16's squares summed in float32
    return (wide * torch.rsqrt((wide * wide).sum(-1, keepdim=True) + L2_EPS)).to(x.dtype)


# ------------------------------------------------------------------------------------------------ GPU: minilin.cuda
def _to_cupy(x: torch.Tensor):
    """A CuPy view of a CUDA tensor (no copy): bfloat16 as its bit patterns (uint16), which minilin.cuda reads."""
    import cupy

    x = x.detach().contiguous()  # DLPack exports no autograd history; the gradients come from the backward here
    if x.dtype == torch.bfloat16:
        return cupy.from_dlpack(x.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(x)


def _to_torch(x, dtype: torch.dtype) -> torch.Tensor:
    """A torch view of a CuPy array, in `dtype` (bit patterns back to bfloat16; a float32 gradient cast)."""
    import cupy

    if x.dtype == np.uint16:
        return torch.from_dlpack(x.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(x).to(dtype)


def _torch_stream(device):
    """torch's current stream on `device` as CuPy's current stream, for the launches inside the block."""
    import cupy

    stream = torch.cuda.current_stream(device)
    try:  # CuPy 14: streams that speak the CUDA stream protocol (torch's do)
        return cupy.cuda.Stream.from_external(stream)
    except (AttributeError, TypeError):
        return cupy.cuda.ExternalStream(stream.cuda_stream, device.index)


def _gpu_forward(mixer: str, arrays: dict, scale, allow_neg_eigval: bool, cu_seqlens):
    from . import cuda

    options = {"allow_neg_eigval": allow_neg_eigval} if mixer in DELTA else {}
    return getattr(cuda, mixer)(**arrays, scale=scale, cu_seqlens=cu_seqlens, **options)


def _gpu_backward(mixer: str, arrays: dict, do, dstate, scale, allow_neg_eigval: bool, cu_seqlens):
    from . import cuda

    options = {"allow_neg_eigval": allow_neg_eigval} if mixer in DELTA else {}
    return getattr(cuda, f"{mixer}_backward")(**arrays, do=do, dstate=dstate, scale=scale, cu_seqlens=cu_seqlens,
                                              **options)


def _cupy_arrays(inputs: dict) -> dict:
    """q, k, v as given (float32 or bfloat16); gates, betas and the state in float32, as the kernels take them."""
    arrays = {}
    for name, x in inputs.items():
        if x is None:
            continue
        if name not in ("q", "k", "v"):
            x = x.float()
        elif x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"{name}: expected float32 or bfloat16 on the GPU, got {x.dtype}")
        arrays[name] = _to_cupy(x)
    return arrays


# ------------------------------------------------------------------------------------------------ CPU: NumPy
def _numpy_dtype(inputs: dict):
    """The working dtype of the NumPy reference: float64 if any input is float64 (NumPy's promotion, as the mixers
    compute: float32 inputs with a float64 state run in float64), else float32."""
    return np.float64 if any(x is not None and x.dtype == torch.float64 for x in inputs.values()) else np.float32


def _to_numpy(x: torch.Tensor, dtype) -> np.ndarray:
    return x.detach().to(torch.float64 if dtype == np.float64 else torch.float32).contiguous().numpy()


def _cpu_call(form: str, mixer: str, arrays: dict, scale, allow_neg_eigval: bool, cu_seqlens, **cotangents):
    """minilin.mixers.<mixer>.<form> ("chunked" or "chunked_backward", with do= and dstate=) on NumPy arrays."""
    options = {"allow_neg_eigval": allow_neg_eigval} if mixer in DELTA else {}
    positional = [arrays[n] for n in ("q", "k", "v", *GATES[mixer])]
    return getattr(catalog.module(mixer), form)(*positional, scale=scale, initial_state=arrays.get("initial_state"),
                                                cu_seqlens=cu_seqlens, chunk_size=CPU_CHUNK_SIZE, **cotangents,
                                                **options)


def _offsets(cu_seqlens, cu_seqlens_cpu=None, chunk_indices=None):
    """FLA's cu_seqlens (a torch integer tensor, on any device) as a NumPy array for minilin's checks, or None.
    cu_seqlens_cpu and chunk_indices, FLA's helpers derived from it, only beside it (and the host copy equal)."""
    if cu_seqlens is None:
        for name, helper in (("cu_seqlens_cpu", cu_seqlens_cpu), ("chunk_indices", chunk_indices)):
            if helper is not None:
                raise ValueError(f"{name}: given without cu_seqlens, which minilin reads the sequences from "
                                 f"(expected cu_seqlens, or neither)")
        return None
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens: expected a torch.Tensor of int32 or int64 offsets, got {type(cu_seqlens).__name__}")
    offsets = cu_seqlens.detach().cpu().numpy()
    if cu_seqlens_cpu is not None and not np.array_equal(np.asarray(cu_seqlens_cpu.detach().cpu()), offsets):
        raise ValueError(f"cu_seqlens_cpu: expected the same offsets as cu_seqlens {offsets.tolist()}, got "
                         f"{cu_seqlens_cpu.tolist()}")
    return offsets


# ------------------------------------------------------------------------------------------------ autograd
class _Mixer(torch.autograd.Function):
    """One minilin mixer as an autograd function: forward (o, final state), backward the mixer's hand-written
    gradients of L = <do, o> + <dstate, final state> (a final state no one used has dstate = None)."""

    @staticmethod
    def forward(ctx, mixer, scale, allow_neg_eigval, cu_seqlens, q, k, v, g, beta, initial_state):
        inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": initial_state}
        inputs = {n: inputs[n] for n in ("q", "k", "v", *GATES[mixer], "initial_state")}
        ctx.mixer, ctx.scale, ctx.allow_neg_eigval, ctx.cu_seqlens = mixer, scale, allow_neg_eigval, cu_seqlens
        ctx.set_materialize_grads(False)  # an output no loss used has no cotangent: None, not zeros
        ctx.names = tuple(n for n, x in inputs.items() if x is not None)
        ctx.dtypes = {n: x.dtype for n, x in inputs.items() if x is not None}
        ctx.save_for_backward(*(inputs[n] for n in ctx.names))
        if q.is_cuda:
            import cupy

            with torch.cuda.device(q.device), cupy.cuda.Device(q.device.index), _torch_stream(q.device):
                o, state = _gpu_forward(mixer, _cupy_arrays(inputs), scale, allow_neg_eigval, cu_seqlens)
                return _to_torch(o, q.dtype), _to_torch(state, torch.float32)
        dtype = _numpy_dtype(inputs)
        arrays = {n: _to_numpy(x, dtype) for n, x in inputs.items() if x is not None}
        o, state = _cpu_call("chunked", mixer, arrays, scale, allow_neg_eigval, cu_seqlens)
        return torch.from_numpy(o).to(q.dtype), torch.from_numpy(state).to(torch.float32)

    @staticmethod
    def backward(ctx, do, dstate):
        saved = dict(zip(ctx.names, ctx.saved_tensors))
        q = saved["q"]
        if do is None:  # only the final state was used
            do = torch.zeros(saved["v"].shape, dtype=saved["v"].dtype, device=q.device)
        if q.is_cuda:
            import cupy

            with torch.cuda.device(q.device), cupy.cuda.Device(q.device.index), _torch_stream(q.device):
                arrays = _cupy_arrays(saved)
                grads = _gpu_backward(ctx.mixer, arrays, _to_cupy(do.to(q.dtype)),
                                      None if dstate is None else _to_cupy(dstate.float()), ctx.scale,
                                      ctx.allow_neg_eigval, ctx.cu_seqlens)
                grads = {n: _to_torch(getattr(grads, f"d{n}"), ctx.dtypes[n]) for n in ctx.names}
        else:
            dtype = _numpy_dtype(saved)
            arrays = {n: _to_numpy(x, dtype) for n, x in saved.items()}
            grads = _cpu_call("chunked_backward", ctx.mixer, arrays, ctx.scale, ctx.allow_neg_eigval, ctx.cu_seqlens,
                              do=_to_numpy(do, dtype), dstate=None if dstate is None else _to_numpy(dstate, dtype))
            grads = {n: torch.from_numpy(np.ascontiguousarray(getattr(grads, f"d{n}"))).to(ctx.dtypes[n])
                     for n in ctx.names}
        return (None, None, None, None, *(grads.get(n) for n in ("q", "k", "v", "g", "beta", "initial_state")))


def _check_tensors(**tensors):
    for name, x in tensors.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    device = tensors["q"].device
    for name, x in tensors.items():
        if x is not None and x.device != device:
            raise ValueError(f"{name}: expected a tensor on q's device {device}, got one on {x.device}")


def _run(mixer, q, k, v, g=None, beta=None, *, scale, initial_state, output_final_state, cu_seqlens,
         cu_seqlens_cpu=None, chunk_indices=None, normalize_qk=False, allow_neg_eigval=False):
    _check_tensors(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    for name in GATES[mixer]:
        if {"g": g, "beta": beta}[name] is None:
            raise TypeError(f"{name}: expected a torch.Tensor, got None")
    offsets = _offsets(cu_seqlens, cu_seqlens_cpu, chunk_indices)
    allow_neg_eigval = check_flag("allow_neg_eigval", allow_neg_eigval)
    if check_flag("use_qk_l2norm_in_kernel", normalize_qk):
        q, k = _l2_normalize(q), _l2_normalize(k)
    o, state = _Mixer.apply(mixer, scale, allow_neg_eigval, offsets, q, k, v, g, beta, initial_state)
    return o, (state if output_final_state else None)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, **kwargs):
    """Simple GLA, S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t (minilin.mixers.simple_gla); no gate
    at all (g and g_gamma None) is linear attention. g [B, T, HV] or g_gamma [HV], log decays <= 0."""
    _refuse("state_v_first", state_v_first, False)
    for name in kwargs:
        _refuse(name, kwargs[name])
    if g is not None and g_gamma is not None:
        raise ValueError("g, g_gamma: expected at most one of them, got both")
    if g_gamma is not None:
        if not isinstance(g_gamma, torch.Tensor):
            raise TypeError(f"g_gamma: expected a torch.Tensor [HV], got {type(g_gamma).__name__}")
        if g_gamma.shape != (v.shape[2],):
            raise ValueError(f"g_gamma: expected shape [HV] = [{v.shape[2]}], got {list(g_gamma.shape)}")
        if not bool((g_gamma <= 0).all()):  # named here: expanded, it would be refused as g
            raise ValueError(f"g_gamma: expected log-space decays <= 0, got max {float(g_gamma.max()):g}")
        g = g_gamma.to(torch.float32).expand(*v.shape[:3])
    if g is None:
        return _run("linear_attention", q, k, v, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                    chunk_indices=chunk_indices)
    return _run("simple_gla", q, k, v, g, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                chunk_indices=chunk_indices)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
              cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, **kwargs):
    """GLA, S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t (minilin.mixers.gla); g [B, T, HV, K],
    log decays <= 0, one per key channel. On the GPU the backward is gla_bwd v2, chunked on tensor cores (bf16, K 64
    or 128, V a multiple of 64; the token loop v1 elsewhere: csrc/NOTES.md)."""
    _refuse("state_v_first", state_v_first, False)
    for name in kwargs:
        _refuse(name, kwargs[name])
    return _run("gla", q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, chunk_indices=chunk_indices)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, **kwargs):
    """DeltaNet, S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T (minilin.mixers.deltanet); beta [B, T, HV]."""
    for name in kwargs:
        _refuse(name, kwargs[name])
    return _run("deltanet", q, k, v, None, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                chunk_indices=chunk_indices, normalize_qk=use_qk_l2norm_in_kernel)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """Gated DeltaNet, S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T
    (minilin.mixers.gated_deltanet); g, beta [B, T, HV]; allow_neg_eigval: beta in [0, 2]."""
    for name, value in (("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel),
                        ("state_v_first", state_v_first), ("cp_context", cp_context), *kwargs.items()):
        _refuse(name, value, False if name in ("use_beta_sigmoid_in_kernel", "state_v_first") else None)
    return _run("gated_deltanet", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                chunk_indices=chunk_indices, normalize_qk=use_qk_l2norm_in_kernel, allow_neg_eigval=allow_neg_eigval)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              chunk_indices=None, cp_context=None, **kwargs):
    """Kimi Delta Attention, S' = diag(exp(g_t)) S_{t-1}, S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
    (minilin.mixers.kda); g [B, T, HV, K] log decays <= 0, one per key channel; beta [B, T, HV] in [0, 1]. g is the
    log decay itself (FLA's use_gate_in_kernel, which makes it from a raw gate, is refused). On the GPU the backward
    is kda_bwd v2 for bf16 at K = 64 / 128 (chunked on tensor cores), v1, the token loops, elsewhere (csrc/NOTES.md)."""
    flags = {"use_gate_in_kernel": use_gate_in_kernel, "use_beta_sigmoid_in_kernel": use_beta_sigmoid_in_kernel,
             "allow_neg_eigval": allow_neg_eigval, "safe_gate": safe_gate, "disable_recompute": disable_recompute,
             "return_intermediate_states": return_intermediate_states, "state_v_first": state_v_first}
    for name, value in flags.items():
        _refuse(name, value, False)
    for name, value in (("lower_bound", lower_bound), ("cp_context", cp_context), *kwargs.items()):
        _refuse(name, value)
    return _run("kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                chunk_indices=chunk_indices, normalize_qk=use_qk_l2norm_in_kernel)
