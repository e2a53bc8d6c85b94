"""`minilin doctor`: what was found for the CUDA side, and how to get what is missing.

    minilin doctor            nvcc, CuPy, the GPU, the extension (built? for which arch? what did the install
                              decide?), optional baselines
    minilin doctor --json     the same as JSON

Runs anywhere: on a machine without nvcc, CuPy or a GPU it says so and what to install; it never fails
because something is missing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

INSTALL_CUPY = "pip install -e '.[cuda]'   (CuPy for CUDA 13: cupy-cuda13x)"
BUILD_EXTENSION = ("pip install -e .   (builds it where a GPU is visible and nvcc is on PATH or CUDA_HOME is set; "
                   "MINILIN_CUDA=1 pip install -e . builds it anyway; see README)")
BUILD_RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build.json")


def register(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="what was found for the CUDA side (nvcc, CuPy, GPU, extension)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(func=main)


def find_nvcc() -> dict:
    """nvcc's path and release, looked up like setup.py does (CUDA_HOME, CUDA_PATH, then PATH)."""
    path = None
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            path = os.path.join(home, "bin", "nvcc")
            break
    path = path or shutil.which("nvcc")
    if path is None:
        return {"found": False}
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return {"found": True, "path": path, "version": None, "error": str(error)}
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return {"found": True, "path": path, "version": m.group(2) if m else None}


def find_cupy() -> dict:
    try:
        import cupy
    except Exception as error:  # noqa: BLE001 - ImportError, or a broken install raising anything
        return {"found": False, "error": str(error)}
    info = {"found": True, "version": cupy.__version__}
    from .cuda.bf16 import native_dtype

    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # noqa: BLE001 - no driver: CUDARuntimeError
        return {**info, "gpus": [], "error": f"CuPy sees no GPU: {error}"}
    gpus = []
    for i in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        gpus.append({"index": i, "name": name, "compute_capability": f"{props['major']}.{props['minor']}",
                     "memory_gib": round(props["totalGlobalMem"] / 2**30, 1)})
    info["gpus"] = gpus
    info["bfloat16_dtype"] = str(native_dtype()) if gpus and native_dtype() is not None else None
    return info


def find_gpu_without_cupy() -> list[dict]:
    """GPUs as nvidia-smi reports them, for when CuPy is missing."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for i, line in enumerate(out.stdout.strip().splitlines()):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2:
            gpus.append({"index": i, "name": parts[0], "compute_capability": parts[1]})
    return gpus


def find_extension() -> dict:
    try:
        from . import _cuda
    except ImportError as error:
        return {"built": False, "error": str(error)}
    return {"built": True, "file": _cuda.__file__, "arch": _cuda.cuda_arch, "nvcc": _cuda.nvcc_version,
            "versions": [f"{v['op']} v{v['version']} {v['name']}" for v in _cuda.versions()]}


def find_build_record() -> dict | None:
    """What the last `pip install` of this package decided about the CUDA extension (setup.py writes
    minilin/_build.json: the line it printed, whether it built, the objects it compiled); None without one."""
    try:
        with open(BUILD_RECORD) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("line"), str) else None


def find_optional(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:  # noqa: BLE001 - an optional baseline may fail to import in many ways
        return None
    return getattr(module, "__version__", "unknown version")


def arch_runs_on(arch: str, capability: str) -> bool:
    """Whether code built for `arch` ('sm_90,compute_90') runs on a GPU of compute capability '9.0':
    machine code for exactly that capability, or PTX for one at or below it (the driver compiles it)."""
    cc = capability.replace(".", "")
    for item in arch.split(","):
        kind, _, target = item.partition("_")
        target_cc = re.sub(r"[a-z]$", "", target)
        if kind == "sm" and target_cc == cc:  # sm_90a is 9.0 machine code too
            return True
        if kind == "compute" and target_cc.isdigit() and cc.isdigit() and int(target_cc) <= int(cc) \
                and not target.endswith("a"):
            return True
    return False


def diagnose() -> dict:
    findings = {"nvcc": find_nvcc(), "cupy": find_cupy(), "extension": find_extension(), "install": find_build_record(),
                "torch": find_optional("torch"), "fla": find_optional("fla")}
    gpus = findings["cupy"].get("gpus") or find_gpu_without_cupy()
    findings["gpus"] = gpus
    todo = []
    if not findings["extension"]["built"]:
        todo.append("build the extension: " + BUILD_EXTENSION if findings["nvcc"]["found"] else
                    "install the CUDA toolkit (nvcc 12.x or 13.x), then " + BUILD_EXTENSION)
    if not findings["cupy"]["found"]:
        todo.append("install CuPy: " + INSTALL_CUPY)
    if not gpus:
        todo.append("run on a machine with an NVIDIA GPU of compute capability 8.0+ (the kernels need cp.async "
                    "and bf16 tensor cores); everything else works on NumPy without one")
    elif findings["extension"]["built"]:
        for gpu in gpus:
            if not arch_runs_on(findings["extension"]["arch"], gpu["compute_capability"]):
                cc = gpu["compute_capability"].replace(".", "")
                todo.append(f"the extension was built for {findings['extension']['arch']}, which does not run on "
                            f"{gpu['name']} ({gpu['compute_capability']}): rebuild with MINILIN_CUDA_ARCH={cc} "
                            f"pip install -e .")
    findings["todo"] = todo
    return findings


def format_report(f: dict) -> str:
    lines = ["minilin doctor: the CUDA side"]
    nvcc = f["nvcc"]
    lines.append(f"  nvcc       {nvcc['path']} (release {nvcc.get('version')})" if nvcc["found"] else
                 "  nvcc       not found (needed only to build the extension)")
    cupy = f["cupy"]
    if cupy["found"]:
        bf = cupy.get("bfloat16_dtype")
        lines.append(f"  CuPy       {cupy['version']}; bfloat16 dtype: "
                     f"{bf if bf else 'none (minilin.cuda holds bf16 as uint16 bits: to_bf16 / from_bf16)'}")
    else:
        lines.append("  CuPy       not installed")
    if f["gpus"]:
        for gpu in f["gpus"]:
            lines.append(f"  GPU {gpu['index']}      {gpu['name']}, compute capability {gpu['compute_capability']}")
    else:
        lines.append("  GPU        none found")
    ext = f["extension"]
    if ext["built"]:
        lines.append(f"  extension  built for {ext['arch']} with nvcc {ext['nvcc']}: {ext['file']}")
        lines.append(f"             kernels: {', '.join(ext['versions'])}")
    else:
        lines.append("  extension  not built (minilin._cuda)")
    install = f["install"]
    if install:
        lines.append(f"  install    {install['line']}")
        if install.get("error"):
            lines.append(f"             and it failed: {install['error'].splitlines()[0][:300]}")
    else:
        lines.append("  install    no record of a `pip install` of this checkout (setup.py writes minilin/_build.json)")
    lines.append(f"  baselines  torch: {f['torch'] or 'not installed'}; flash-linear-attention (fla): "
                 f"{f['fla'] or 'not installed (optional)'}")
    if f["todo"]:
        lines.append("To get the rest:")
        lines += [f"  - {item}" for item in f["todo"]]
    else:
        lines.append("Everything is in place: `minilin bench` times the kernels, `pytest tests/test_cuda*.py` checks them.")
    return "\n".join(lines)


def main(args) -> int:
    findings = diagnose()
    print(json.dumps(findings, indent=2) if getattr(args, "json", False) else format_report(findings))
    return 0
