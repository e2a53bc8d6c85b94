"""Scripts for kernel work, run from the checkout's root with minilin installed (`pip install -e .`), on a GPU machine
unless they say CPU:

    bash tools/gpu_check.sh [OUTDIR]              build, GPU tests and benchmarks in one go
    python tools/compare_builds.py BASE op:N ...  one kernel version from two builds, timed in the same run
    python tools/profile_chunked.py [op:N ...]    launch the chunked kernels once each, for ncu
    python tools/ncu_regions.py SOURCE.csv        an ncu source page's samples between block barriers
    python tools/emulate_bf16_backward.py         a chunked backward's bf16 rounding points in float64 (CPU)

Each Python script also runs as a module (`python -m tools.compare_builds ...`). Not part of the installed
package: pip installs minilin only.
"""
