"""minilin.torch: FLA-signature autograd functions over minilin's mixers.

On the CPU (the NumPy path): outputs and gradients against a plain PyTorch recurrence differentiated by torch's
autograd in float64 (an independent reference), torch.autograd.gradcheck (central finite differences), the
argument handling FLA's callers rely on, and clear errors. On a GPU (minilin.cuda): a tiny model's loss and
gradients with minilin's kernels against the same model on the CPU path in float64. Skipped without PyTorch.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="minilin.torch needs PyTorch (optional; never a dependency)")

from minilin import torch as mt  # noqa: E402


def naive(q, k, v, g=None, beta=None, *, scale=None, initial_state=None, normalize_qk=False):
    """The recurrence token by token in torch ops (autograd differentiates it): decay, then the delta rule's
    correction when beta is given, then the read o_t = scale S_t^T q_t."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if normalize_qk:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    S = torch.zeros(B, H, K, V, dtype=q.dtype) if initial_state is None else initial_state.to(q.dtype)
    out = []
    for t in range(T):
        if g is not None:  # [B, T, H] one decay per head, or [B, T, H, K] one per key channel (GLA)
            S = S * (torch.exp(g[:, t])[..., None] if g.ndim == 4 else torch.exp(g[:, t])[..., None, None])
        u = v[:, t]
        if beta is not None:
            u = beta[:, t][..., None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], u)
        out.append(scale * torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(out, 1), S


def inputs(B=2, T=37, H=3, K=8, V=5, *, seed=0, delta=False, dtype=torch.float64, state=True):
    rng = np.random.default_rng(seed)
    as_t = lambda x: torch.tensor(x, dtype=dtype, requires_grad=True)  # noqa: E731
    k = rng.standard_normal((B, T, H, K))
    if delta:  # unit keys, so that beta |k|^2 <= 1
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return dict(q=as_t(rng.standard_normal((B, T, H, K))), k=as_t(k), v=as_t(rng.standard_normal((B, T, H, V))),
                g=as_t(rng.uniform(-1.5, -0.01, (B, T, H))), beta=as_t(rng.uniform(0.05, 1.0, (B, T, H))),
                initial_state=as_t(rng.standard_normal((B, H, K, V))) if state else None,
                g_channels=as_t(rng.uniform(-1.5, -0.01, (B, T, H, K))))


def loss_of(o, S, seed=1):
    """<W_o, o> + <W_S, S> with fixed random weights: every gradient entry matters."""
    rng = np.random.default_rng(seed)
    Wo = torch.tensor(rng.standard_normal(tuple(o.shape)), dtype=o.dtype)
    WS = torch.tensor(rng.standard_normal(tuple(S.shape)), dtype=S.dtype)
    return (Wo * o).sum() + (WS * S.to(o.dtype)).sum()


CASES = {
    "simple_gla": (lambda a, **kw: mt.chunk_simple_gla(a["q"], a["k"], a["v"], a["g"], **kw),
                   lambda a, **kw: naive(a["q"], a["k"], a["v"], a["g"], **kw), ("q", "k", "v", "g"), False),
    "gla": (lambda a, **kw: mt.chunk_gla(a["q"], a["k"], a["v"], a["g_channels"], **kw),
            lambda a, **kw: naive(a["q"], a["k"], a["v"], a["g_channels"], **kw), ("q", "k", "v", "g_channels"),
            False),
    "linear_attention": (lambda a, **kw: mt.chunk_simple_gla(a["q"], a["k"], a["v"], **kw),
                         lambda a, **kw: naive(a["q"], a["k"], a["v"], **kw), ("q", "k", "v"), False),
    "deltanet": (lambda a, **kw: mt.chunk_delta_rule(a["q"], a["k"], a["v"], a["beta"], **kw),
                 lambda a, **kw: naive(a["q"], a["k"], a["v"], None, a["beta"], **kw), ("q", "k", "v", "beta"),
                 True),
    "gated_deltanet": (lambda a, **kw: mt.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"], **kw),
                       lambda a, **kw: naive(a["q"], a["k"], a["v"], a["g"], a["beta"], **kw),
                       ("q", "k", "v", "g", "beta"), True),
    "kda": (lambda a, **kw: mt.chunk_kda(a["q"], a["k"], a["v"], a["g_channels"], a["beta"], **kw),
            lambda a, **kw: naive(a["q"], a["k"], a["v"], a["g_channels"], a["beta"], **kw),
            ("q", "k", "v", "g_channels", "beta"), True),
}


@pytest.mark.parametrize("state", [True, False])
@pytest.mark.parametrize("mixer", CASES)
def test_cpu_outputs_and_gradients_equal_torch_autograd_of_the_recurrence(mixer, state):
    call, reference, names, delta = CASES[mixer]
    a = inputs(delta=delta, state=state, seed=3)
    wrt = [a[n] for n in names] + ([a["initial_state"]] if state else [])
    o, S = call(a, scale=0.7, initial_state=a["initial_state"], output_final_state=True)
    o_ref, S_ref = reference(a, scale=0.7, initial_state=a["initial_state"])
    assert o.dtype == torch.float64 and S.dtype == torch.float32
    assert torch.allclose(o, o_ref, rtol=0, atol=1e-10 * o_ref.abs().max().item())
    assert torch.allclose(S.double(), S_ref, rtol=0, atol=1e-6 * S_ref.abs().max().item())  # S is float32
    grads = torch.autograd.grad(loss_of(o, S), wrt)
    grads_ref = torch.autograd.grad(loss_of(o_ref, S_ref.float()), wrt)
    for name, d, d_ref in zip([*names, "initial_state"], grads, grads_ref):
        assert d.dtype == torch.float64, name
        # the state's cotangent reaches the mixer in float32 (its final state is float32, as FLA's)
        err = (d - d_ref).abs().max().item() / d_ref.abs().max().item()
        assert err < 1e-6, f"d{name}: relative error {err:.2e}"


@pytest.mark.parametrize("mixer", CASES)
def test_cpu_gradcheck(mixer):
    call, _, names, delta = CASES[mixer]
    a = inputs(B=1, T=9, H=2, K=4, V=3, delta=delta, seed=5)
    args = [a[n] for n in names] + [a["initial_state"]]

    def f(*xs):
        b = dict(zip([*names, "initial_state"], xs))
        return call(b, initial_state=b["initial_state"])[0]  # o alone: the state's float32 would spoil the FD

    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_cpu_options_match_their_definitions():
    a = inputs(delta=True, seed=7)
    rng = np.random.default_rng(8)
    big_q = (3 * a["q"]).detach().requires_grad_(True)
    big_k = (3 * a["k"]).detach().requires_grad_(True)  # |k| = 3: only valid once normalized
    o, S = mt.chunk_gated_delta_rule(big_q, big_k, a["v"], a["g"], a["beta"], use_qk_l2norm_in_kernel=True,
                                     output_final_state=True)
    o_ref, S_ref = naive(big_q, big_k, a["v"], a["g"], a["beta"], normalize_qk=True)
    assert torch.allclose(o, o_ref, atol=1e-10) and torch.allclose(S.double(), S_ref, atol=1e-5)
    d, d_ref = (torch.autograd.grad(x.sum(), big_k)[0] for x in (o, o_ref))
    assert torch.allclose(d, d_ref, atol=1e-9)
    # g_gamma: one log decay per head, broadcast over batch and time
    g_gamma = torch.tensor(rng.uniform(-1, -0.1, 3), requires_grad=True)
    o, _ = mt.chunk_simple_gla(a["q"], a["k"], a["v"], g_gamma=g_gamma)
    o_ref, _ = naive(a["q"], a["k"], a["v"], g_gamma.expand(2, 37, 3))
    assert torch.allclose(o, o_ref, atol=1e-10)
    d, d_ref = (torch.autograd.grad(x.sum(), g_gamma)[0] for x in (o, o_ref))
    assert torch.allclose(d, d_ref, atol=1e-8)
    # no final state unless asked for; a loss of the final state alone
    assert mt.chunk_delta_rule(a["q"], a["k"], a["v"], a["beta"])[1] is None
    _, S = mt.chunk_delta_rule(a["q"], a["k"], a["v"], a["beta"], output_final_state=True)
    _, S_ref = naive(a["q"], a["k"], a["v"], None, a["beta"])
    d, d_ref = (torch.autograd.grad(x.double().pow(2).sum(), a["v"])[0] for x in (S, S_ref))
    assert torch.allclose(d, d_ref, atol=1e-4 * d_ref.abs().max().item())


def test_cpu_a_float64_input_among_float32_ones_computes_in_float64():
    """NumPy's promotion, as the mixers compute: float32 q, k, v with a float64 initial state run in float64 (the
    output in q's dtype), equal to the all-float64 call to float32's rounding of q, k, v only."""
    a = inputs(delta=True)
    low = {n: a[n].detach().float() for n in ("q", "k", "v", "g", "beta")}
    o, S = mt.chunk_gated_delta_rule(*(low[n] for n in ("q", "k", "v", "g", "beta")),
                                     initial_state=a["initial_state"].detach(), output_final_state=True)
    o64, S64 = mt.chunk_gated_delta_rule(*(low[n].double() for n in ("q", "k", "v", "g", "beta")),
                                         initial_state=a["initial_state"].detach(), output_final_state=True)
    assert o.dtype == torch.float32
    assert torch.equal(o, o64.float()) and torch.equal(S, S64)  # the state comes back float32 from both


def test_cpu_float32_inputs_give_float32_gradients():
    a = inputs(dtype=torch.float32, delta=True)
    o, _ = mt.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=a["initial_state"])
    grads = torch.autograd.grad(o.sum(), [a["q"], a["g"], a["initial_state"]])
    assert o.dtype == torch.float32 and all(d.dtype == torch.float32 for d in grads)


@pytest.mark.parametrize("mixer", ["simple_gla", "gla", "gated_deltanet", "kda"])
def test_cpu_grouped_heads_and_packed_sequences_equal_each_sequence_alone(mixer):
    """HV = 2 H value heads and two packed sequences: outputs, final states and every gradient equal the naive
    recurrence run on each sequence alone with q and k repeated per value head (torch's autograd through it)."""
    delta = mixer in ("gated_deltanet", "kda")
    a = inputs(B=1, T=23, H=4, K=8, V=5, seed=4, delta=delta, state=False)
    q, k = (a[n].detach()[:, :, ::2].clone().requires_grad_(True) for n in ("q", "k"))  # H = 2 for HV = 4
    h0 = torch.tensor(np.random.default_rng(5).standard_normal((2, 4, 8, 5)), requires_grad=True)
    cu = torch.tensor([0, 9, 23])
    beta = a["beta"] if delta else None
    if mixer in ("gla", "kda"):  # a decay per key channel, through the same comparison
        a["g"] = a["g_channels"]
    if mixer == "kda":
        o, S = mt.chunk_kda(q, k, a["v"], a["g"], beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    elif delta:
        o, S = mt.chunk_gated_delta_rule(q, k, a["v"], a["g"], beta, initial_state=h0, output_final_state=True,
                                         cu_seqlens=cu)
    elif mixer == "gla":
        o, S = mt.chunk_gla(q, k, a["v"], a["g"], initial_state=h0, output_final_state=True, cu_seqlens=cu)
    else:
        o, S = mt.chunk_simple_gla(q, k, a["v"], a["g"], initial_state=h0, output_final_state=True, cu_seqlens=cu)
    parts = [naive(q.repeat_interleave(2, 2)[:, s:e], k.repeat_interleave(2, 2)[:, s:e], a["v"][:, s:e],
                   a["g"][:, s:e], None if beta is None else beta[:, s:e], initial_state=h0[n:n + 1])
             for n, (s, e) in enumerate([(0, 9), (9, 23)])]
    o_ref, S_ref = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 0)
    assert o.shape == (1, 23, 4, 5) and S.shape == (2, 4, 8, 5)
    assert torch.allclose(o, o_ref, atol=1e-10) and torch.allclose(S.double(), S_ref, atol=1e-6)
    leaves = [q, k, a["v"], a["g"], h0] + ([beta] if delta else [])
    grads = torch.autograd.grad(loss_of(o, S.double()), leaves)
    grads_ref = torch.autograd.grad(loss_of(o_ref, S_ref), leaves)
    for name, d, d_ref in zip(["q", "k", "v", "g", "initial_state", "beta"], grads, grads_ref):
        assert torch.allclose(d.double(), d_ref, atol=1e-5 * d_ref.abs().max().item()), name


def test_flas_cu_seqlens_helpers_need_cu_seqlens_and_must_agree_with_it():
    a = inputs(B=1, delta=True, state=False)
    call = lambda **kw: mt.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"], **kw)  # noqa: E731
    with pytest.raises(ValueError, match="cu_seqlens_cpu: given without cu_seqlens"):
        call(cu_seqlens_cpu=torch.tensor([0, 10, 37]))
    with pytest.raises(ValueError, match="chunk_indices: given without cu_seqlens"):
        call(chunk_indices=torch.tensor([[0, 0]]))
    with pytest.raises(ValueError, match=r"cu_seqlens_cpu: expected the same offsets as cu_seqlens \[0, 10, 37\]"):
        call(cu_seqlens=torch.tensor([0, 10, 37]), cu_seqlens_cpu=torch.tensor([0, 12, 37]))
    o, _ = call(cu_seqlens=torch.tensor([0, 10, 37]), cu_seqlens_cpu=torch.tensor([0, 10, 37]))
    o_alone, _ = call(cu_seqlens=torch.tensor([0, 10, 37]))
    assert torch.equal(o, o_alone)


def test_bad_input_is_named():
    a = inputs(delta=True)
    with pytest.raises(ValueError, match="cu_seqlens"):
        mt.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"], cu_seqlens=torch.tensor([0, 37]))
    with pytest.raises(ValueError, match="g, g_gamma"):
        mt.chunk_simple_gla(a["q"], a["k"], a["v"], a["g"], g_gamma=torch.zeros(3))
    with pytest.raises(ValueError, match="g_gamma"):
        mt.chunk_simple_gla(a["q"], a["k"], a["v"], g_gamma=torch.zeros(4))
    with pytest.raises(TypeError, match="beta"):
        mt.chunk_delta_rule(a["q"], a["k"], a["v"], a["beta"].detach().numpy())
    with pytest.raises(ValueError, match="beta"):  # minilin's own checks reach the caller
        mt.chunk_delta_rule(a["q"], a["k"], a["v"], 2 + a["beta"])
    with pytest.raises(ValueError, match="g"):
        mt.chunk_simple_gla(a["q"], a["k"], a["v"], -a["g"])
    with pytest.raises(ValueError, match="^g: "):  # a per-head gate where GLA takes one per key channel
        mt.chunk_gla(a["q"], a["k"], a["v"], a["g"])
    with pytest.raises(ValueError, match="state_v_first"):
        mt.chunk_gla(a["q"], a["k"], a["v"], a["g_channels"], state_v_first=True)
    with pytest.raises(ValueError, match=r"^use_gate_in_kernel: not supported by minilin.torch \(expected False"):
        mt.chunk_kda(a["q"], a["k"], a["v"], a["g_channels"], a["beta"], use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"^lower_bound: not supported by minilin.torch \(expected None"):
        mt.chunk_kda(a["q"], a["k"], a["v"], a["g_channels"], a["beta"], lower_bound=-5.0)
    with pytest.raises(ValueError, match="^g: "):  # KDA takes a decay per key channel
        mt.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"])
    for call, name in [(lambda: mt.chunk_gla(a["q"], a["k"], a["v"], None), "g"),
                       (lambda: mt.chunk_gated_delta_rule(a["q"], a["k"], a["v"], None, a["beta"]), "g"),
                       (lambda: mt.chunk_delta_rule(a["q"], a["k"], a["v"], None), "beta"),
                       (lambda: mt.chunk_kda(a["q"], a["k"], a["v"], a["g_channels"], None), "beta")]:
        with pytest.raises(TypeError, match=rf"^{name}: expected a torch.Tensor, got None"):
            call()
    with pytest.raises(TypeError, match=r"^allow_neg_eigval: expected True or False"):
        mt.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["g"], a["beta"], allow_neg_eigval="False")
    with pytest.raises(TypeError, match=r"^use_qk_l2norm_in_kernel: expected True or False"):
        mt.chunk_delta_rule(a["q"], a["k"], a["v"], a["beta"], use_qk_l2norm_in_kernel="no")
    with pytest.raises(TypeError, match=r"^g_gamma: expected a torch.Tensor \[HV\], got float"):
        mt.chunk_simple_gla(a["q"], a["k"], a["v"], g_gamma=-0.1)
    with pytest.raises(ValueError, match=r"^g_gamma: expected log-space decays <= 0"):
        mt.chunk_simple_gla(a["q"], a["k"], a["v"], g_gamma=torch.full((3,), 0.5))


def _cuda_ready():
    if not torch.cuda.is_available():
        return "no CUDA device for torch"
    from minilin import cuda

    ok, why = cuda.available()
    return None if ok else f"minilin.cuda cannot run: {why}"


def _tiny_model(seed, device, dtype, mixer):
    """Embedding -> q, k, v, gate, beta projections -> the mixer -> output projection: a tiny model whose loss
    reaches every input of the mixer."""
    gen = torch.Generator().manual_seed(seed)
    D, H, K = 32, 2, 16
    shapes = [("emb", (50, D), 1.0), ("wq", (D, H * K), D ** -0.5), ("wk", (D, H * K), D ** -0.5),
              ("wv", (D, H * K), D ** -0.5), ("wg", (D, H), D ** -0.5), ("wo", (H * K, D), (H * K) ** -0.5)]
    if mixer in ("gated_deltanet", "kda"):
        shapes.append(("wb", (D, H), D ** -0.5))
    if mixer in ("gla", "kda"):  # one gate per key channel
        shapes[4] = ("wg", (D, H * K), D ** -0.5)
    params = {n: torch.randn(*shape, generator=gen, dtype=torch.float64) * s for n, shape, s in shapes}
    params = {n: p.to(device=device, dtype=dtype).requires_grad_(True) for n, p in params.items()}
    tokens = torch.randint(0, 50, (2, 100), generator=gen).to(device)
    targets = torch.randn(2, 100, D, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)

    def loss():
        x = params["emb"][tokens]
        B, T, _ = x.shape
        q, k, v = ((x @ params[w]).view(B, T, H, K) for w in ("wq", "wk", "wv"))
        g = torch.nn.functional.logsigmoid(x @ params["wg"])
        if mixer == "gated_deltanet":
            beta = torch.sigmoid(x @ params["wb"])
            o, _ = mt.chunk_gated_delta_rule(q, k, v, g.float(), beta.float(), use_qk_l2norm_in_kernel=True)
        elif mixer == "kda":
            beta = torch.sigmoid(x @ params["wb"])
            o, _ = mt.chunk_kda(q, k, v, g.view(B, T, H, K).float(), beta.float(), use_qk_l2norm_in_kernel=True)
        elif mixer == "gla":
            o, _ = mt.chunk_gla(q, k, v, g.view(B, T, H, K).float())
        else:
            o, _ = mt.chunk_simple_gla(q, k, v, g.float())
        y = o.reshape(B, T, H * K).to(dtype) @ params["wo"]
        return ((y - targets) ** 2).mean()

    return params, loss


@pytest.mark.parametrize("mixer", ["simple_gla", "gla", "gated_deltanet", "kda"])
def test_gpu_tiny_model_loss_and_gradients_equal_the_float64_reference(mixer):
    reason = _cuda_ready()
    if reason:
        pytest.skip(reason)
    params_ref, loss_ref = _tiny_model(0, "cpu", torch.float64, mixer)
    value_ref = loss_ref()
    grads_ref = torch.autograd.grad(value_ref, list(params_ref.values()))
    params, loss = _tiny_model(0, "cuda", torch.float32, mixer)
    value = loss()
    grads = torch.autograd.grad(value, list(params.values()))
    assert abs(value.item() - value_ref.item()) < 1e-4 * abs(value_ref.item())
    for name, d, d_ref in zip(params, grads, grads_ref):
        err = ((d.double().cpu() - d_ref).norm() / d_ref.norm()).item()
        assert err < 1e-4, f"d{name}: relative RMS error {err:.2e} (float32 kernels against float64)"


def test_gpu_bf16_inputs_run_on_torch_stream():
    reason = _cuda_ready()
    if reason:
        pytest.skip(reason)
    a = inputs(B=2, T=200, H=4, K=64, V=64, delta=True, dtype=torch.float64, seed=11)
    ref = {n: x.detach() for n, x in a.items()}
    bf = {n: x.detach().to("cuda", torch.bfloat16 if n in "qkv" else torch.float32).requires_grad_(True)
          for n, x in a.items()}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        o, S = mt.chunk_gated_delta_rule(bf["q"], bf["k"], bf["v"], bf["g"], bf["beta"],
                                         initial_state=bf["initial_state"], output_final_state=True)
        dq, dg = torch.autograd.grad(o.float().sum() + S.sum(), [bf["q"], bf["g"]])
    torch.cuda.synchronize()
    assert o.dtype == torch.bfloat16 and dq.dtype == torch.bfloat16 and dg.dtype == torch.float32
    r = {n: x.to(torch.bfloat16).double() if n in "qkv" else x.float().double() for n, x in ref.items()}
    r = {n: x.requires_grad_(True) for n, x in r.items()}
    o_ref, S_ref = naive(r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["initial_state"])
    dq_ref, dg_ref = torch.autograd.grad(o_ref.sum() + S_ref.sum(), [r["q"], r["g"]])
    rms = lambda x, y: ((x.double().cpu() - y).norm() / y.norm()).item()  # noqa: E731
    assert rms(o, o_ref) < 8e-3 and rms(S, S_ref) < 8e-3
    assert rms(dq, dq_ref) < 8e-3 and rms(dg, dg_ref) < 2e-2
