"""The backward passes on the GPU: the gradients of L = <do, o> + <dstate, final state> (CONVENTIONS.md, Gradients).

    gated_linear_backward(q, k, v, g=None, *, do, dstate=None, ...)  -> (dq, dk, dv, dg, dinitial_state)
    channel_gated_linear_backward(q, k, v, g, *, do, dstate=None, ...)  -> the same, g and dg [B, T, HV, K]
    delta_rule_backward(q, k, v, g, beta, *, do, dstate=None, ...)   -> (dq, dk, dv, dg, dbeta, dinitial_state)
    channel_delta_rule_backward(q, k, v, g, beta, *, do, ...)        -> the same, g and dg [B, T, HV, K]
    simple_gla_backward, linear_attention_backward, retnet_backward, lightning_backward, mamba2_backward,
    gated_deltanet_backward, deltanet_backward, gla_backward, hgrn2_backward, kda_backward: the mixers' named tuples
    (SIGNATURE.gradients), one field d<name> per array the forward takes (RetNet's, Lightning's, Mamba-2's and
    HGRN2's through the chain rule of their mapping onto the gated linear recurrence, as their NumPy backward
    takes it).

The forward's arguments come first, as the forward takes them, then do and dstate by keyword (dstate None: zeros).
Shapes: q, k [B, T, H, K]; v and do [B, T, HV, V] (do in v's dtype: float32 or bfloat16); g, beta [B, T, HV] float32
(GLA's, HGRN2's and KDA's g [B, T, HV, K]);
initial_state and dstate [B, HV, K, V] float32 ([N, HV, K, V] with cu_seqlens). Every gradient comes back (CuPy) in
its input's dtype, as the kernels write it (sums taken in float32 first): dq, dk [B, T, H, K] in q's, dv [B, T, HV, V]
in v's (bfloat16 in the input's form, native or uint16 bits); dg (as g), dbeta [B, T, HV] and dinitial_state (as
initial_state) float32; None for an array that was not given (g, initial_state). Grouped value heads and packed
sequences as the forward's versions without `packed` take them (front.py): q and k repeated to HV heads, and a q/k
head's gradient the sum over its value heads (`heads.reduce`, in float32); one backward launch per sequence, each
sequence's gradients its own, joined by `varlen.backward` as the NumPy backward joins them.

Kernels (csrc/linear_bwd/, csrc/delta_bwd/, csrc/gla_bwd/, csrc/kda_bwd/; `versions('linear_bwd')` and so on): v1
is the definition run backwards (the state's adjoint in registers, token by token), for float32 and bf16 and any
K <= 256 (kda_bwd v1: delta_bwd v1's passes with a decay per key row); linear_bwd v2, delta_bwd v2 (through
the WY form), gla_bwd v2 (from gla v4's prepared tiles) and kda_bwd v2 (the WY form from kda v6's prepared tiles) are
chunked on bf16 tensor cores and take K = 64 or 128 and V a multiple of 64. version=None runs the last rung for the dtype that takes the
shape (`front.takes_shape`) and is not passed over (front.SLOWER_RUNGS), as the forward does. Every version writes
every gradient; for the gated linear family the gate's is a reverse cumulative sum of q_s . dq_s - k_s . dk_s
(plus the final state's term), which csrc/linear_bwd/v1_recurrent.cu derives and v2 takes chunk by chunk (GLA's,
per channel: csrc/gla_bwd/v1_recurrent.cu and v2_chunked_mma.cu).
"""
from __future__ import annotations

from .. import catalog, heads, varlen
from ..activations import l2_normalize
from ..validation import Shapes, check_beta, check_flag, check_log_gate, check_scale
from . import bf16
from .front import (_check_common, address, check_all_finite, check_input, check_key_strength, cupy_module,
                    extension, l2_normalized, runnable_version)
from .mixers import (hgrn2_key, lightning_log_gate, mamba2_check, mamba2_check_values, mamba2_mapping,
                     per_head_shapes, retnet_log_gate)


def grouped(q, k, shapes: Shapes):
    """q and k with each head repeated HV / H times (`heads.expand`; unchanged when HV = H), as the backward
    kernels read them: one q/k head per value head."""
    group = shapes["HV"] // shapes["H"]
    return heads.expand(q, group), heads.expand(k, group)


def _check_cotangents(do, dstate, v, shapes: Shapes, packed: bool):
    """do [B, T, HV, V] in v's dtype, dstate [B, HV, K, V] ([N, HV, K, V] when packed) float32 or None (their values
    are checked with the inputs')."""
    check_input("do", do, "B T HV V", shapes, float32_only=False, like=v, like_name="v")
    if dstate is not None:
        check_input("dstate", dstate, "N HV K V" if packed else "B HV K V", shapes, float32_only=True)


def _launch(op: str, info: dict, q, k, v, g, beta, initial_state, do, dstate, scale):
    """Run backward version `info` of `op` ('linear_bwd', 'delta_bwd', 'gla_bwd' or 'kda_bwd') over checked arrays, q
    and k with v's heads; returns (dq, dk, dv) in q's and v's dtype and float32 (dg, dbeta, dh0), None for what was
    not asked for (dg without g, dbeta outside the delta family, dh0 without initial_state)."""
    cupy = cupy_module()
    cuda = extension()
    is_bf16 = bf16.is_bf16(q.dtype)
    B, T, H, K = q.shape
    V = v.shape[-1]
    delta = op in ("delta_bwd", "kda_bwd")
    dq, dk = cupy.empty((B, T, H, K), q.dtype), cupy.empty((B, T, H, K), q.dtype)
    dv = cupy.empty((B, T, H, V), v.dtype)
    dg = cupy.empty(g.shape, cupy.float32) if g is not None else None  # [B, T, H], or [B, T, H, K] per channel
    dbeta = cupy.empty((B, T, H), cupy.float32) if delta else None
    dh0 = cupy.empty((B, H, K, V), cupy.float32) if initial_state is not None else None
    workspace_size = cuda.workspace_bytes(op, info["version"], B, T, H, K, V)
    workspace = cupy.cuda.alloc(workspace_size) if workspace_size else None
    cuda.backward(op, info["version"], address(q), address(k), address(v), address(g), address(beta),
                  address(initial_state), address(do), address(dstate), address(dq), address(dk), address(dv),
                  address(dg), address(dbeta), address(dh0), workspace.ptr if workspace is not None else 0,
                  workspace_size, B, T, H, K, V, float(scale), 1 if is_bf16 else 0,
                  cupy.cuda.get_current_stream().ptr)
    return dq, dk, dv, dg, dbeta, dh0


def _reduced(dx, group: int):
    """heads.reduce (a q/k head's gradient: the sum over its value heads) in float32, back in dx's dtype."""
    return dx if group == 1 else bf16.like(heads.reduce(bf16.as_float32(dx), group), dx)


def gated_linear_backward(q, k, v, g=None, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None,
                          version=None, check_values=True):
    """Gradients of the scalar-gated linear recurrence (front.gated_linear): (dq, dk, dv, dg, dinitial_state), dtypes
    as the module says, dg None without g and dinitial_state None without initial_state.

    check_values: the inputs, do and dstate finite and g <= 0 (device-to-host syncs); False skips them."""
    return _linear_backward("linear_bwd", "B T HV", q, k, v, g, do, dstate, scale, initial_state, cu_seqlens, version,
                            check_values, g_optional=True)


def channel_gated_linear_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None,
                                  version=None, check_values=True):
    """Gradients of linear attention with a decay per key channel (front.channel_gated_linear, GLA): (dq, dk, dv, dg,
    dinitial_state), g and dg [B, T, HV, K] float32, the rest as the module says (`versions('gla_bwd')`).

    check_values: the inputs, do and dstate finite and g <= 0 (device-to-host syncs); False skips them."""
    return _linear_backward("gla_bwd", "B T HV K", q, k, v, g, do, dstate, scale, initial_state, cu_seqlens, version,
                            check_values)


def _linear_backward(op, gate_dims, q, k, v, g, do, dstate, scale, initial_state, cu_seqlens, version, check_values,
                     g_optional=False):
    """The gated linear family's backward (op 'linear_bwd', g [B, T, HV]; 'gla_bwd', g [B, T, HV, K]); g_optional: None
    is no decay (linear attention)."""
    shapes, offsets = _check_common(q, k, v, initial_state, cu_seqlens)
    if g is not None or not g_optional:
        check_input("g", g, gate_dims, shapes, float32_only=True)
    _check_cotangents(do, dstate, v, shapes, offsets is not None)
    if check_values:
        check_all_finite(("q", q), ("k", k), ("v", v), ("g", g), ("initial_state", initial_state), ("do", do),
                         ("dstate", dstate))
        if g is not None:
            check_log_gate("g", g)
    scale = check_scale(scale, shapes["K"])
    info = runnable_version(op, version, bf16.is_bf16(q.dtype), shapes["K"], shapes["V"])
    q_rep, k_rep = grouped(q, k, shapes)

    def one(q, k, v, g, initial_state, do, dstate):
        dq, dk, dv, dg, _, dh0 = _launch(op, info, q, k, v, g, None, initial_state, do, dstate, scale)
        return dq, dk, dv, dg, dh0

    dq, dk, dv, dg, dh0 = varlen.backward(one, (q_rep, k_rep, v, g), initial_state, do, dstate, offsets)
    group = shapes["HV"] // shapes["H"]
    return _reduced(dq, group), _reduced(dk, group), dv, dg, dh0


def gla_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None, version=None,
                 check_values=True):
    """GLA's gradients: GlaGradients(dq, dk, dv, dg, dinitial_state). g and dg [B, T, HV, K] float32."""
    dq, dk, dv, dg, dh0 = channel_gated_linear_backward(q, k, v, g, do=do, dstate=dstate, scale=scale,
                                                        initial_state=initial_state, cu_seqlens=cu_seqlens,
                                                        version=version, check_values=check_values)
    return _gradients("gla")(dq=dq, dk=dk, dv=dv, dg=dg, dinitial_state=dh0)


def hgrn2_backward(q, v, g, *, do, dstate=None, scale=None, initial_state=None, version=None, check_values=True):
    """HGRN2's gradients: Hgrn2Gradients(dq, dv, dg, dinitial_state). The forward runs GLA with the key tied to the
    forget gate, k = 1 - exp(g) (mixers.hgrn2_key), so g reaches the loss twice, as the decay (GLA's dg) and as the
    key: dg = dg_gla - exp(g) dk, on CuPy in float32 from dk as the kernel returns it (bf16 for bf16 inputs), as
    minilin.mixers.hgrn2's backward does it."""
    k = hgrn2_key(q, g, "B T H")
    dq, dk, dv, dg, dh0 = channel_gated_linear_backward(q, k, v, g, do=do, dstate=dstate, scale=scale,
                                                        initial_state=initial_state, version=version,
                                                        check_values=check_values)
    dg -= bf16.as_float32(dk) * cupy_module().exp(g)
    return _gradients("hgrn2")(dq=dq, dv=dv, dg=dg, dinitial_state=dh0)


def delta_rule_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None,
                        allow_neg_eigval=False, normalize_qk=False, version=None, check_values=True):
    """Gradients of the (gated) delta rule (front.delta_rule): (dq, dk, dv, dg, dbeta, dinitial_state), dtypes as the
    module says, dg None without g (DeltaNet) and dinitial_state None without initial_state.

    normalize_qk: as the forward, q and k divided by r = sqrt(|x|^2 + 1e-6) first; the kernel's gradients with
    respect to the normalized y = x / r are then carried back by dx = (dy - y (y . dy)) / r
    (`activations.l2_normalize`), in float32 (then back in q's dtype).
    check_values: the inputs, do and dstate finite, g <= 0, beta's range, beta |k|^2 within its bound
    (device-to-host syncs)."""
    return _delta_rule_backward("delta_bwd", "B T HV", q, k, v, g, beta, do, dstate, scale, initial_state, cu_seqlens,
                                allow_neg_eigval, normalize_qk, version, check_values, g_optional=True)


def channel_delta_rule_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None,
                                cu_seqlens=None, normalize_qk=False, version=None, check_values=True):
    """Gradients of the delta rule with a decay per key channel (front.channel_delta_rule, Kimi Delta Attention):
    (dq, dk, dv, dg, dbeta, dinitial_state), g and dg [B, T, HV, K] float32, the rest as `delta_rule_backward`
    (`versions('kda_bwd')`); beta in [0, 1]."""
    return _delta_rule_backward("kda_bwd", "B T HV K", q, k, v, g, beta, do, dstate, scale, initial_state,
                                cu_seqlens, False, normalize_qk, version, check_values)


def _delta_rule_backward(op, gate_dims, q, k, v, g, beta, do, dstate, scale, initial_state, cu_seqlens,
                         allow_neg_eigval, normalize_qk, version, check_values, g_optional=False):
    """The delta family's backward (op 'delta_bwd', g [B, T, HV]; 'kda_bwd', g [B, T, HV, K]); g_optional: None is
    no decay (DeltaNet)."""
    shapes, offsets = _check_common(q, k, v, initial_state, cu_seqlens)
    if g is not None or not g_optional:
        check_input("g", g, gate_dims, shapes, float32_only=True)
    check_input("beta", beta, "B T HV", shapes, float32_only=True)
    _check_cotangents(do, dstate, v, shapes, offsets is not None)
    allow_neg_eigval = check_flag("allow_neg_eigval", allow_neg_eigval)
    normalize_qk = check_flag("normalize_qk", normalize_qk)
    q_rep, k_rep = grouped(*((l2_normalized(q), l2_normalized(k)) if normalize_qk else (q, k)), shapes)
    if check_values:
        check_all_finite(("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state),
                         ("do", do), ("dstate", dstate))
        if g is not None:
            check_log_gate("g", g)
        check_beta(beta, allow_neg_eigval)
        if not normalize_qk:  # normalized keys have |k|^2 < 1: beta's own range is the bound
            check_key_strength(k, beta, allow_neg_eigval, group=shapes["HV"] // shapes["H"])
    scale = check_scale(scale, shapes["K"])
    info = runnable_version(op, version, bf16.is_bf16(q.dtype), shapes["K"], shapes["V"])

    def one(q, k, v, g, beta, initial_state, do, dstate):
        return _launch(op, info, q, k, v, g, beta, initial_state, do, dstate, scale)

    dq, dk, dv, dg, dbeta, dh0 = varlen.backward(one, (q_rep, k_rep, v, g, beta), initial_state, do, dstate, offsets)
    group = shapes["HV"] // shapes["H"]
    dq, dk = _reduced(dq, group), _reduced(dk, group)
    if normalize_qk:
        dq, dk = (bf16.like(l2_normalize.backward(bf16.as_float32(x), bf16.as_float32(dx)), dx)
                  for x, dx in ((q, dq), (k, dk)))
    return dq, dk, dv, dg, dbeta, dh0


def _gradients(mixer: str):
    return catalog.module(mixer).SIGNATURE.gradients(mixer)


def linear_attention_backward(q, k, v, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None,
                              version=None, check_values=True):
    """Linear attention's gradients (identity feature map): LinearAttentionGradients(dq, dk, dv, dinitial_state)."""
    dq, dk, dv, _, dh0 = gated_linear_backward(q, k, v, None, do=do, dstate=dstate, scale=scale,
                                               initial_state=initial_state, cu_seqlens=cu_seqlens, version=version,
                                               check_values=check_values)
    return _gradients("linear_attention")(dq=dq, dk=dk, dv=dv, dinitial_state=dh0)


def simple_gla_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None, version=None,
                        check_values=True):
    """Simple GLA's gradients: SimpleGlaGradients(dq, dk, dv, dg, dinitial_state). g [B, T, HV], required."""
    dq, dk, dv, dg, dh0 = _linear_backward("linear_bwd", "B T HV", q, k, v, g, do, dstate, scale, initial_state,
                                           cu_seqlens, version, check_values)
    return _gradients("simple_gla")(dq=dq, dk=dk, dv=dv, dg=dg, dinitial_state=dh0)


def deltanet_backward(q, k, v, beta, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None,
                      allow_neg_eigval=False, normalize_qk=False, version=None, check_values=True):
    """DeltaNet's gradients: DeltanetGradients(dq, dk, dv, dbeta, dinitial_state)."""
    dq, dk, dv, _, dbeta, dh0 = delta_rule_backward(q, k, v, None, beta, do=do, dstate=dstate, scale=scale,
                                                    initial_state=initial_state, cu_seqlens=cu_seqlens,
                                                    allow_neg_eigval=allow_neg_eigval, normalize_qk=normalize_qk,
                                                    version=version, check_values=check_values)
    return _gradients("deltanet")(dq=dq, dk=dk, dv=dv, dbeta=dbeta, dinitial_state=dh0)


def gated_deltanet_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None,
                            allow_neg_eigval=False, normalize_qk=False, version=None, check_values=True):
    """Gated DeltaNet's gradients: GatedDeltanetGradients(dq, dk, dv, dg, dbeta, dinitial_state). g required."""
    dq, dk, dv, dg, dbeta, dh0 = _delta_rule_backward("delta_bwd", "B T HV", q, k, v, g, beta, do, dstate, scale,
                                                      initial_state, cu_seqlens, allow_neg_eigval, normalize_qk,
                                                      version, check_values)
    return _gradients("gated_deltanet")(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta, dinitial_state=dh0)


def kda_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None,
                 normalize_qk=False, version=None, check_values=True):
    """Kimi Delta Attention's gradients: KdaGradients(dq, dk, dv, dg, dbeta, dinitial_state). g and dg
    [B, T, HV, K] float32."""
    dq, dk, dv, dg, dbeta, dh0 = channel_delta_rule_backward(q, k, v, g, beta, do=do, dstate=dstate, scale=scale,
                                                             initial_state=initial_state, cu_seqlens=cu_seqlens,
                                                             normalize_qk=normalize_qk, version=version,
                                                             check_values=check_values)
    return _gradients("kda")(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta, dinitial_state=dh0)


def retnet_backward(q, k, v, *, do, dstate=None, gamma=None, scale=None, initial_state=None, version=None,
                    check_values=True):
    """RetNet's gradients: RetnetGradients(dq, dk, dv, dgamma, dinitial_state), dgamma float32. The forward runs the
    recurrence with g_t = log gamma_h at every token, so dgamma_h = sum_{b, t} dg_{b,t,h} / gamma_h (None when
    gamma was not given: the default decays are constants)."""
    per_head_shapes(q, v)
    g = retnet_log_gate(gamma, q.shape[:3], q.shape[2], check_values)
    dq, dk, dv, dg, dh0 = gated_linear_backward(q, k, v, g, do=do, dstate=dstate, scale=scale,
                                                initial_state=initial_state, version=version, check_values=check_values)
    dgamma = None if gamma is None else dg.sum(axis=(0, 1)) / gamma
    return _gradients("retnet")(dq=dq, dk=dk, dv=dv, dgamma=dgamma, dinitial_state=dh0)


def lightning_backward(q, k, v, *, do, dstate=None, slope=None, scale=None, initial_state=None, version=None,
                       check_values=True):
    """Lightning Attention's gradients: LightningGradients(dq, dk, dv, dslope, dinitial_state), dslope float32. The
    forward's g_t = -slope_h at every token, so dslope_h = -sum_{b, t} dg_{b,t,h} (None without slope)."""
    per_head_shapes(q, v)
    g = lightning_log_gate(slope, q.shape[:3], q.shape[2], check_values)
    dq, dk, dv, dg, dh0 = gated_linear_backward(q, k, v, g, do=do, dstate=dstate, scale=scale,
                                                initial_state=initial_state, version=version, check_values=check_values)
    dslope = None if slope is None else -dg.sum(axis=(0, 1))
    return _gradients("lightning")(dq=dq, dk=dk, dv=dv, dslope=dslope, dinitial_state=dh0)


def mamba2_backward(x, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None, version=None, check_values=True):
    """Mamba-2's gradients: Mamba2Gradients(dx, ddt, dA, dB, dC, dD, dinitial_state): dx, dB, dC in x's dtype, the
    rest float32. The forward is the
    scalar-gated recurrence under q = C, k = B, v = dt x, g = dt A, scale = 1, then y = o + D x; its chain rule:
        dC = dq,  dB = dk,  dx = dt dv (+ D dy),  ddt = sum_p dv_p x_p + A dg,  dA_h = sum_{b,t} dt dg,
        dD_h = sum_{b,t,p} dy x     (dD None without D).
    do is the cotangent of y [B, T, H, P], in x's dtype."""
    shapes = Shapes()
    mamba2_check(x, dt, A, B, C, D, shapes, "B T H")
    check_input("do", do, "B T H P", shapes, float32_only=False, like=x, like_name="x")  # in Mamba-2's names,
    for name, state in (("initial_state", initial_state), ("dstate", dstate)):        # before the mapping's
        if state is not None:
            check_input(name, state, "B H N P", shapes, float32_only=True)
    if check_values:
        mamba2_check_values(dt, A, ("x", x), ("B", B), ("C", C), ("D", D), ("initial_state", initial_state),
                            ("do", do), ("dstate", dstate))
    v, g, x32 = mamba2_mapping(x, dt, A)  # checked above in Mamba-2's names: g = dt A <= 0, v = dt x finite
    dC, dB, dv, dg, dh0 = gated_linear_backward(C, B, v, g, do=do, dstate=dstate, scale=1.0,
                                                initial_state=initial_state, version=version, check_values=False)
    dy, dv32 = bf16.as_float32(do), bf16.as_float32(dv)
    dx = dt[..., None] * dv32
    if D is not None:
        dx += D[:, None] * dy
    dx = bf16.like(dx, x)
    ddt = (dv32 * x32).sum(-1) + A * dg
    dA = (dt * dg).sum(axis=(0, 1))
    dD = None if D is None else (dy * x32).sum(axis=(0, 1, 3))
    return _gradients("mamba2")(dx=dx, ddt=ddt, dA=dA, dB=dB, dC=dC, dD=dD, dinitial_state=dh0)
