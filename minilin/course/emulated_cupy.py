"""The GPU exercises on a machine without a GPU: a stand-in `cupy` module that compiles each RawKernel's CUDA
C++ with g++ as plain C++20 (one std::thread per CUDA thread, a std::barrier per block for __syncthreads(),
`__shared__` as function-static storage, blocks one after another) and calls it through ctypes. The exercise
checks, the launchers and the kernels all run unchanged. It proves the kernels' indexing, synchronization
structure and arithmetic, not their speed or their behaviour under the GPU's memory model; `cupy.empty`
fills with NaN, so an output the kernel forgets to write fails the check, and every array sits between two
zones of NaN (GUARD), so a read just out of bounds poisons the result and a write out of bounds fails the
launch, where a GPU would go on with corrupted memory.

    cupy = fake_cupy(workdir); sys.modules["cupy"] = cupy; runner.run(ex, gpu=EMULATED, ...)

tests/test_exercises.py runs the GPU exercises' proofs through it, and `python -m minilin.course.mutants
--emulate-gpu` their mutants. Needs g++ (GXX is None without it).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

CUDA_SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <thread>
#include <vector>
struct minilin_dim3 { unsigned x = 1, y = 1, z = 1; };
static thread_local minilin_dim3 threadIdx;
static minilin_dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* minilin_block_barrier = nullptr;
static inline void __syncthreads() { minilin_block_barrier->arrive_and_wait(); }
using std::max;
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
"""

CTYPES = {np.dtype(np.int32): ("int", "c_int"), np.dtype(np.uint32): ("unsigned", "c_uint"),
          np.dtype(np.int64): ("long long", "c_longlong"), np.dtype(np.float32): ("float", "c_float"),
          np.dtype(np.float64): ("double", "c_double")}
POINTERS = {np.dtype(np.float32): "float*", np.dtype(np.float64): "double*", np.dtype(np.int32): "int*"}
GXX = shutil.which("g++")
EMULATED = (True, "emulated on the CPU")   # what runner.run takes as `gpu` for the emulation
GUARD = 256   # elements of NaN before and after every array: a read out of bounds poisons the result, a write
              # out of bounds is found after the launch (the GPU itself would corrupt memory silently)


def fake_cupy(workdir: Path):
    """A stand-in `cupy` module whose RawKernels compile with g++ and run on the CPU; shared objects are built
    once per source in `workdir`."""
    import ctypes
    import hashlib
    import types

    cp = types.ModuleType("cupy")

    class ndarray(np.ndarray):
        def get(self):
            return np.array(self).view(np.ndarray)

    ndarray.__module__ = "cupy"  # what minilin.backend.is_cupy_array looks at

    def plain(a):
        return a.view(np.ndarray) if isinstance(a, np.ndarray) else a

    def build(source: str, flags) -> Path:
        digest = hashlib.sha1((source + " ".join(flags)).encode()).hexdigest()[:16]
        out = workdir / f"k{digest}.so"
        if not out.exists():  # built once per test session (the same workdir)
            path = workdir / f"k{digest}.cpp"
            path.write_text(source, encoding="utf-8")
            done = subprocess.run([GXX, "-std=c++20", "-O1", "-pthread", "-fPIC", *flags, str(path), "-o", str(out)],
                                  capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"the kernel does not compile (g++ as C++20, emulating CUDA):\n{done.stderr}")
        return out

    class RawKernel:
        def __init__(self, code, name, options=()):
            self.code, self.name = code, name

        def compile(self, log_stream=None):
            build(CUDA_SHIM + self.code + f"\nstatic auto* minilin_check_name = &{self.name};\n", ["-c"])

        def __call__(self, grid, block, args, shared_mem=0):
            grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
            params, casts, argtypes, values = [], [], [], []
            for i, a in enumerate(args):
                if isinstance(a, np.ndarray):
                    params.append(f"void* a{i}")
                    casts.append(f"({POINTERS[a.dtype]})a{i}")
                    argtypes.append(ctypes.c_void_p)
                    values.append(a.ctypes.data)
                elif isinstance(a, np.generic) and a.dtype in CTYPES:
                    c_type, ctypes_name = CTYPES[a.dtype]
                    params.append(f"{c_type} a{i}")
                    casts.append(f"a{i}")
                    argtypes.append(getattr(ctypes, ctypes_name))
                    values.append(a.item())
                else:
                    raise TypeError(f"kernel argument {i}: {type(a).__name__}; pass arrays, np.int32 or np.float32 "
                                    "(CuPy passes a Python int as 64 bits)")
            launcher = f"""
extern "C" void minilin_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               {", ".join(params)}) {{
    gridDim = {{gx, gy, gz}};
    blockDim = {{bx, by, bz}};
    for (unsigned z = 0; z < gz; ++z) for (unsigned y = 0; y < gy; ++y) for (unsigned x = 0; x < gx; ++x) {{
        blockIdx = {{x, y, z}};
        std::barrier<> block_barrier(bx * by * bz);
        minilin_block_barrier = &block_barrier;
        std::vector<std::thread> threads;
        for (unsigned tz = 0; tz < bz; ++tz) for (unsigned ty = 0; ty < by; ++ty) for (unsigned tx = 0; tx < bx; ++tx)
            threads.emplace_back([=] {{ threadIdx = {{tx, ty, tz}}; {self.name}({", ".join(casts)}); }});
        for (auto& t : threads) t.join();
    }}
}}
"""
            library = ctypes.CDLL(str(build(CUDA_SHIM + self.code + launcher, ["-shared"])))
            library.minilin_launch.argtypes = [ctypes.c_uint] * 6 + argtypes
            library.minilin_launch(*grid, *block, *values)
            for i, a in enumerate(args):   # a write past either end of an array lands in its guard zones
                for zone in getattr(a, "_minilin_zones", ()):
                    touched = ~np.isnan(zone) if zone.dtype.kind == "f" else zone != 0
                    if touched.any():
                        raise RuntimeError(f"the kernel wrote outside argument {i} (an array of {a.size} elements): "
                                           "an index past its end, or before its start")

    cp.__minilin_emulated__ = True   # not a GPU: the runner may fork around it (see runner.isolation_for)
    cp.ndarray, cp.RawKernel = ndarray, RawKernel
    cp.float32, cp.float64, cp.int32 = np.float32, np.float64, np.int32
    def guarded(values, dtype=None):
        """A contiguous copy of `values` between two guard zones of NaN (see GUARD)."""
        values = np.asarray(plain(values), dtype=dtype)
        poison = np.nan if values.dtype.kind == "f" else 0
        base = np.full(values.size + 2 * GUARD, poison, values.dtype)
        base[GUARD:GUARD + values.size] = values.ravel()
        a = base[GUARD:GUARD + values.size].reshape(values.shape).view(ndarray)
        a._minilin_zones = (base[:GUARD], base[GUARD + values.size:])
        return a

    cp.asarray = lambda a, dtype=None: a if isinstance(a, ndarray) and dtype in (None, a.dtype) else guarded(a, dtype)
    cp.ascontiguousarray = lambda a, dtype=None: (a if isinstance(a, ndarray) and a.flags.c_contiguous and
                                                  dtype in (None, a.dtype) else guarded(a, dtype))
    cp.empty = lambda shape, dtype=np.float64: guarded(np.full(shape, np.nan, dtype))
    cp.zeros = lambda shape, dtype=np.float64: guarded(np.zeros(shape, dtype))
    cp.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    return cp
