"""A chunked backward kernel's bf16 rounding points, emulated in float64 on the CPU: which may it round?

A tensor-core kernel reads its operands in bf16, so every matrix it stores for a product (a state, an adjoint, a
decayed copy of V) is rounded to 8 bits of mantissa, and a gradient built from sums of such products can lose far
more than that when its terms cancel. This script runs linear_bwd v2's algorithm (csrc/linear_bwd/v2_chunked_mma.cu)
in float64 with each rounding point switched on alone, then all at once, and prints each gradient's relative RMS
error against minilin's float64 `simple_gla.chunked_backward`, on bf16-rounded inputs as the GPU sees them:

    python tools/emulate_bf16_backward.py                 # T = 1000, K = V = 64, B = H = 2
    python tools/emulate_bf16_backward.py --T 63 --K 64 --V 128

The rounding points: S (the states entering the chunks, stored bf16), D (their adjoints), Y (the per-token
weighted V and dO that the two passes multiply), P (the decayed scores P and dP). dg is formed two ways: by the
chunk-local sum the kernel uses and by one reverse sum over the whole sequence (linear_bwd v1's form). What it
shows at the default problem: with every point rounded, dg's error is 2.2e-2 the sequence-wide way and 1.7e-3 the
chunk-local way (the rounded terms k_j . dk_j and <dstate, S_T> cancel only inside a chunk's sum), the other
gradients ~1.7e-3 either way; on the H200 the sequence-wide form missed FLA's 0.02 at 11 of the 16 simple GLA test
shapes with an initial state, the chunk-local one read 1.7e-3. A new kernel's rounding choices can be tried here
first (tests/test_emulate_bf16_backward.py holds the tool to the NumPy backward and to this finding).
"""
from __future__ import annotations

import argparse

import numpy as np

CHUNK = 64
POINTS = ("S", "D", "Y", "P")


def bf16(x):
    """x rounded to bfloat16 (to nearest, ties to even), as float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def emulate(q, k, v, g, S0, do, dS, scale, rounded=()):
    """linear_bwd v2 on float64 arrays (q, k [B, T, H, K]; v, do [B, T, H, V]; g [B, T, H]; S0, dS [B, H, K, V] or
    None), rounding to bf16 at the points named in `rounded`. Returns dq, dk, dv, dinitial_state, and dg twice:
    "dg" the chunk-local way, "dg_sequence" as one reverse sum over the sequence."""
    R = {p: (bf16 if p in rounded else (lambda x: x)) for p in POINTS}
    B, T, H, K = q.shape
    V, N = v.shape[-1], -(-T // CHUNK)
    pad = N * CHUNK - T

    def chunks(x):  # [B, T, H, ...] -> [B, N, C, H, ...], zero-padded
        x = np.concatenate([x, np.zeros((B, pad) + x.shape[2:])], 1) if pad else x
        return x.reshape((B, N, CHUNK) + x.shape[2:])

    qc, kc, vc, doc, gc = (chunks(x) for x in (q, k, v, do, g))
    G = np.cumsum(gc, 2)                                                   # chunk-local [B, N, C, H]
    G_last = G[:, :, -1]                                                   # [B, N, H]
    # Passes 1 and 2: the states entering each chunk and the adjoints leaving it, each stored rounded.
    S = np.zeros((B, H, K, V)) if S0 is None else S0.copy()
    states = []
    for n in range(N):
        states.append(R["S"](S))
        Y = R["Y"](np.exp(G_last[:, n][:, None] - G[:, n])[..., None] * vc[:, n])
        S = np.exp(G_last[:, n])[..., None, None] * S + np.einsum("bchk,bchv->bhkv", kc[:, n], Y)
    final = S
    D = np.zeros((B, H, K, V)) if dS is None else dS.copy()
    adjoints = [None] * N
    for n in reversed(range(N)):
        adjoints[n] = R["D"](D)
        Y = R["Y"]((scale * np.exp(G[:, n]))[..., None] * doc[:, n])
        D = np.exp(G_last[:, n])[..., None, None] * D + np.einsum("bchk,bchv->bhkv", qc[:, n], Y)
    # Pass 3: each chunk's gradients, and dg both ways.
    dq, dk, dv = np.zeros(qc.shape), np.zeros(kc.shape), np.zeros(vc.shape)
    dg = np.zeros(gc.shape)
    causal = np.tril(np.ones((CHUNK, CHUNK)))[None, :, :, None]
    for n in range(N):
        M = np.exp(G[:, n][:, :, None] - G[:, n][:, None, :]) * causal   # [B, i, j, H]
        P = R["P"](scale * np.einsum("bihk,bjhk->bijh", qc[:, n], kc[:, n]) * M)
        dP = R["P"](scale * np.einsum("bihv,bjhv->bijh", doc[:, n], vc[:, n]) * M)
        S_n, D_n = states[n], adjoints[n]
        to_end = np.exp(G_last[:, n][:, None] - G[:, n])[..., None]       # [B, C, H, 1]
        dk_inter = to_end * np.einsum("bjhv,bhkv->bjhk", vc[:, n], D_n)
        dq[:, n] = (scale * np.exp(G[:, n])[..., None] * np.einsum("bihv,bhkv->bihk", doc[:, n], S_n)
                    + np.einsum("bijh,bjhk->bihk", dP, kc[:, n]))
        dk[:, n] = dk_inter + np.einsum("bijh,bihk->bjhk", dP, qc[:, n])
        dv[:, n] = (to_end * np.einsum("bjhk,bhkv->bjhv", kc[:, n], D_n)
                    + np.einsum("bijh,bihv->bjhv", P, doc[:, n]))
        term = (qc[:, n] * dq[:, n]).sum(-1) - (kc[:, n] * dk[:, n]).sum(-1)          # [B, C, H]
        last = np.exp(G_last[:, n]) * (D_n * S_n).sum((-2, -1)) + (kc[:, n] * dk_inter).sum((1, 3))
        dg[:, n] = np.cumsum(term[:, ::-1], 1)[:, ::-1] + last[:, None]

    def tokens(x):
        return x.reshape((B, N * CHUNK) + x.shape[3:])[:, :T]

    dq, dk, dv, dg = (tokens(x) for x in (dq, dk, dv, dg))
    term = (q * dq).sum(-1) - (k * dk).sum(-1)
    if dS is not None:
        term[:, -1] += (dS * final).sum((-2, -1))
    dg_sequence = np.cumsum(term[:, ::-1], 1)[:, ::-1]
    return {"dq": dq, "dk": dk, "dv": dv, "dinitial_state": D, "dg": dg, "dg_sequence": dg_sequence}


def inputs(B, T, H, K, V, seed):
    """Inputs as tests/test_cuda_backward.py makes them (keys of norm 0.9, gates in [-1, -0.05], an initial state,
    do and dstate), q, k, v, do rounded to bf16 as the GPU reads them."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, H, K))
    k *= 0.9 / np.linalg.norm(k, axis=-1, keepdims=True)
    return dict(q=bf16(rng.standard_normal((B, T, H, K))), k=bf16(k), v=bf16(rng.standard_normal((B, T, H, V))),
                g=rng.uniform(-1.0, -0.05, (B, T, H)).astype(np.float32).astype(np.float64),
                S0=(0.5 * rng.standard_normal((B, H, K, V))).astype(np.float32).astype(np.float64),
                do=bf16(rng.standard_normal((B, T, H, V))), dS=rng.standard_normal((B, H, K, V)))


def errors(x, rounded):
    """Each gradient's relative RMS error against simple_gla.chunked_backward in float64 (dg_sequence against dg)."""
    from minilin.mixers import simple_gla

    scale = x["q"].shape[-1] ** -0.5
    ref = simple_gla.chunked_backward(x["q"], x["k"], x["v"], x["g"], do=x["do"], dstate=x["dS"], scale=scale,
                                      initial_state=x["S0"])._asdict()
    got = emulate(x["q"], x["k"], x["v"], x["g"], x["S0"], x["do"], x["dS"], scale, rounded)
    return {name: float(np.linalg.norm(value - ref[name.replace("_sequence", "")])
                        / np.linalg.norm(ref[name.replace("_sequence", "")])) for name, value in got.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("B", 2), ("T", 1000), ("H", 2), ("K", 64), ("V", 64), ("seed", 0)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args(argv)
    x = inputs(args.B, args.T, args.H, args.K, args.V, args.seed)
    cases = [("none", ())] + [(p, (p,)) for p in POINTS] + [("all", POINTS)]
    names = ("dq", "dk", "dv", "dinitial_state", "dg", "dg_sequence")
    print(f"B={args.B} T={args.T} H={args.H} K={args.K} V={args.V}: relative RMS error against float64, per "
          f"rounding point")
    print("| rounded | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for label, rounded in cases:
        e = errors(x, rounded)
        print(f"| {label} | " + " | ".join(f"{e[n]:.1e}" for n in names) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
