"""Same-run A/B of two builds of the extension: does a kernel change compute the same, and is it faster?

The bench compares the versions of one build; a change to an existing version (a refactor, a tuning
constant, a shared header) needs the old build beside the new one, timed in the same run, because a GPU's
times drift between runs by more than such changes (csrc/NOTES.md). In this checkout, with minilin installed
from it (`pip install -e .`), the base commit's tree beside it (_base/ is git-ignored), then both builds and
the comparison, on the GPU machine:

    mkdir _base && git archive BASE | tar -x -C _base
    (cd _base && python setup.py build_ext --inplace) & python setup.py build_ext --inplace; wait
    python tools/compare_builds.py _base linear:7 delta:10 --lengths 8192 32768
    python -m tools.compare_builds _base delta:10          # the same, as a module from the checkout's root

For each op:version and length, both builds run on the same inputs (the bench's, bf16, B=4 H=16 K=V=128):
first the largest absolute difference of their outputs and final states (0 when a change is bit-identical),
then both timed in alternating rounds with the bench's timer (bench/gpu_timing.py: device time, runs queued
back to back with the L2 overwritten between them; median of each round, median of the rounds), the ratio
new / base of those, and each build's one-call time (host dispatch included) beside them. Both builds must
have the version.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

# The mixer that exercises each op's kernels.
MIXER_OF_OP = {"linear": "simple_gla", "delta": "gated_deltanet", "gla": "gla", "kda": "kda"}


def parse_case(text: str) -> tuple[str, int]:
    """'delta:8' -> ('delta', 8); a clear error for anything else."""
    op, _, version = text.partition(":")
    if op not in MIXER_OF_OP or not version.isdigit():
        raise argparse.ArgumentTypeError(f"expected op:version with op in {sorted(MIXER_OF_OP)}, e.g. delta:8; "
                                         f"got {text!r}")
    return op, int(version)


def load_base_extension(tree: Path):
    """The extension module built in another checkout (tree/minilin/_cuda*.so), beside this one's."""
    built = sorted((tree / "minilin").glob("_cuda*.so"))
    if not built:
        raise SystemExit(f"no extension built in {tree}/minilin: run `python setup.py build_ext --inplace` there")
    # The init function is named after the module's last component, so the base build loads as base._cuda.
    spec = importlib.util.spec_from_file_location("minilin_base_build._cuda", built[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use_extension(module) -> None:
    """Point minilin.cuda at `module` for the calls that follow (its version list is read once, so re-read)."""
    from minilin.cuda import front

    front.extension = lambda: module
    front._built_versions.cache_clear()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base", type=Path, help="the other checkout, its extension built in place")
    parser.add_argument("cases", type=parse_case, nargs="+", metavar="op:version")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)

    import cupy

    import minilin._cuda as this_build
    from minilin.bench import gpu
    from minilin.bench.gpu_timing import alternating_medians

    builds = {"base": load_base_extension(args.base), "new": this_build}

    def on(build, run):
        """`run` on `build`, switching minilin.cuda over only when the build changes."""
        def call():
            if on.current is not build:
                use_extension(build)
                on.current = build
            return run()
        return call
    on.current = None

    print(f"base: {args.base.resolve()}  new: {Path(this_build.__file__).resolve().parents[1]}  "
          f"({args.rounds} alternating rounds of up to {args.repeats} runs, bf16)")
    for T in args.lengths:
        for op, version in args.cases:
            mixer = MIXER_OF_OP[op]
            inputs = gpu.make_inputs(mixer, T, seed=0)
            runs = {name: on(build, gpu.cuda_call(mixer, inputs, "bfloat16", version)) for name, build in builds.items()}
            base_o, base_state = gpu.cuda_out_as_float(runs["base"]())
            new_o, new_state = gpu.cuda_out_as_float(runs["new"]())
            diff = max(float(cupy.abs(new_o - base_o).max()), float(cupy.abs(new_state - base_state).max()))
            (base_ms, base_rounds, _, base_call), (new_ms, new_rounds, _, new_call) = alternating_medians(
                [(runs["base"], "cupy"), (runs["new"], "cupy")], repeats=args.repeats, rounds=args.rounds,
                budget_ms=3000.0)
            print(f"{op} v{version} T={T}: max |new - base| {diff:.3g}; base {base_ms:.4f} ms, new {new_ms:.4f} ms, "
                  f"new / base {new_ms / base_ms:.3f}  (rounds base {[round(r, 4) for r in base_rounds]}, "
                  f"new {[round(r, 4) for r in new_rounds]}; one call from idle: base {base_call:.4f}, "
                  f"new {new_call:.4f} ms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
