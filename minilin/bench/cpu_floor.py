"""`minilin bench --device cpu --floor`: how fast could a chunked form be on this CPU? Its matrix products alone.

The CPU bench's targets (`cpu.TARGETS`: chunked linear attention 8x, chunked Gated DeltaNet 6x faster than
the token loop) ask how much of the chunked form's time is arithmetic that cannot go away. This times only the
batched matrix products that every chunked form of the mixer does at chunk size C, in float32 on the CPU
bench's problem (B=1, H=4, T=4096, K=V=64; the mixer's own example inputs, so that the products see the
values the chunked form sees), contiguous and with preallocated outputs: no gates, masks, feature maps,
input checks, layout copies or triangular solve. A chunked NumPy form at that C does at least these
products (in the cheapest order known here), so the token loop's time over this floor bounds its speed-up
from above, for matrix products as NumPy runs them here (`np.matmul` over a batch, the BLAS's own
threads). The loop is the mixer's real `recurrent` form, timed in the same alternating rounds.

Per chunk n of C tokens (Q, K [C, K], V [C, V], state S_n [K, V]; shapes per head):
    linear attention:  Q K^T, (masked) A V, K^T V (the chunk's write), Q S_n (the read of the state),
                       and the sum of the two outputs
    Gated DeltaNet:    (beta K) K^T and Q K^T, then in order over the chunks K S_n, Delta_n = T X_n with
                       X_n = beta (V - K S_n), and K^T Delta_n; then Q S_n and P Delta_n. A second row adds
                       the triangular inverse T = (I + A)^-1 that every WY form needs in some form.
"""
from __future__ import annotations

import sys

import numpy as np

from .. import catalog
from ..chunking import causal_mask, to_chunks, transposed, unit_lower_inverse
from . import write_json
from .cpu import PROBLEM, TARGETS, machine
from .timing import interleaved_median_ms

CHUNK_SIZES = (16, 32, 64)
ROUNDS = 5


def _chunks(args, C):
    """The mixer's own float32 inputs, in the chunked layout [B, H, N, C, .] (contiguous)."""
    return [to_chunks(x, C) for x in args]


def linear_attention_products(args, C: int):
    """A closure running the products of chunked linear attention at chunk size C on q, k, v = args."""
    Q, Kc, Vc = _chunks(args[:3], C)
    K_T = transposed(Kc)
    A = Q @ K_T
    O, O_inter, dS = np.empty_like(Vc), np.empty_like(Vc), K_T @ Vc

    def run():
        np.matmul(Q, K_T, out=A)                   # Q K^T
        np.matmul(A, Vc, out=O)                    # A V
        np.matmul(K_T, Vc, out=dS)                 # K^T V: what each chunk writes
        # (The prefix sum that turns the writes into the states S_n is an addition, left out of the floor.)
        np.matmul(Q, dS, out=O_inter)              # Q S_n
        np.add(O, O_inter, out=O)
        return dS  # (for the tests: summed over the chunks, the final state)
    return run


def gated_deltanet_products(args, C: int, with_solve: bool = False):
    """A closure running the products of chunked Gated DeltaNet at chunk size C on (q, k, v, g, beta) = args;
    with_solve: also the triangular inverse T = (I + A)^-1 of every chunk (`chunking.unit_lower_inverse`).

    Of the two orders of the WY form this uses the one with fewer products: T times X_n = beta (V - K S_n)
    inside the state pass, instead of W = T beta K and U = T beta V made for all chunks first (FLA's order;
    on the dev box 7-10% slower as a floor). The chunked form itself (`_delta_rule.chunked`) uses neither: it
    multiplies T diag(beta) into P and K^T for all chunks at once, so that its pass does K S_n, the output
    and the write, and no product with T; the floor's order stays the one with the fewest products. The
    operands are the real T of these inputs (gates left out), so that the state pass stays bounded as it
    does in the chunked form."""
    q, k, v, g, beta = args
    Q, Kc, Vc = _chunks((q, k, v), C)
    beta_c = to_chunks(beta, C)[..., None]
    K_T = transposed(Kc)
    K_beta, V_beta = Kc * beta_c, Vc * beta_c
    QK = np.stack([K_beta, Q])                                   # [beta K; Q]
    grams = QK @ K_T
    strict_lower = causal_mask(C, np, strict=True)
    T_inv = unit_lower_inverse(grams[0] * strict_lower)
    S_in = np.empty(Vc.shape[:3] + (Kc.shape[-1], Vc.shape[-1]), np.float32)
    delta, O, O_intra = np.empty_like(Vc), np.empty_like(Vc), np.empty_like(Vc)
    KS, X, dS = np.empty_like(Vc[:, :, 0]), np.empty_like(Vc[:, :, 0]), np.empty_like(S_in[:, :, 0])

    def run():
        np.matmul(QK, K_T, out=grams)              # (beta K) K^T and Q K^T
        T = unit_lower_inverse(grams[0] * strict_lower) if with_solve else T_inv
        S = np.zeros_like(dS)
        for n in range(Q.shape[2]):                # the state pass: chunk after chunk
            S_in[:, :, n] = S
            np.matmul(K_beta[:, :, n], S, out=KS)
            np.subtract(V_beta[:, :, n], KS, out=X)                 # X_n = beta (V - K S_n)
            np.matmul(T[:, :, n], X, out=delta[:, :, n])            # Delta_n = T X_n
            np.matmul(K_T[:, :, n], delta[:, :, n], out=dS)
            np.add(S, dS, out=S)
        np.matmul(Q, S_in, out=O)                  # Q S_n
        np.matmul(grams[1], delta, out=O_intra)    # P Delta_n
        np.add(O, O_intra, out=O)
        return S  # (for the tests: the final state, exact when the gates are all zero)
    return run


# What each mixer's floor times: (label, closure factory), every part in the same alternating rounds.
PRODUCTS = {
    "linear_attention": [("products", linear_attention_products)],
    "gated_deltanet": [("products", gated_deltanet_products),
                       ("products + solve", lambda args, C: gated_deltanet_products(args, C, with_solve=True))],
}


def floor_parts(name: str, args, C: int) -> dict:
    """{label: closure} of what `PRODUCTS` times for mixer `name` at chunk size C on its inputs `args`
    (empty for a mixer whose products are not written here): for the CPU bench's floor column."""
    return {label: factory(args, C) for label, factory in PRODUCTS.get(name, [])}


def floor_rows(rounds: int = ROUNDS, chunk_sizes=CHUNK_SIZES, problem=None, names=None) -> list[dict]:
    """For each mixer of PRODUCTS (or of `names`) and each of its parts: the token loop's median ms and, per
    chunk size, the part's median ms, all of a mixer's timed in the same alternating rounds (problem: the CPU
    bench's unless given)."""
    rows = []
    for name in names or PRODUCTS:
        mod = catalog.module(name)
        args, kwargs = mod.example_inputs(**(problem or PROBLEM), dtype=np.float32)
        fns = {"loop": lambda: mod.recurrent(*args, **kwargs)}
        fns.update({(label, C): factory(args, C) for label, factory in PRODUCTS[name] for C in chunk_sizes})
        times = interleaved_median_ms(fns, {key: 1 if key == "loop" else 3 for key in fns}, rounds=rounds)
        rows += [{"mixer": name, "part": label, "loop_ms": times["loop"], "target": TARGETS[name],
                  "floor_ms": {C: times[(label, C)] for C in chunk_sizes}} for label, _ in PRODUCTS[name]]
    return rows


def format_floor(rows: list[dict]) -> str:
    sizes = list(rows[0]["floor_ms"])
    lines = ["| mixer | timed | loop ms | " + " | ".join(f"C = {C}: ms (loop / it)" for C in sizes) + " | target |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in sizes) + " | ---: |"]
    for r in rows:
        cells = " | ".join(f"{ms:.1f} ({r['loop_ms'] / ms:.1f}x)" for ms in r["floor_ms"].values())
        lines.append(f"| {r['mixer']} | {r['part']} | {r['loop_ms']:.1f} | {cells} | {r['target']:.0f}x |")
    return "\n".join(lines)


def main(args) -> int:
    names = args.mixers or list(PRODUCTS)
    unknown = [name for name in names if name not in PRODUCTS]
    if unknown:
        print(f"--mixers: the floor knows the products of {list(PRODUCTS)} only, got {unknown}", file=sys.stderr)
        return 2
    chunk_sizes = tuple(args.chunk_sizes or CHUNK_SIZES)
    if any(C <= 0 for C in chunk_sizes):
        print(f"--chunk-sizes: expected positive integers, got {list(chunk_sizes)}", file=sys.stderr)
        return 2
    rounds = args.repeats or ROUNDS
    print(f"minilin bench --device cpu --floor: the matrix products of each chunked form alone (no gates or "
          f"copies; the solve only where the row says so), against the token loop; B={PROBLEM['B']} H={PROBLEM['H']} T={PROBLEM['T']} "
          f"K={PROBLEM['K']} V={PROBLEM['V']}, float32, {rounds} alternating rounds; {machine()}", flush=True)
    rows = floor_rows(rounds, chunk_sizes, names=names)
    print(format_floor(rows))
    if args.json:
        write_json(args.json, {"device": "cpu", "machine": machine(), "problem": PROBLEM, "floor": rows})
    return 0
