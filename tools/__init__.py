"""Scripts for a GPU machine, run from the checkout's root with minilin installed (`pip install -e .`):

    bash tools/gpu_check.sh [OUTDIR]              build, GPU tests and benchmarks in one go
    python tools/compare_builds.py BASE op:N ...  one kernel version from two builds, timed in the same run
    python tools/profile_chunked.py [op:N ...]    launch the chunked kernels once each, for ncu
    python tools/ncu_regions.py SOURCE.csv        an ncu source page's samples between block barriers

Each Python script also runs as a module (`python -m tools.compare_builds ...`). Not part of the installed
package: pip installs minilin only.
"""
