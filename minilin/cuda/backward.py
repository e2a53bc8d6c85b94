"""The backward passes on the GPU: the gradients of L = <do, o> + <dstate, final state> (CONVENTIONS.md, Gradients).

    gated_linear_backward(q, k, v, g=None, *, do, dstate=None, ...)  -> (dq, dk, dv, dg, dinitial_state)
    delta_rule_backward(q, k, v, g, beta, *, do, dstate=None, ...)   -> (dq, dk, dv, dg, dbeta, dinitial_state)
    simple_gla_backward, linear_attention_backward, gated_deltanet_backward, deltanet_backward: the mixers' named
    tuples (SIGNATURE.gradients), one field d<name> per array the forward takes.

The forward's arguments come first, as the forward takes them, then do and dstate by keyword (dstate None: zeros).
Shapes: q, k [B, T, H, K]; v and do [B, T, H, V] (do in v's dtype: float32 or bfloat16); g, beta [B, T, H] float32;
initial_state and dstate [B, H, K, V] float32. Every gradient comes back float32 (CuPy), whatever the inputs' dtype:
dq, dk [B, T, H, K]; dv [B, T, H, V]; dg, dbeta [B, T, H]; dinitial_state [B, H, K, V], or None for an array that was
not given (g, initial_state).

Kernels (csrc/linear_bwd/, csrc/delta_bwd/, `versions('linear_bwd')`, `versions('delta_bwd')`): v1 is the definition
run backwards (the state's adjoint in registers, token by token). For the gated linear family the gate's gradient
is formed here, from the kernel's dq and dk and the final state it writes:
    dg_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <dstate, S_T>
a reverse cumulative sum of per-token terms (csrc/linear_bwd/v1_recurrent.cu derives it), summed in float64.
"""
from __future__ import annotations

from .. import catalog
from ..validation import Shapes, check_beta, check_flag, check_log_gate, check_scale
from . import bf16
from .front import (_check_common, check_finite, check_input, check_key_strength, cupy_module, extension,
                    runnable_version)


def _check_cotangents(do, dstate, v, shapes: Shapes, check_values: bool):
    """do [B, T, H, V] in v's dtype, dstate [B, H, K, V] float32 or None; finite when check_values."""
    check_input("do", do, "B T H V", shapes, float32_only=False, like=v, like_name="v")
    if dstate is not None:
        check_input("dstate", dstate, "B H K V", shapes, float32_only=True)
    if check_values:
        check_finite("do", bf16.as_float32(do))
        if dstate is not None:
            check_finite("dstate", dstate)


def _launch(op: str, q, k, v, g, beta, initial_state, do, dstate, scale, version, shapes: Shapes):
    """Run backward `version` of `op` ('linear_bwd' or 'delta_bwd'); returns float32 (dq, dk, dv, dg, dbeta, dh0, ht),
    None for what the op does not make here (the linear family's dg, which the caller forms from dq and dk)."""
    cupy = cupy_module()
    cuda = extension()
    is_bf16 = bf16.is_bf16(q.dtype)
    info = runnable_version(op, version, is_bf16)
    B, T, H, K, V = (shapes[d] for d in "BTHKV")
    delta = op == "delta_bwd"
    dq, dk = cupy.empty((B, T, H, K), cupy.float32), cupy.empty((B, T, H, K), cupy.float32)
    dv = cupy.empty((B, T, H, V), cupy.float32)
    dg = cupy.empty((B, T, H), cupy.float32) if delta and g is not None else None
    dbeta = cupy.empty((B, T, H), cupy.float32) if delta else None
    dh0 = cupy.empty((B, H, K, V), cupy.float32) if initial_state is not None else None
    ht = cupy.empty((B, H, K, V), cupy.float32) if not delta and g is not None and dstate is not None else None
    workspace_size = cuda.workspace_bytes(op, info["version"], B, T, H, K, V)
    workspace = cupy.cuda.alloc(workspace_size) if workspace_size else None

    def address(x):
        return 0 if x is None else x.data.ptr

    cuda.backward(op, info["version"], address(q), address(k), address(v), address(g), address(beta),
                  address(initial_state), address(do), address(dstate), address(dq), address(dk), address(dv),
                  address(dg), address(dbeta), address(dh0), address(ht),
                  workspace.ptr if workspace is not None else 0, workspace_size, B, T, H, K, V, float(scale),
                  1 if is_bf16 else 0, cupy.cuda.get_current_stream().ptr)
    return dq, dk, dv, dg, dbeta, dh0, ht


def linear_gate_gradient(q, k, dq, dk, dstate, final_state):
    """dg [B, T, H] float32 of the scalar-gated linear recurrence from its other gradients:
    dg_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <dstate, S_T> (dstate None: no last term). q, k in their dtype
    [B, T, H, K]; dq, dk float32; dstate, final_state [B, H, K, V] float32 or None. Summed in float64."""
    cupy = cupy_module()
    term = ((bf16.as_float32(q) * dq).sum(-1) - (bf16.as_float32(k) * dk).sum(-1)).astype(cupy.float64)  # [B, T, H]
    if dstate is not None:
        term[:, -1] += (dstate.astype(cupy.float64) * final_state).sum((-2, -1))
    return cupy.ascontiguousarray(cupy.cumsum(term[:, ::-1], axis=1)[:, ::-1], dtype=cupy.float32)


def gated_linear_backward(q, k, v, g=None, *, do, dstate=None, scale=None, initial_state=None, version=None,
                          check_values=True):
    """Gradients of the scalar-gated linear recurrence (front.gated_linear): (dq, dk, dv, dg, dinitial_state), all
    float32, dg None without g and dinitial_state None without initial_state.

    check_values: g <= 0, do and dstate finite (device-to-host syncs); False skips them."""
    shapes = _check_common(q, k, v, initial_state)
    if g is not None:
        check_input("g", g, "B T H", shapes, float32_only=True)
    _check_cotangents(do, dstate, v, shapes, check_values)
    if check_values and g is not None:
        check_finite("g", g)
        check_log_gate("g", g)
    scale = check_scale(scale, shapes["K"])
    dq, dk, dv, _, _, dh0, ht = _launch("linear_bwd", q, k, v, g, None, initial_state, do, dstate, scale, version,
                                        shapes)
    dg = None if g is None else linear_gate_gradient(q, k, dq, dk, dstate, ht)
    return dq, dk, dv, dg, dh0


def delta_rule_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None, allow_neg_eigval=False,
                        version=None, check_values=True):
    """Gradients of the (gated) delta rule (front.delta_rule): (dq, dk, dv, dg, dbeta, dinitial_state), all float32,
    dg None without g (DeltaNet) and dinitial_state None without initial_state.

    check_values: g <= 0, beta's range, beta |k|^2 within its bound, do and dstate finite (device-to-host syncs)."""
    shapes = _check_common(q, k, v, initial_state)
    if g is not None:
        check_input("g", g, "B T H", shapes, float32_only=True)
    check_input("beta", beta, "B T H", shapes, float32_only=True)
    _check_cotangents(do, dstate, v, shapes, check_values)
    allow_neg_eigval = check_flag("allow_neg_eigval", allow_neg_eigval)
    if check_values:
        if g is not None:
            check_finite("g", g)
            check_log_gate("g", g)
        check_finite("beta", beta)
        check_beta(beta, allow_neg_eigval)
        check_key_strength(k, beta, allow_neg_eigval)
    scale = check_scale(scale, shapes["K"])
    dq, dk, dv, dg, dbeta, dh0, _ = _launch("delta_bwd", q, k, v, g, beta, initial_state, do, dstate, scale, version,
                                            shapes)
    return dq, dk, dv, dg, dbeta, dh0


def _gradients(mixer: str):
    return catalog.module(mixer).SIGNATURE.gradients(mixer)


def linear_attention_backward(q, k, v, *, do, dstate=None, scale=None, initial_state=None, version=None,
                              check_values=True):
    """Linear attention's gradients (identity feature map): LinearAttentionGradients(dq, dk, dv, dinitial_state)."""
    dq, dk, dv, _, dh0 = gated_linear_backward(q, k, v, None, do=do, dstate=dstate, scale=scale,
                                               initial_state=initial_state, version=version, check_values=check_values)
    return _gradients("linear_attention")(dq=dq, dk=dk, dv=dv, dinitial_state=dh0)


def simple_gla_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, version=None,
                        check_values=True):
    """Simple GLA's gradients: SimpleGlaGradients(dq, dk, dv, dg, dinitial_state), float32. g [B, T, H]."""
    dq, dk, dv, dg, dh0 = gated_linear_backward(q, k, v, g, do=do, dstate=dstate, scale=scale,
                                                initial_state=initial_state, version=version, check_values=check_values)
    return _gradients("simple_gla")(dq=dq, dk=dk, dv=dv, dg=dg, dinitial_state=dh0)


def deltanet_backward(q, k, v, beta, *, do, dstate=None, scale=None, initial_state=None, allow_neg_eigval=False,
                      version=None, check_values=True):
    """DeltaNet's gradients: DeltanetGradients(dq, dk, dv, dbeta, dinitial_state), float32."""
    dq, dk, dv, _, dbeta, dh0 = delta_rule_backward(q, k, v, None, beta, do=do, dstate=dstate, scale=scale,
                                                    initial_state=initial_state, allow_neg_eigval=allow_neg_eigval,
                                                    version=version, check_values=check_values)
    return _gradients("deltanet")(dq=dq, dk=dk, dv=dv, dbeta=dbeta, dinitial_state=dh0)


def gated_deltanet_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None,
                            allow_neg_eigval=False, version=None, check_values=True):
    """Gated DeltaNet's gradients: GatedDeltanetGradients(dq, dk, dv, dg, dbeta, dinitial_state), float32."""
    dq, dk, dv, dg, dbeta, dh0 = delta_rule_backward(q, k, v, g, beta, do=do, dstate=dstate, scale=scale,
                                                     initial_state=initial_state, allow_neg_eigval=allow_neg_eigval,
                                                     version=version, check_values=check_values)
    return _gradients("gated_deltanet")(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta, dinitial_state=dh0)
