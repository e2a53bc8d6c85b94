"""The environment of a child process that computes on a small shared CPU: one BLAS thread and fixed malloc
thresholds, for the commands that ask for it (`minilin train`, `minilin bench --device cpu`, the tour's timing
experiments).

OpenBLAS, MKL and BLIS read their thread count from the environment once, when NumPy loads them, so a process
that has imported NumPy cannot change it (without a dependency such as threadpoolctl). A command that wants
one thread starts a child Python with these variables set to 1.

Why one thread, where it is asked for: the products of a small model (matrices of 32 to 128 columns) are too
small to split, and a multi-threaded BLAS call waits for its slowest thread; on a 2-core machine with other
work running, a training step of the quick MQAR model took a median 190 ms with OpenBLAS's two threads against
39 ms with one (measured on the development machine, load average about 2).

Why fixed malloc thresholds: glibc returns large freed blocks to the OS and moves its mmap threshold with the
process's history, so a computation that makes and drops megabyte temporaries at every step touches fresh
pages (a page fault each, microseconds on a virtual machine) again and again. With the mmap threshold at
32 MiB (glibc's largest) and the trim threshold at 1 GiB every step reuses the pages of the last one: the
quick MQAR sweep took 56 s instead of 80 s, with 0.1 s of system time instead of 21 s (glibc's manual,
"Memory Allocation Tunables"; other C libraries ignore the variable).
"""
from __future__ import annotations

import os
import subprocess
import sys

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


def compute_environment(environ=None) -> dict:
    """A copy of the environment with every BLAS thread variable set to 1 and the malloc thresholds fixed
    (added to any GLIBC_TUNABLES already set)."""
    environ = dict(os.environ if environ is None else environ)
    environ.update({name: "1" for name in THREAD_VARIABLES})
    environ["GLIBC_TUNABLES"] = ":".join(filter(None, [MALLOC_TUNABLES, environ.get("GLIBC_TUNABLES")]))
    return environ


def is_one_thread(environ=None) -> bool:
    """Whether this process was started with `compute_environment()`'s settings: one BLAS thread asked for and the
    fixed malloc thresholds (a process with the thread variables at 1 but other thresholds re-runs too)."""
    environ = os.environ if environ is None else environ
    return (all(environ.get(name) == "1" for name in THREAD_VARIABLES[:3])
            and MALLOC_TUNABLES in environ.get("GLIBC_TUNABLES", ""))


def rerun(argv: list) -> int:
    """Run `minilin <argv>` again in a child Python with `compute_environment()`; its exit status."""
    return subprocess.run([sys.executable, "-m", "minilin", *argv], env=compute_environment()).returncode
