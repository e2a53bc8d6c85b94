"""Build script: the pure-Python package always; the CUDA extension `minilin._cuda` when nvcc is found.

    pip install -e .                                   builds the extension if nvcc is on PATH (or CUDA_HOME)
    MINILIN_CUDA=0 pip install -e .                    never builds it (pure Python)
    MINILIN_CUDA=1 pip install -e .                    must build it: no nvcc or a failed build is an error
    MINILIN_CUDA_ARCH="80;90a" pip install -e .        targets (default "90a": sm_90a code + compute_90 PTX)

The extension: nvcc compiles csrc/**/*.cu to objects (in parallel), the host compiler compiles the pybind11
bindings (csrc/bindings.cpp, csrc/registry.cpp; no CUDA or CuPy headers needed), and the link adds the
static CUDA runtime, so the module needs no libcudart on the library path at import time.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
EXTENSION = "minilin._cuda"


# ---- configuration from the environment (tests/test_cuda_build.py imports these) -----------------------
def cuda_build_mode(environ=os.environ) -> str:
    """'off' (MINILIN_CUDA=0), 'required' (MINILIN_CUDA=1) or 'auto' (unset: build when nvcc is found)."""
    value = environ.get("MINILIN_CUDA", "").strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("0", "off", "no", "false"):
        return "off"
    if value in ("1", "on", "yes", "true"):
        return "required"
    raise ValueError(f"MINILIN_CUDA: expected 0, 1 or unset, got {environ['MINILIN_CUDA']!r}")


def parse_arch(spec: str | None) -> tuple[list[str], str]:
    """MINILIN_CUDA_ARCH -> (nvcc -gencode flags, a readable summary).

    `spec` lists compute capabilities separated by ';', ',' or spaces, written 90, 9.0, sm_90 or 90a.
    Each gets machine code (SASS); the last also gets PTX, so newer GPUs can compile it at load time (the
    PTX of "90a" is plain compute_90: architecture-specific PTX would load nowhere else).
    Default "90a": sm_90a code, which H100 and H200 run and which the wgmma version (delta v10) needs, plus
    compute_90 PTX. mma.sync bf16 and cp.async need >= 80.
    """
    items = [s for s in re.split(r"[;,\s]+", (spec or "90a").strip()) if s]
    if not items:
        raise ValueError(f"MINILIN_CUDA_ARCH: expected compute capabilities like '90' or '80;90', got {spec!r}")
    archs = []  # (digits, suffix): ("90", "a") for 90a
    for item in items:
        m = re.fullmatch(r"(?:sm_|compute_)?(\d)\.?(\d)([a-z]?)", item.strip().lower())
        if not m:
            raise ValueError(f"MINILIN_CUDA_ARCH: expected compute capabilities like '90' or '80;90', got {item!r}")
        digits = m.group(1) + m.group(2)
        if int(digits) < 80:
            raise ValueError(f"MINILIN_CUDA_ARCH: the kernels need compute capability >= 8.0 (cp.async, bf16 mma), "
                             f"got {item!r}")
        archs.append((digits, m.group(3)))
    for digits, suffix in archs:
        if suffix and (digits, "") in archs:
            raise ValueError(f"MINILIN_CUDA_ARCH: {digits} and {digits}{suffix} both give compute capability "
                             f"{digits[0]}.{digits[1]} machine code; keep one (the wgmma versions need "
                             f"{digits}{suffix}), got {spec!r}")
    flags = [f"-gencode=arch=compute_{d}{x},code=sm_{d}{x}" for d, x in archs]
    ptx = archs[-1][0]
    flags.append(f"-gencode=arch=compute_{ptx},code=compute_{ptx}")
    summary = ",".join(f"sm_{d}{x}" for d, x in archs) + f",compute_{ptx}"
    return flags, summary


def builds_sm90a(arch_summary: str) -> bool:
    """Whether a build (parse_arch's summary) holds sm_90a code: the wgmma versions are listed only then."""
    return "sm_90a" in arch_summary.split(",")


def find_nvcc(environ=os.environ) -> str | None:
    """nvcc from CUDA_HOME / CUDA_PATH, else from PATH; None if there is none."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = environ.get(var)
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc", path=environ.get("PATH"))


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else "unknown"


def cuda_library_dirs(nvcc: str) -> list[str]:
    """Where libcudart_static.a lives, as nvcc itself reports it (nvcc may be a wrapper script)."""
    dirs = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs += [os.path.join(os.environ[var], d) for d in ("lib64", "lib")]
    dry = subprocess.run([nvcc, "--dryrun", "-o", "minilin_probe", "minilin_probe.cu"], capture_output=True, text=True)
    for line in (dry.stdout + dry.stderr).splitlines():
        if line.startswith("#$ LIBRARIES="):
            dirs += [d for d in re.findall(r'-L"?([^"\s]+)"?', line) if not d.rstrip("/").endswith("stubs")]
    home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    dirs += [os.path.join(home, "lib64"), os.path.join(home, "lib"), "/usr/local/cuda/lib64"]
    found = [d for d in dict.fromkeys(dirs) if os.path.isfile(os.path.join(d, "libcudart_static.a"))]
    if not found:
        raise RuntimeError(f"libcudart_static.a not found next to {nvcc} (looked in {', '.join(dict.fromkeys(dirs))})")
    return found[:1]


# ---- the build -------------------------------------------------------------------------------------------
class CudaBuildError(RuntimeError):
    pass


class BuildExt(build_ext):
    """build_ext that compiles the .cu sources with nvcc first, then lets setuptools do the rest.

    Unless MINILIN_CUDA=1, a failed CUDA build is a warning: the extension is dropped (so nothing later
    looks for its file) and the package installs as pure Python.
    """

    def build_extensions(self):
        failed = []
        for ext in self.extensions:
            if ext.name != EXTENSION:
                self.build_extension(ext)
                continue
            try:
                self._build_cuda(ext)
            except Exception as error:  # noqa: BLE001 - any failure is reported the same way
                if cuda_build_mode() == "required":
                    raise CudaBuildError(f"MINILIN_CUDA=1 but the CUDA extension did not build: {error}") from error
                print(f"WARNING: minilin: the CUDA extension was not built ({error}); installing pure Python. "
                      f"`minilin doctor` says what is missing.", file=sys.stderr)
                failed.append(ext)
        for ext in failed:
            self.extensions.remove(ext)

    def _build_cuda(self, ext):
        nvcc = find_nvcc()
        if nvcc is None:
            raise CudaBuildError("nvcc not found (put it on PATH or set CUDA_HOME)")
        try:
            import pybind11
        except ImportError as error:
            raise CudaBuildError("pybind11 is not installed (pip install pybind11)") from error
        gencode, arch_summary = parse_arch(os.environ.get("MINILIN_CUDA_ARCH"))
        version = nvcc_version(nvcc)
        cu_sources = [s for s in ext.sources if s.endswith(".cu")]
        host_sources = [s for s in ext.sources if not s.endswith(".cu")]
        out_dir = os.path.join(self.build_temp, "minilin_cuda")
        os.makedirs(out_dir, exist_ok=True)
        sm90a = [("MINILIN_SM90A", "1")] if builds_sm90a(arch_summary) else []
        flags = ["-std=c++17", "-O3", "-lineinfo", "-Xcompiler", "-fPIC", *gencode, *(f"-D{k}={v}" for k, v in sm90a)]

        def compile_one(source):
            obj = os.path.join(out_dir, os.path.relpath(source, "csrc").replace(os.sep, "_") + ".o")
            cmd = [nvcc, *flags, "-c", source, "-o", obj]
            print(" ".join(cmd), flush=True)
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise CudaBuildError(f"nvcc failed on {source}:\n{result.stdout}{result.stderr}")
            return obj

        with ThreadPoolExecutor(max_workers=max(1, min(len(cu_sources), os.cpu_count() or 1))) as pool:
            objects = list(pool.map(compile_one, cu_sources))
        ext.sources = host_sources
        ext.extra_objects = [*ext.extra_objects, *objects]
        ext.include_dirs = [*ext.include_dirs, pybind11.get_include(), "csrc"]
        ext.define_macros = [*ext.define_macros, *sm90a, ("MINILIN_CUDA_ARCH", f'"{arch_summary}"'),
                             ("MINILIN_NVCC_VERSION", f'"{version}"')]
        ext.library_dirs = [*ext.library_dirs, *cuda_library_dirs(nvcc)]
        ext.libraries = [*ext.libraries, "cudart_static", "rt", "pthread", "dl"]
        ext.extra_compile_args = [*ext.extra_compile_args, "-std=c++17", "-O2", "-fvisibility=hidden"]
        super().build_extension(ext)


def extensions() -> list[Extension]:
    if cuda_build_mode() == "off":
        return []
    if cuda_build_mode() == "auto" and find_nvcc() is None:
        print("minilin: nvcc not found, installing pure Python (MINILIN_CUDA=1 makes this an error)", file=sys.stderr)
        return []
    os.chdir(HERE)  # sources are given relative to the project root
    kernels = sorted(glob.glob("csrc/*/*.cu"))
    sources = ["csrc/bindings.cpp", "csrc/registry.cpp", *kernels]
    # BuildExt compiles the .cu files itself and hands setuptools only the host sources, whose dates decide
    # whether the module is linked again: without the kernels and headers as dependencies, `build_ext
    # --inplace` would keep a stale module after a kernel-only or header-only change.
    headers = sorted(glob.glob("csrc/*.h") + glob.glob("csrc/*/*.cuh"))
    return [Extension(EXTENSION, sources=sources, depends=[*kernels, *headers], language="c++")]


if __name__ == "__main__":
    if cuda_build_mode() == "required" and find_nvcc() is None:
        sys.exit("MINILIN_CUDA=1 but nvcc was not found: put it on PATH or set CUDA_HOME")
    setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
