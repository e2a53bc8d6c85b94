"""Build script: the pure-Python package always; the CUDA extension `minilin._cuda` where it can run.

    pip install -e .                                   builds the extension when a GPU is visible and nvcc is found
    MINILIN_CUDA=0 pip install -e .                    never builds it (pure Python)
    MINILIN_CUDA=1 pip install -e .                    always builds it, GPU or not (CI compiles it on a machine
                                                       without one); no nvcc or a failed build is an error
    MINILIN_CUDA_ARCH="80;90a" pip install -e .        targets (default "90a": sm_90a code + compute_90 PTX)

What was decided is said in one line on stderr ("minilin: building the CUDA extension for ..." or "minilin:
no GPU visible, skipping the CUDA extension; ..."), which pip shows with -v, and recorded in
minilin/_build.json, which `minilin doctor` shows.

The extension: nvcc compiles csrc/**/*.cu to objects (in parallel), the host compiler compiles the pybind11
bindings (csrc/bindings.cpp, csrc/registry.cpp; no CUDA or CuPy headers needed), and the link adds the
static CUDA runtime, so the module needs no libcudart on the library path at import time. Every object is
cached in build/minilin-objects/ under a key of its source, the headers it includes and the compiler's
command and version, so installing again (an editable reinstall included: pip builds in a fresh temporary
folder each time) recompiles only what changed, and then only links.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
EXTENSION = "minilin._cuda"


# ---- configuration from the environment (tests/test_cuda_build.py imports these) -----------------------
def cuda_build_mode(environ=os.environ) -> str:
    """'off' (MINILIN_CUDA=0), 'required' (MINILIN_CUDA=1) or 'auto' (unset: build when a GPU is visible and nvcc
    is found)."""
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
    Default "90a": sm_90a code, which H100 and H200 run and which the wgmma versions (linear v10, delta v10 and
    v12) need, plus compute_90 PTX. mma.sync bf16 and cp.async need >= 80.
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


def _cuda_visible_indices(value: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES as the CUDA runtime reads it: the entries (an index, or a GPU-/MIG- UUID) up to the
    first invalid one; [] ("", "-1", "NoDevFiles") hides every GPU."""
    entries = []
    for item in value.split(","):
        item = item.strip()
        if not (item.isdigit() or item.startswith(("GPU-", "MIG-"))):
            break
        entries.append(item)
    return entries


NVIDIA_SMI_PLACES = ("/usr/lib/wsl/lib/nvidia-smi",)  # WSL keeps it outside PATH


def visible_gpus(environ=os.environ, dev_dir: str = "/dev", run=subprocess.run) -> tuple[list[str], str]:
    """The NVIDIA GPUs this machine shows, as (names, how they were found); ([], why none) when there are none.

    No CUDA library is loaded and nothing is imported (the build needs neither): CUDA_VISIBLE_DEVICES set to
    nothing usable ("", "-1") hides every GPU, as it does for CUDA; else `nvidia-smi -L` lists the GPUs by
    name (filtered by CUDA_VISIBLE_DEVICES' indices); else the driver's device files /dev/nvidia0, ... say
    that there are GPUs (a container may have those without nvidia-smi).
    """
    value = environ.get("CUDA_VISIBLE_DEVICES")
    indices = None if value is None else _cuda_visible_indices(value)
    if indices == []:
        return [], f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU"
    smi = shutil.which("nvidia-smi", path=environ.get("PATH")) or next(
        (p for p in NVIDIA_SMI_PLACES if os.path.isfile(p)), None)
    if smi is not None:
        try:
            listed = run([smi, "-L"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            listed = None
        if listed is not None and listed.returncode == 0:
            gpus = re.findall(r"^GPU (\d+): (.+?)(?: \(UUID: [^)]*\))?$", listed.stdout, re.M)
            if indices is not None and all(i.isdigit() for i in indices):
                gpus = [g for g in gpus if g[0] in indices]
            if gpus:
                return [name for _, name in gpus], "nvidia-smi -L"
    devices = sorted(glob.glob(os.path.join(dev_dir, "nvidia[0-9]*")))
    if devices:
        return [f"NVIDIA GPU ({d})" for d in devices], "the driver's device files"
    return [], ("nvidia-smi lists none and " if smi else "no nvidia-smi and ") + f"no {dev_dir}/nvidia[0-9]*"


def build_plan(environ=os.environ, nvcc_finder=None, gpu_finder=None) -> dict:
    """Whether to build the CUDA extension here, and the one line that says so.

    Returns {"build": bool, "line": str, "mode": ..., "gpus": [names], "gpu_probe": how or why not, "arch"}.
    By default (MINILIN_CUDA unset) the extension is built only where it can run: a GPU is visible and nvcc
    is found. Compiling it takes minutes that a machine without a GPU would spend on kernels nobody can run.
    """
    nvcc_finder = nvcc_finder or find_nvcc
    gpu_finder = gpu_finder or visible_gpus
    mode = cuda_build_mode(environ)
    plan = {"mode": mode, "gpus": [], "gpu_probe": None, "arch": None}
    if mode == "off":
        return {**plan, "build": False,
                "line": "minilin: MINILIN_CUDA=0, not building the CUDA extension (pure Python)"}
    gpus, probe = gpu_finder(environ)
    plan.update(gpus=gpus, gpu_probe=probe)
    found = f"GPU found: {', '.join(gpus)}" if gpus else "no GPU visible"
    if mode == "required":
        arch = parse_arch(environ.get("MINILIN_CUDA_ARCH"))[1]
        return {**plan, "build": True, "arch": arch,
                "line": f"minilin: building the CUDA extension for {arch} (MINILIN_CUDA=1; {found})"}
    if not gpus:
        return {**plan, "build": False,
                "line": "minilin: no GPU visible, skipping the CUDA extension; MINILIN_CUDA=1 builds it anyway"}
    if nvcc_finder(environ) is None:
        return {**plan, "build": False,
                "line": f"minilin: {found} but nvcc not found, skipping the CUDA extension (put nvcc on PATH or "
                        f"set CUDA_HOME; MINILIN_CUDA=1 makes this an error)"}
    arch = parse_arch(environ.get("MINILIN_CUDA_ARCH"))[1]
    return {**plan, "build": True, "arch": arch, "line": f"minilin: building the CUDA extension for {arch} ({found})"}


def nvcc_version(nvcc: str) -> tuple[str, str]:
    """(the release, e.g. '13.0.48', and `nvcc --version`'s whole output, which the object cache keys on)."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return (m.group(1) if m else "unknown"), out


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


# ---- the object cache ------------------------------------------------------------------------------------
QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def included_headers(source: str, include_dirs: list[str]) -> list[str]:
    """The headers `source` includes with #include "...", directly or through one another, sorted.

    Each is looked for next to the file that includes it, then in `include_dirs`, as the compilers do. An
    include inside #if is followed too (a key that depends on one header too many only costs a recompile).
    <...> includes (the C++ library, CUDA, pybind11) are not followed: the compiler's version and command
    in the key, and pybind11's version, stand for them.
    """
    found, todo = set(), [source]
    while todo:
        current = todo.pop()
        with open(current, encoding="utf-8", errors="replace") as f:
            names = QUOTED_INCLUDE.findall(f.read())
        for name in names:
            for folder in [os.path.dirname(current), *include_dirs]:
                path = os.path.normpath(os.path.join(folder, name))
                if os.path.isfile(path):
                    if path not in found:
                        found.add(path)
                        todo.append(path)
                    break
    return sorted(found)


def object_key(source: str, headers: list[str], command: list[str]) -> str:
    """sha256 of the command that compiles `source` (compiler, version, flags) and of the source's and each
    included header's path and contents."""
    digest = hashlib.sha256(json.dumps(command).encode())
    for path in [source, *headers]:
        digest.update(b"\0" + path.encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def cached_objects(sources: list[str], command: list[str], compile_to, cache_dir: str, include_dirs: list[str],
                   workers: int = 1) -> tuple[list[str], list[str]]:
    """The object file of each of `sources` (in order), compiling only those not in `cache_dir` already.

    command: what the compile depends on besides the sources (compiler, its version, every flag);
    compile_to(source, object_path) compiles one source into object_path. An object is stored as
    `<source path with _>.<first 24 hex digits of its key>.o`, written to a temporary name first and
    renamed, so a build stopped halfway never leaves a truncated object under a valid key; the older objects
    of a source that changed are removed. Returns (objects, the sources that were compiled).
    """
    os.makedirs(cache_dir, exist_ok=True)
    compiled, lock = [], threading.Lock()

    def one(source: str) -> str:
        key = object_key(source, included_headers(source, include_dirs), command)[:24]
        stem = source.replace("/", "_").replace(os.sep, "_")
        path = os.path.join(cache_dir, f"{stem}.{key}.o")
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            return path
        partial = os.path.join(cache_dir, f"{stem}.partial-{os.getpid()}-{threading.get_ident()}.o")
        try:
            compile_to(source, partial)
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
        stale = re.compile(re.escape(stem) + r"\.[0-9a-f]{24}\.o")
        for name in os.listdir(cache_dir):
            if stale.fullmatch(name) and name != os.path.basename(path):
                os.remove(os.path.join(cache_dir, name))
        with lock:
            compiled.append(source)
        return path

    with ThreadPoolExecutor(max_workers=max(1, min(len(sources), workers))) as pool:
        objects = list(pool.map(one, sources))
    return objects, [s for s in sources if s in compiled]


def host_key_command(compiler: list[str], include_dirs: list[str], macros: list, extra_args: list[str],
                     pybind11_include: str, pybind11_version: str) -> list[str]:
    """What a host object's key holds besides its sources: the compiler (command and version), include folders,
    macros, flags and Python's version. pybind11's headers sit in pip's temporary build environment, a new
    folder on every install, so they are named by pybind11's version instead of by that path."""
    dirs = [f"pybind11 {pybind11_version}" if d == pybind11_include else d for d in include_dirs]
    return [*compiler, *dirs, repr(macros), *extra_args, sys.version]


def nvcc_compile(nvcc: str, flags: list[str]):
    """compile_to(source, obj) for cached_objects: `nvcc <flags> -c source -o obj`, its output kept for errors."""
    def compile_to(source: str, obj: str) -> None:
        cmd = [nvcc, *flags, "-c", source, "-o", obj]
        print(" ".join(cmd), flush=True)
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise CudaBuildError(f"nvcc failed on {source}:\n{result.stdout}{result.stderr}")
    return compile_to


# ---- the build -------------------------------------------------------------------------------------------
class CudaBuildError(RuntimeError):
    pass


OBJECT_CACHE = os.path.join(HERE, "build", "minilin-objects")
BUILD_RECORD = "_build.json"  # in the package: what the last build decided, for `minilin doctor`


class BuildExt(build_ext):
    """build_ext that decides whether to build the CUDA extension (build_plan), says so in one line, compiles
    the .cu sources with nvcc and the host sources itself (both through the object cache), then lets
    setuptools link.

    Unless MINILIN_CUDA=1, a failed CUDA build is a warning: the extension is dropped (so nothing later
    looks for its file) and the package installs as pure Python.
    """

    def run(self):
        plan = build_plan()
        print(plan["line"], file=sys.stderr, flush=True)
        self.record = {**plan, "built": False}
        if not plan["build"]:
            self.extensions = [ext for ext in self.extensions if ext.name != EXTENSION]
        super().run()
        self.record["built"] = any(ext.name == EXTENSION for ext in self.extensions)
        self._write_record()

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
                self.record["error"] = str(error)[:2000]
                failed.append(ext)
        for ext in failed:
            self.extensions.remove(ext)

    def _write_record(self):
        """minilin/_build.json beside the package's modules: in the source tree for an editable install (where
        the extension is copied too), else in the build folder that becomes the wheel."""
        if self.inplace:
            folder = self.get_finalized_command("build_py").get_package_dir("minilin")
        else:
            folder = os.path.join(self.build_lib, "minilin")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, BUILD_RECORD), "w") as f:
            json.dump(self.record, f, indent=2)
            f.write("\n")

    def _build_cuda(self, ext):
        nvcc = find_nvcc()
        if nvcc is None:
            raise CudaBuildError("nvcc not found (put it on PATH or set CUDA_HOME)")
        try:
            import pybind11
        except ImportError as error:
            raise CudaBuildError("pybind11 is not installed (pip install pybind11)") from error
        gencode, arch_summary = parse_arch(os.environ.get("MINILIN_CUDA_ARCH"))
        version, version_text = nvcc_version(nvcc)
        cu_sources = [s for s in ext.sources if s.endswith(".cu")]
        host_sources = [s for s in ext.sources if not s.endswith(".cu")]
        sm90a = [("MINILIN_SM90A", "1")] if builds_sm90a(arch_summary) else []
        flags = ["-std=c++17", "-O3", "-lineinfo", "-Xcompiler", "-fPIC", *gencode, *(f"-D{k}={v}" for k, v in sm90a)]
        workers = os.cpu_count() or 1
        cu_objects, cu_compiled = cached_objects(cu_sources, [nvcc, version_text, *flags], nvcc_compile(nvcc, flags),
                                                 OBJECT_CACHE, ["csrc"], workers)

        # The host sources, compiled here rather than by setuptools, which would compile them again into its
        # fresh temporary folder on every install.
        include_dirs = [*ext.include_dirs, pybind11.get_include(), "csrc"]
        macros = [*ext.define_macros, *sm90a, ("MINILIN_CUDA_ARCH", f'"{arch_summary}"'),
                  ("MINILIN_NVCC_VERSION", f'"{version}"')]
        extra_args = [*ext.extra_compile_args, "-std=c++17", "-O2", "-fvisibility=hidden"]
        compiler = self.compiler

        def host_compile(source, obj):
            staging = tempfile.mkdtemp(dir=OBJECT_CACHE)
            try:
                (out,) = compiler.compile([source], output_dir=staging, macros=macros, include_dirs=include_dirs,
                                          debug=self.debug, extra_postargs=extra_args)
                os.replace(out, obj)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

        cxx_version = subprocess.run([compiler.compiler_so[0], "--version"], capture_output=True, text=True).stdout
        host_command = host_key_command([*compiler.compiler_so, cxx_version], [*compiler.include_dirs, *include_dirs],
                                        macros, extra_args, pybind11.get_include(), pybind11.__version__)
        host_objects, host_compiled = cached_objects(host_sources, host_command, host_compile, OBJECT_CACHE,
                                                     include_dirs, workers)
        total, compiled = len(cu_sources) + len(host_sources), len(cu_compiled) + len(host_compiled)
        print(f"minilin: {compiled} of {total} objects compiled, {total - compiled} reused from "
              f"{os.path.relpath(OBJECT_CACHE, HERE)}/", file=sys.stderr, flush=True)
        self.record["objects"] = {"compiled": cu_compiled + host_compiled, "reused": total - compiled}

        ext.sources = []  # every object is compiled: setuptools only links
        ext.extra_objects = [*ext.extra_objects, *cu_objects, *host_objects]
        ext.library_dirs = [*ext.library_dirs, *cuda_library_dirs(nvcc)]
        ext.libraries = [*ext.libraries, "cudart_static", "rt", "pthread", "dl"]
        # Linked every time (a second or so): the module's date says nothing about which cached objects it holds.
        force, self.force = self.force, True
        try:
            super().build_extension(ext)
        finally:
            self.force = force


def extensions() -> list[Extension]:
    """The CUDA extension, declared always: BuildExt decides whether it is built (build_plan) and says so."""
    os.chdir(HERE)  # sources are given relative to the project root
    kernels = sorted(glob.glob("csrc/*/*.cu"))
    if not kernels:  # a source tree without csrc/ (nothing to build)
        return []
    sources = ["csrc/bindings.cpp", "csrc/registry.cpp", *kernels]
    # The module is linked on every build from cached objects; `depends` still lists every kernel and header
    # for tools that read it.
    headers = sorted(glob.glob("csrc/*.h") + glob.glob("csrc/*/*.cuh"))
    return [Extension(EXTENSION, sources=sources, depends=[*kernels, *headers], language="c++")]


if __name__ == "__main__":
    if cuda_build_mode() == "required" and find_nvcc() is None:
        sys.exit("MINILIN_CUDA=1 but nvcc was not found: put it on PATH or set CUDA_HOME")
    setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
