"""A chunked backward kernel's bf16 rounding points, emulated in float64 on the CPU: which may it round?

A tensor-core kernel reads its operands in bf16, so every matrix it stores for a product (a state, an adjoint, a
decayed copy of V) is rounded to 8 bits of mantissa, and a gradient built from sums of such products can lose far
more than that when its terms cancel. This script runs a kernel's algorithm in float64 with each rounding point
switched on alone, then all at once, and prints each gradient's relative RMS error against minilin's float64
chunked_backward, on bf16-rounded inputs as the GPU sees them: linear_bwd v2's (csrc/linear_bwd/v2_chunked_mma.cu,
`emulate`, against simple GLA) and delta_bwd v2's (csrc/delta_bwd/v2_chunked_wy_mma.cu, `emulate_delta`, against
Gated DeltaNet), and gla_bwd v2's (csrc/gla_bwd/v2_chunked_mma.cu, `emulate_gla`, against GLA).

    python tools/emulate_bf16_backward.py                 # simple GLA, T = 1000, K = V = 64, B = H = 2
    python tools/emulate_bf16_backward.py --T 63 --K 64 --V 128
    python tools/emulate_bf16_backward.py --mixer gated_deltanet --T 63 --K 128 --V 128
    python tools/emulate_bf16_backward.py --mixer gla

The rounding points: S (the states entering the chunks, stored bf16), D (their adjoints), Y (the per-token
weighted V and dO that the two passes multiply), P (the decayed scores P and dP). dg is formed two ways: by the
chunk-local sum the kernel uses and by one reverse sum over the whole sequence (linear_bwd v1's form). What it
shows at the default problem: with every point rounded, dg's error is 2.2e-2 the sequence-wide way and 1.7e-3 the
chunk-local way (the rounded terms k_j . dk_j and <dstate, S_T> cancel only inside a chunk's sum), the other
gradients ~1.7e-3 either way; on the H200 the sequence-wide form missed FLA's 0.02 at 11 of the 16 simple GLA test
shapes with an initial state, the chunk-local one read 1.7e-3. A new kernel's rounding choices can be tried here
first (tests/test_emulate_bf16_backward.py holds the tool to the NumPy backward and to these findings). For the
delta rule (its points in `emulate_delta`'s docstring), every intermediate delta_bwd v2 stores or shares in bf16 at
once, with dg formed chunk-locally, keeps every gradient at or below 3e-3 at T = 1000 (K = V = 64) and T = 63
(K = V = 128): inside FLA's tolerances (0.008; dg, dbeta 0.02) on these inputs. For GLA, a decay per key channel,
the same holds channel by channel: with every point rounded, dg chunk-locally 1.7e-3 at T = 1000 (K = V = 64) and
at T = 63 (K = V = 128), the sequence-wide sum 2.1e-2 and 1.5e-2, the other gradients 1.6-1.7e-3; so a chunked
GLA backward should form dg chunk by chunk, as linear_bwd v2 and gla_bwd v2 do (gla_bwd v1 sums over the whole
sequence, but from float32 states, not bf16 ones). gla_bwd v2 also stores its sub-chunk references in bf16 (point
R, GLA only): with it, every point rounded, dg reads 2.9e-3 at T = 1000 (K = V = 64) and 2.0e-3 at T = 63
(K = V = 128), the other gradients unchanged.
"""
from __future__ import annotations

import argparse

import numpy as np

CHUNK = 64
SUB = 16  # gla_bwd v2's sub-chunks
POINTS = ("S", "D", "Y", "P")
GLA_POINTS = POINTS + ("R",)


def bf16(x):
    """x rounded to bfloat16 (to nearest, ties to even), as float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def _chunks(x):
    """[B, T, H, ...] -> [B, N, C, H, ...], zero-padded to whole chunks (the token axis split in place, so that the
    einsums below keep the kernels' row order: chunk, position, head)."""
    B, T = x.shape[:2]
    pad = -T % CHUNK
    x = np.concatenate([x, np.zeros((B, pad) + x.shape[2:])], 1) if pad else x
    return x.reshape((B, -1, CHUNK) + x.shape[2:])


def _tokens(x, T: int):
    """The inverse of `_chunks`: [B, N, C, H, ...] -> [B, T, H, ...]."""
    return x.reshape((x.shape[0], -1) + x.shape[3:])[:, :T]


def emulate(q, k, v, g, S0, do, dS, scale, rounded=()):
    """linear_bwd v2 on float64 arrays (q, k [B, T, H, K]; v, do [B, T, H, V]; g [B, T, H]; S0, dS [B, H, K, V] or
    None), rounding to bf16 at the points named in `rounded`. Returns dq, dk, dv, dinitial_state, and dg twice:
    "dg" the chunk-local way, "dg_sequence" as one reverse sum over the sequence."""
    R = {p: (bf16 if p in rounded else (lambda x: x)) for p in POINTS}
    B, T, H, K = q.shape
    V, N = v.shape[-1], -(-T // CHUNK)
    qc, kc, vc, doc, gc = (_chunks(x) for x in (q, k, v, do, g))
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

    dq, dk, dv, dg = (_tokens(x, T) for x in (dq, dk, dv, dg))
    term = (q * dq).sum(-1) - (k * dk).sum(-1)
    if dS is not None:
        term[:, -1] += (dS * final).sum((-2, -1))
    dg_sequence = np.cumsum(term[:, ::-1], 1)[:, ::-1]
    return {"dq": dq, "dk": dk, "dv": dv, "dinitial_state": D, "dg": dg, "dg_sequence": dg_sequence}


def emulate_gla(q, k, v, g, S0, do, dS, scale, rounded=()):
    """A chunked GLA backward in linear_bwd v2's layout, with a decay per key channel (g [B, T, H, K]): the two
    passes store the states entering each chunk and their adjoints (points S, D) from the per-channel weighted
    operands K exp(G_L - G) and scale Q exp(G) (point Y), and each chunk's gradients come from its decayed scores P
    and dA = scale dO V^T (point P). The intra-chunk sums over token pairs take gla_bwd v2's route
    (csrc/gla_bwd/v2_chunked_mma.cu): a pair in two sub-chunks of 16 tokens through the boundary r between them,
    from the references Kref = k exp(G_r - G_j) and Qref = q exp(G_i - G_r), which the kernel stores in bf16 for
    its products (point R); a pair inside one sub-chunk with its decay exp(G_i - G_j) per channel in float64, as
    the kernel's CUDA-core loop. (Unrounded the route is an identity: every point off, the same numbers as the
    plain per-channel sum.) dg per channel, both ways: "dg" chunk-locally
    (the reverse sum of q . dq - k . dk inside the chunk, plus exp(G_L) <D_c, S_{c-1}> and sum_j k_j dk_j^inter per
    channel at its end), "dg_sequence" as one reverse sum with <dstate, S_T> (gla_bwd v1's form)."""
    R = {p: (bf16 if p in rounded else (lambda x: x)) for p in GLA_POINTS}
    B, T, H, K = q.shape
    V, N = v.shape[-1], -(-T // CHUNK)
    qc, kc, vc, doc, gc = (_chunks(x) for x in (q, k, v, do, g))
    G = np.cumsum(gc, 2)                                                   # chunk-local [B, N, C, H, K]
    G_last = G[:, :, -1]                                                   # [B, N, H, K]
    S = np.zeros((B, H, K, V)) if S0 is None else S0.copy()
    states = []
    for n in range(N):
        states.append(R["S"](S))
        Y = R["Y"](np.exp(G_last[:, n][:, None] - G[:, n]) * kc[:, n])
        S = np.exp(G_last[:, n])[..., None] * S + np.einsum("bchk,bchv->bhkv", Y, vc[:, n])
    final = S
    D = np.zeros((B, H, K, V)) if dS is None else dS.copy()
    adjoints = [None] * N
    for n in reversed(range(N)):
        adjoints[n] = R["D"](D)
        Y = R["Y"](scale * np.exp(G[:, n]) * qc[:, n])
        D = np.exp(G_last[:, n])[..., None] * D + np.einsum("bchk,bchv->bhkv", Y, doc[:, n])
    dq, dk, dv = np.zeros(qc.shape), np.zeros(kc.shape), np.zeros(vc.shape)
    dg = np.zeros(gc.shape)
    causal = np.tril(np.ones((CHUNK, CHUNK)))[None, :, :, None]
    for n in range(N):
        Gn = G[:, n]
        M = np.exp(Gn[:, :, None] - Gn[:, None, :]) * causal[..., None]   # [B, i, j, H, K]
        P = R["P"](scale * np.einsum("bihk,bjhk,bijhk->bijh", qc[:, n], kc[:, n], M))
        dA = R["P"](scale * np.einsum("bihv,bjhv->bijh", doc[:, n], vc[:, n]) * causal)
        S_n, D_n = states[n], adjoints[n]
        to_end = np.exp(G_last[:, n][:, None] - Gn)                       # [B, C, H, K]
        dk_inter = to_end * np.einsum("bjhv,bhkv->bjhk", vc[:, n], D_n)
        dq_intra, dk_intra = _intra_through_references(dA, Gn, qc[:, n], kc[:, n], M, R["R"])
        dq[:, n] = scale * np.exp(Gn) * np.einsum("bihv,bhkv->bihk", doc[:, n], S_n) + dq_intra
        dk[:, n] = dk_inter + dk_intra
        dv[:, n] = (np.einsum("bjhk,bhkv->bjhv", to_end * kc[:, n], D_n)
                    + np.einsum("bijh,bihv->bjhv", P, doc[:, n]))
        term = qc[:, n] * dq[:, n] - kc[:, n] * dk[:, n]                  # [B, C, H, K]
        last = np.exp(G_last[:, n]) * (D_n * S_n).sum(-1) + (kc[:, n] * dk_inter).sum(1)
        dg[:, n] = np.cumsum(term[:, ::-1], 1)[:, ::-1] + last[:, None]

    dq, dk, dv, dg = (_tokens(x, T) for x in (dq, dk, dv, dg))
    term = q * dq - k * dk
    if dS is not None:
        term[:, -1] += (dS * final).sum(-1)
    dg_sequence = np.cumsum(term[:, ::-1], 1)[:, ::-1]
    return {"dq": dq, "dk": dk, "dv": dv, "dinitial_state": D, "dg": dg, "dg_sequence": dg_sequence}


def _intra_through_references(dA, G, q, k, M, round_reference):
    """gla_bwd v2's intra-chunk sums dq_i = sum_{j <= i} dA_ij k_j exp(G_i - G_j) and dk_j = sum_{i >= j} dA_ij q_i
    exp(G_i - G_j) of one chunk (dA [B, i, j, H], G, q, k [B, C, H, K], M the per-channel decays [B, i, j, H, K]):
    sub-chunk a's diagonal block term by term, its pairs with earlier sub-chunks through r = 16 a - 1 (rows of a)
    and with later ones through r = 16 a + 15 (columns of a), the references passed through round_reference."""
    dq, dk = np.zeros(q.shape), np.zeros(k.shape)
    for a in range(CHUNK // SUB):
        rows = slice(SUB * a, SUB * (a + 1))
        block = (slice(None), rows, rows)
        dq[:, rows] += np.einsum("bijh,bijhk,bjhk->bihk", dA[block], M[block], k[:, rows])
        dk[:, rows] += np.einsum("bijh,bijhk,bihk->bjhk", dA[block], M[block], q[:, rows])
        if a >= 1:  # columns j < 16 a, through r = 16 a - 1
            r, before = SUB * a - 1, slice(0, SUB * a)
            Kref = round_reference(k[:, before] * np.exp(G[:, r:r + 1] - G[:, before]))
            dq[:, rows] += np.exp(G[:, rows] - G[:, r:r + 1]) * np.einsum("bijh,bjhk->bihk", dA[:, rows, before], Kref)
        if a <= CHUNK // SUB - 2:  # rows i >= 16 (a + 1), through r = 16 a + 15
            r, after = SUB * a + SUB - 1, slice(SUB * (a + 1), CHUNK)
            Qref = round_reference(q[:, after] * np.exp(G[:, after] - G[:, r:r + 1]))
            dk[:, rows] += np.exp(G[:, r:r + 1] - G[:, rows]) * np.einsum("bijh,bihk->bjhk", dA[:, after, rows], Qref)
    return dq, dk


DELTA_POINTS = ("T", "S", "D", "X", "N", "R", "P", "Y")


def emulate_delta(q, k, v, g, beta, S0, do, dS, scale, rounded=()):
    """The gated delta rule's chunked backward as delta_bwd v2 (csrc/delta_bwd/v2_chunked_wy_mma.cu) splits it: the WY
    step, the state pass, the adjoint pass, then each chunk's gradients; in float64, rounding to bf16 at the points
    named in `rounded`, which are the kernel's stored and shared intermediates:
        T   (I + A)^-1 per chunk               S   the states entering the chunks     D   their adjoints D+
        X   diag(beta) (V - E K S)              N   the corrections Delta = T X and their adjoint dDelta
        R   R = T^T dDelta (= dL/dX)            P   the decayed scores and their cotangents dS, dpair
        Y   scale E dO, F Delta and E diag(beta) R, the passes' weighted operands
    Per chunk, with G the chunk-local cumulative gate, E = diag(exp(G)), F = diag(exp(G_L - G)), M_ij = exp(G_i - G_j)
    and A = diag(beta) (K K^T * M) strictly below the diagonal:
        Delta = T X,   S+ = exp(G_L) S + K^T F Delta,   O = scale E Q S + P Delta,   P = scale (Q K^T) * M
        dDelta = P^T dO + F K D+,   R = T^T dDelta,   D = exp(G_L) D+ + scale Q^T E dO - K^T E diag(beta) R
        dA = -R Delta^T (strictly lower),   R_w = -R S^T   (FLA's -(R U^T + R_w W^T) and T^T dW, since U - W S = Delta)
    and dg inside each chunk, as linear_bwd v2 forms it: dL/dG = q . dq - k . dk + 2 k . dk^B, dk^B = diag(beta) E R_w
    + dpair K, plus the last token's exp(G_L) <D+, S> + sum_j k_j . (F Delta D+^T)_j. Returns dq, dk, dv, dg, dbeta,
    dinitial_state."""
    R = {p: (bf16 if p in rounded else (lambda x: x)) for p in DELTA_POINTS}
    B, T, H, K = q.shape
    V, N = v.shape[-1], -(-T // CHUNK)
    qc, kc, vc, doc, gc, bc = (_chunks(x) for x in (q, k, v, do, g, beta))
    G = np.cumsum(gc, 2)                                                   # [B, N, C, H]
    G_last = G[:, :, -1]
    causal = np.tril(np.ones((CHUNK, CHUNK)))[None, :, :, None]
    strict = np.tril(np.ones((CHUNK, CHUNK)), -1)[None, :, :, None]
    eye = np.eye(CHUNK)[None, None]
    rows = lambda w, x: w[..., None] * x                                   # diag(w) x, w [B, C, H], x [B, C, H, *]

    # Launch 1: the WY step; the per-chunk pieces both passes and the gradients read.
    pieces = []
    for n in range(N):
        M = np.exp(G[:, n][:, :, None] - G[:, n][:, None, :])             # [B, i, j, H]
        gram = np.einsum("bihk,bjhk->bijh", kc[:, n], kc[:, n]) * M * strict
        Tm = R["T"](np.linalg.inv(eye + np.moveaxis(bc[:, n][:, :, None] * gram, 3, 1)))   # [B, H, C, C]
        P = R["P"](scale * np.einsum("bihk,bjhk->bijh", qc[:, n], kc[:, n]) * M * causal)
        pieces.append(dict(M=M, gram=gram, T=Tm, P=P, E=np.exp(G[:, n]), F=np.exp(G_last[:, n][:, None] - G[:, n])))

    # Launch 2a: the states, forwards.
    h = np.zeros((B, H, K, V)) if S0 is None else S0.copy()
    states, deltas = [], []
    for n, c in enumerate(pieces):
        states.append(R["S"](h))
        X = R["X"](rows(bc[:, n], vc[:, n] - rows(c["E"], np.einsum("bjhk,bhkv->bjhv", kc[:, n], states[-1]))))
        deltas.append(R["N"](np.einsum("bhij,bjhv->bihv", c["T"], X)))
        h = (np.exp(G_last[:, n])[..., None, None] * h
             + np.einsum("bjhk,bjhv->bhkv", kc[:, n], R["Y"](rows(c["F"], deltas[-1]))))

    # Launch 2b: the adjoints, backwards; dv.
    dh = np.zeros((B, H, K, V)) if dS is None else dS.copy()
    adjoints, corrections_adjoint = [None] * N, [None] * N
    dv = np.zeros(vc.shape)
    for n in reversed(range(N)):
        c = pieces[n]
        adjoints[n] = R["D"](dh)
        d_delta = R["N"](np.einsum("bijh,bihv->bjhv", c["P"], doc[:, n])
                         + rows(c["F"], np.einsum("bjhk,bhkv->bjhv", kc[:, n], adjoints[n])))
        ra = np.einsum("bhji,bjhv->bihv", c["T"], d_delta)                 # T^T dDelta
        corrections_adjoint[n] = R["R"](ra)
        dv[:, n] = rows(bc[:, n], ra)
        dh = (np.exp(G_last[:, n])[..., None, None] * dh
              + np.einsum("bihk,bihv->bhkv", qc[:, n], R["Y"](rows(scale * c["E"], doc[:, n])))
              - np.einsum("bihk,bihv->bhkv", kc[:, n], R["Y"](rows(c["E"] * bc[:, n], ra))))
    dh0 = dh

    # Launch 3: each chunk's gradients.
    dq, dk = np.zeros(qc.shape), np.zeros(kc.shape)
    dg, dbeta = np.zeros(gc.shape), np.zeros(bc.shape)
    for n, c in enumerate(pieces):
        S_n, D_n, delta, ra = states[n], adjoints[n], deltas[n], corrections_adjoint[n]
        q_n, k_n, b_n, E, F = qc[:, n], kc[:, n], bc[:, n], c["E"], c["F"]
        dA = -np.einsum("bihv,bjhv->bijh", ra, delta) * strict
        dpair = R["P"](b_n[:, :, None] * dA * c["M"])
        dS_scores = R["P"](scale * np.einsum("bihv,bjhv->bijh", doc[:, n], delta) * c["M"] * causal)
        dq_n = (rows(scale * E, np.einsum("bihv,bhkv->bihk", doc[:, n], S_n))
                + np.einsum("bijh,bjhk->bihk", dS_scores, k_n))
        r_w = -np.einsum("bihv,bhkv->bihk", ra, S_n)
        dk_b = rows(b_n * E, r_w) + np.einsum("bijh,bjhk->bihk", dpair, k_n)
        dk_end = rows(F, np.einsum("bihv,bhkv->bihk", delta, D_n))
        dk_n = (dk_b + dk_end + np.einsum("bijh,bihk->bjhk", dpair, k_n)
                + np.einsum("bijh,bihk->bjhk", dS_scores, q_n))
        dbeta[:, n] = ((vc[:, n] * ra).sum(-1) + E * (k_n * r_w).sum(-1)
                       + (dA * c["M"] * np.einsum("bihk,bjhk->bijh", k_n, k_n)).sum(2))
        dG = (q_n * dq_n).sum(-1) - (k_n * dk_n).sum(-1) + 2 * (k_n * dk_b).sum(-1)
        last = np.exp(G_last[:, n]) * (D_n * S_n).sum((-2, -1)) + (k_n * dk_end).sum((1, -1))   # [B, H]
        dq[:, n], dk[:, n] = dq_n, dk_n
        dg[:, n] = np.cumsum(dG[:, ::-1], 1)[:, ::-1] + last[:, None]

    return {"dq": _tokens(dq, T), "dk": _tokens(dk, T), "dv": _tokens(dv, T), "dg": _tokens(dg, T),
            "dbeta": _tokens(dbeta, T), "dinitial_state": dh0}


def inputs(B, T, H, K, V, seed):
    """Inputs as tests/test_cuda_backward.py makes them (keys of norm 0.9, gates in [-1, -0.05], an initial state,
    do and dstate; g_channels [B, T, H, K], GLA's per-channel gates, in the same range), q, k, v, do rounded to bf16
    as the GPU reads them."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, H, K))
    k *= 0.9 / np.linalg.norm(k, axis=-1, keepdims=True)
    return dict(q=bf16(rng.standard_normal((B, T, H, K))), k=bf16(k), v=bf16(rng.standard_normal((B, T, H, V))),
                g=rng.uniform(-1.0, -0.05, (B, T, H)).astype(np.float32).astype(np.float64),
                S0=(0.5 * rng.standard_normal((B, H, K, V))).astype(np.float32).astype(np.float64),
                do=bf16(rng.standard_normal((B, T, H, V))), dS=rng.standard_normal((B, H, K, V)),
                beta=rng.uniform(0.1, 0.9, (B, T, H)).astype(np.float32).astype(np.float64),
                g_channels=rng.uniform(-1.0, -0.05, (B, T, H, K)).astype(np.float32).astype(np.float64))


def errors(x, rounded, mixer="simple_gla"):
    """Each gradient's relative RMS error against the mixer's chunked_backward in float64 (simple_gla through
    `emulate`, gla through `emulate_gla`, dg_sequence against dg; gated_deltanet through `emulate_delta`)."""
    from minilin.mixers import gated_deltanet, gla, simple_gla

    scale = x["q"].shape[-1] ** -0.5
    if mixer == "gla":
        ref = gla.chunked_backward(x["q"], x["k"], x["v"], x["g_channels"], do=x["do"], dstate=x["dS"], scale=scale,
                                   initial_state=x["S0"])._asdict()
        got = emulate_gla(x["q"], x["k"], x["v"], x["g_channels"], x["S0"], x["do"], x["dS"], scale, rounded)
    elif mixer == "gated_deltanet":
        ref = gated_deltanet.chunked_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], do=x["do"], dstate=x["dS"],
                                              scale=scale, initial_state=x["S0"])._asdict()
        got = emulate_delta(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], x["do"], x["dS"], scale, rounded)
    else:
        ref = simple_gla.chunked_backward(x["q"], x["k"], x["v"], x["g"], do=x["do"], dstate=x["dS"], scale=scale,
                                          initial_state=x["S0"])._asdict()
        got = emulate(x["q"], x["k"], x["v"], x["g"], x["S0"], x["do"], x["dS"], scale, rounded)
    return {name: float(np.linalg.norm(value - ref[name.replace("_sequence", "")])
                        / np.linalg.norm(ref[name.replace("_sequence", "")])) for name, value in got.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("B", 2), ("T", 1000), ("H", 2), ("K", 64), ("V", 64), ("seed", 0)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--mixer", choices=["simple_gla", "gla", "gated_deltanet"], default="simple_gla")
    args = parser.parse_args(argv)
    x = inputs(args.B, args.T, args.H, args.K, args.V, args.seed)
    points = {"gated_deltanet": DELTA_POINTS, "gla": GLA_POINTS}.get(args.mixer, POINTS)
    cases = [("none", ())] + [(p, (p,)) for p in points] + [("all", points)]
    names = (("dq", "dk", "dv", "dinitial_state", "dg", "dbeta") if args.mixer == "gated_deltanet"
             else ("dq", "dk", "dv", "dinitial_state", "dg", "dg_sequence"))
    print(f"{args.mixer}, B={args.B} T={args.T} H={args.H} K={args.K} V={args.V}: relative RMS error against "
          f"float64, per rounding point")
    print("| rounded | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for label, rounded in cases:
        e = errors(x, rounded, args.mixer)
        print(f"| {label} | " + " | ".join(f"{e[n]:.1e}" for n in names) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
