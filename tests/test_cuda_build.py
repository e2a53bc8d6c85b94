"""setup.py's CUDA build: the configuration (MINILIN_CUDA, MINILIN_CUDA_ARCH, finding nvcc and a GPU) and the object
cache, with a stand-in compiler; nothing here compiles a kernel."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_module_():
    spec = importlib.util.spec_from_file_location("minilin_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    cwd = os.getcwd()
    try:
        spec.loader.exec_module(module)  # __name__ is not "__main__": setup() does not run
    finally:
        os.chdir(cwd)
    return module


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("", "auto"), ("0", "off"), ("off", "off"), ("1", "required"),
                                         ("yes", "required")])
def test_build_mode_from_environment(setup_module_, value, mode):
    env = {} if value is None else {"MINILIN_CUDA": value}
    assert setup_module_.cuda_build_mode(env) == mode


def test_unknown_build_mode_is_an_error(setup_module_):
    with pytest.raises(ValueError, match="MINILIN_CUDA: expected 0, 1 or unset, got 'maybe'"):
        setup_module_.cuda_build_mode({"MINILIN_CUDA": "maybe"})


def test_default_arch_is_sm90a_code_plus_compute90_ptx(setup_module_):
    flags, summary = setup_module_.parse_arch(None)
    assert flags == ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=compute_90"]
    assert summary == "sm_90a,compute_90"
    assert setup_module_.builds_sm90a(summary)


@pytest.mark.parametrize("spec, summary, sm90a", [("80;90", "sm_80,sm_90,compute_90", False),
                                                  ("8.0, 9.0", "sm_80,sm_90,compute_90", False),
                                                  ("sm_90a", "sm_90a,compute_90", True),
                                                  ("80;90a", "sm_80,sm_90a,compute_90", True),
                                                  ("86", "sm_86,compute_86", False)])
def test_arch_lists(setup_module_, spec, summary, sm90a):
    assert setup_module_.parse_arch(spec)[1] == summary
    assert setup_module_.builds_sm90a(summary) is sm90a


def test_90_and_90a_together_is_an_error(setup_module_):
    # Both are 9.0 machine code: which one the driver loads is not ours to choose, and the sm_90 copy of a
    # wgmma version only traps.
    with pytest.raises(ValueError, match=r"MINILIN_CUDA_ARCH: 90 and 90a both give compute capability 9\.0"):
        setup_module_.parse_arch("90;90a")


@pytest.mark.parametrize("spec", ["75", "hopper", "9"])
def test_bad_arch_is_an_error(setup_module_, spec):
    with pytest.raises(ValueError, match="MINILIN_CUDA_ARCH"):
        setup_module_.parse_arch(spec)


def _no_gpu(environ):
    return [], "no nvidia-smi and no /dev/nvidia[0-9]*"


def _one_gpu(environ):
    return ["NVIDIA H200"], "nvidia-smi -L"


@pytest.mark.parametrize("env, gpu, nvcc, build, line", [
    ({}, _no_gpu, "/usr/bin/nvcc", False,
     "minilin: no GPU visible, skipping the CUDA extension; MINILIN_CUDA=1 builds it anyway"),
    ({}, _one_gpu, "/usr/bin/nvcc", True, "minilin: building the CUDA extension for sm_90a,compute_90 (GPU found: NVIDIA H200)"),
    ({}, _one_gpu, None, False, "minilin: GPU found: NVIDIA H200 but nvcc not found, skipping the CUDA extension"),
    ({"MINILIN_CUDA": "1"}, _no_gpu, "/usr/bin/nvcc", True,
     "minilin: building the CUDA extension for sm_90a,compute_90 (MINILIN_CUDA=1; no GPU visible)"),
    ({"MINILIN_CUDA": "1", "MINILIN_CUDA_ARCH": "80"}, _one_gpu, "/usr/bin/nvcc", True,
     "minilin: building the CUDA extension for sm_80,compute_80 (MINILIN_CUDA=1; GPU found: NVIDIA H200)"),
    ({"MINILIN_CUDA": "0"}, _one_gpu, "/usr/bin/nvcc", False, "minilin: MINILIN_CUDA=0, not building the CUDA extension"),
])
def test_build_plan_builds_by_default_only_where_a_gpu_is_visible(setup_module_, env, gpu, nvcc, build, line):
    plan = setup_module_.build_plan(env, nvcc_finder=lambda environ: nvcc, gpu_finder=gpu)
    assert plan["build"] is build
    assert plan["line"].startswith(line), plan["line"]
    assert "\n" not in plan["line"]


def _fake_tool(folder, name, script="exit 0"):
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


SMI_LIST = ("GPU 0: NVIDIA H200 (UUID: GPU-11111111-2222-3333-4444-555555555555)\n"
            "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)\n")


def test_visible_gpus_from_nvidia_smi_filtered_by_cuda_visible_devices(setup_module_, tmp_path):
    _fake_tool(tmp_path, "nvidia-smi")
    listed = subprocess.CompletedProcess(["nvidia-smi", "-L"], 0, stdout=SMI_LIST, stderr="")
    run = lambda cmd, **kwargs: listed  # noqa: E731
    env = {"PATH": str(tmp_path)}
    empty_dev = tmp_path / "dev"
    empty_dev.mkdir()
    probe = setup_module_.visible_gpus
    assert probe(env, str(empty_dev), run) == (["NVIDIA H200", "NVIDIA H100 80GB HBM3"], "nvidia-smi -L")
    assert probe({**env, "CUDA_VISIBLE_DEVICES": "1"}, str(empty_dev), run)[0] == ["NVIDIA H100 80GB HBM3"]
    for hidden in ("", "-1", "NoDevFiles"):
        gpus, why = probe({**env, "CUDA_VISIBLE_DEVICES": hidden}, str(empty_dev), run)
        assert gpus == [] and "hides every GPU" in why


def test_visible_gpus_from_device_files_or_none(setup_module_, tmp_path):
    _fake_tool(tmp_path, "nvidia-smi", "exit 9")
    failing = lambda cmd, **kwargs: subprocess.CompletedProcess(cmd, 9, stdout="", stderr="NVIDIA-SMI has failed")  # noqa: E731
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").write_text("")     # the control device alone is no GPU
    gpus, why = setup_module_.visible_gpus({"PATH": str(tmp_path)}, str(dev), failing)
    assert gpus == [] and "nvidia-smi lists none" in why
    (dev / "nvidia0").write_text("")
    assert setup_module_.visible_gpus({"PATH": str(tmp_path)}, str(dev), failing)[0] == [f"NVIDIA GPU ({dev}/nvidia0)"]
    nothing = tmp_path / "empty"
    nothing.mkdir()
    gpus, why = setup_module_.visible_gpus({"PATH": str(nothing)}, str(nothing), failing)
    assert gpus == [] and why.startswith("no nvidia-smi")


def test_visible_gpus_on_this_machine_runs_quickly(setup_module_):
    import time

    start = time.perf_counter()
    gpus, how = setup_module_.visible_gpus()
    assert isinstance(gpus, list) and how
    assert time.perf_counter() - start < 25


FAKE_NVCC = """#!{python}
# A stand-in for nvcc: writes an object naming its source and flags, logs the call, fails on a marker.
import sys
args = sys.argv[1:]
source, out = args[args.index("-c") + 1], args[args.index("-o") + 1]
open({log!r}, "a").write(source + "\\n")
if "BREAK" in open(source).read():
    sys.stderr.write(source + "(1): error: broken\\n")
    sys.exit(1)
open(out, "w").write(" ".join(args))
"""


@pytest.fixture
def fake_project(tmp_path, monkeypatch):
    """A csrc/ tree: a.cu includes ../common/x.cuh, which includes y.cuh; b.cu includes nothing of ours."""
    (tmp_path / "csrc" / "k").mkdir(parents=True)
    (tmp_path / "csrc" / "common").mkdir()
    (tmp_path / "csrc" / "k" / "a.cu").write_text('#include "../common/x.cuh"\n#include <cuda_bf16.h>\nint a;\n')
    (tmp_path / "csrc" / "k" / "b.cu").write_text("int b;\n")
    (tmp_path / "csrc" / "common" / "x.cuh").write_text('#pragma once\n  #  include "y.cuh"\n')
    (tmp_path / "csrc" / "common" / "y.cuh").write_text("#pragma once\nconstexpr int y = 1;\n")
    log = tmp_path / "nvcc.log"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable, log=str(log)))
    nvcc.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    return tmp_path, str(nvcc), log


def test_included_headers_are_followed_through_each_other(setup_module_, fake_project):
    assert setup_module_.included_headers("csrc/k/a.cu", ["csrc"]) == ["csrc/common/x.cuh", "csrc/common/y.cuh"]
    assert setup_module_.included_headers("csrc/k/b.cu", ["csrc"]) == []


def test_a_second_build_compiles_nothing_and_a_change_recompiles_only_what_it_touches(setup_module_, fake_project):
    root, nvcc, log = fake_project
    cache = str(root / "build" / "minilin-objects")
    sources = ["csrc/k/a.cu", "csrc/k/b.cu"]

    def build(flags=("-O3",)):
        before = log.read_text().splitlines() if log.exists() else []
        objects, compiled = setup_module_.cached_objects(sources, [nvcc, "release 13.0", *flags],
                                                         setup_module_.nvcc_compile(nvcc, list(flags)), cache,
                                                         ["csrc"], workers=2)
        calls = log.read_text().splitlines()[len(before):]
        assert sorted(calls) == sorted(compiled)      # the fake compiler ran exactly for what is reported
        assert all(os.path.getsize(o) > 0 for o in objects)
        assert len(os.listdir(cache)) == len(sources)  # one object per source: stale ones are removed
        return objects, compiled

    first, compiled = build()
    assert compiled == sources
    again, compiled = build()
    assert compiled == [] and again == first           # nothing recompiled, the same objects linked
    (root / "csrc" / "common" / "y.cuh").write_text("#pragma once\nconstexpr int y = 2;\n")
    _, compiled = build()
    assert compiled == ["csrc/k/a.cu"]                 # a header two includes deep: only its includer
    (root / "csrc" / "k" / "b.cu").write_text("int b = 1;\n")
    _, compiled = build()
    assert compiled == ["csrc/k/b.cu"]
    _, compiled = build(flags=("-O2",))
    assert compiled == sources                         # new flags: everything
    assert build(flags=("-O2",))[1] == []


def test_a_failed_compile_leaves_no_object_behind(setup_module_, fake_project):
    root, nvcc, log = fake_project
    cache = str(root / "cache")
    (root / "csrc" / "k" / "b.cu").write_text("BREAK\n")
    with pytest.raises(setup_module_.CudaBuildError, match=r"nvcc failed on csrc/k/b\.cu:\n.*error: broken"):
        setup_module_.cached_objects(["csrc/k/b.cu"], [nvcc], setup_module_.nvcc_compile(nvcc, []), cache, ["csrc"])
    assert os.listdir(cache) == []
    (root / "csrc" / "k" / "b.cu").write_text("int b;\n")
    (obj,), compiled = setup_module_.cached_objects(["csrc/k/b.cu"], [nvcc], setup_module_.nvcc_compile(nvcc, []),
                                                    cache, ["csrc"])
    assert compiled == ["csrc/k/b.cu"] and os.listdir(cache) == [os.path.basename(obj)]


def test_host_objects_keep_their_key_across_pips_temporary_build_environments(setup_module_):
    def command(pybind11_include, version="3.1.0", macros=(("MINILIN_SM90A", "1"),)):
        return setup_module_.host_key_command(["g++", "-O2", "g++ 13.2"], ["/usr/include/python3.11", pybind11_include,
                                              "csrc"], list(macros), ["-std=c++17"], pybind11_include, version)

    first = command("/tmp/pip-build-env-abc/overlay/lib/python3.11/site-packages/pybind11/include")
    assert command("/tmp/pip-build-env-xyz/overlay/lib/python3.11/site-packages/pybind11/include") == first
    assert command("/tmp/pip-build-env-xyz/pybind11/include", version="3.2.0") != first
    assert command("/tmp/pip-build-env-xyz/pybind11/include", macros=()) != first


def test_every_quoted_include_of_the_kernels_is_found(setup_module_, monkeypatch):
    # A header the key missed would let a header-only change keep a stale object.
    import re

    monkeypatch.chdir(ROOT)
    for source in ["csrc/bindings.cpp", "csrc/registry.cpp", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("csrc/*/*.cu"))]:
        headers = set(setup_module_.included_headers(source, ["csrc"]))
        for path in [source, *headers]:
            for name in re.findall(r'^\s*#\s*include\s*"([^"]+)"', Path(path).read_text(), re.M):
                assert any(h.endswith(os.path.basename(name)) for h in headers), (source, path, name)


def test_build_ext_says_and_records_what_it_decided(setup_module_, tmp_path, monkeypatch):
    """BuildExt end to end where nothing is compiled: the one line on stderr and minilin/_build.json."""
    import json

    from setuptools import Distribution

    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilin").mkdir()
    monkeypatch.setenv("MINILIN_CUDA", "0")
    ext = setup_module_.Extension(setup_module_.EXTENSION, sources=["csrc/bindings.cpp"])
    dist = Distribution({"name": "minilin", "packages": ["minilin"], "ext_modules": [ext]})
    cmd = setup_module_.BuildExt(dist)
    cmd.inplace = True
    cmd.ensure_finalized()
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        cmd.run()
    assert err.getvalue().splitlines() == ["minilin: MINILIN_CUDA=0, not building the CUDA extension (pure Python)"]
    record = json.loads((tmp_path / "minilin" / "_build.json").read_text())
    assert record["built"] is False and record["line"] == err.getvalue().strip() and record["mode"] == "off"
    assert cmd.extensions == []


def test_required_build_without_nvcc_fails_loudly(tmp_path):
    env = {**os.environ, "MINILIN_CUDA": "1", "PATH": str(tmp_path)}
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    result = subprocess.run([sys.executable, str(ROOT / "setup.py"), "build_ext"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "MINILIN_CUDA=1 but nvcc was not found" in result.stderr


def test_sources_are_every_kernel_file(setup_module_, monkeypatch):
    # Declared always (BuildExt decides whether it is built), so this holds without nvcc too.
    cwd = os.getcwd()
    try:
        (ext,) = setup_module_.extensions()
    finally:
        os.chdir(cwd)
    assert ext.name == "minilin._cuda"
    kernels = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("csrc/*/*.cu"))
    assert [s for s in ext.sources if s.endswith(".cu")] == kernels
    assert {"csrc/bindings.cpp", "csrc/registry.cpp"} <= set(ext.sources)
    # a kernel-only or header-only change must link the module again
    assert set(kernels) | {"csrc/common/mma.cuh", "csrc/linear/chunk_mma_wide.cuh", "csrc/minilin_cuda.h"} <= set(ext.depends)


# The versions built from sm_90a code only (wgmma), listed under MINILIN_SM90A in csrc/registry.cpp.
SM90A_VERSIONS = {"linear": {10}, "delta": {10, 12}}


def test_the_built_extension_lists_the_wgmma_versions_exactly_when_it_holds_sm90a_code():
    # Runs wherever the extension is built, GPU or not (CI compiles it): if MINILIN_SM90A stopped reaching the
    # host compile, these versions would silently drop out of the ladder and every GPU test would pass on the
    # rungs below them (linear v8, delta v9).
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    has_sm90a = "sm_90a" in cuda.cuda_arch.split(",")
    for op, wgmma in SM90A_VERSIONS.items():
        built = {v["version"]: v for v in cuda.versions() if v["op"] == op}
        for number in wgmma:
            assert (number in built) == has_sm90a, (op, cuda.cuda_arch, sorted(built))
            if number in built:
                assert built[number]["min_compute_capability"] == built[number]["max_compute_capability"] == 90
                assert not built[number]["float32"] and built[number]["bfloat16"]
        assert all(v["max_compute_capability"] == 0 for n, v in built.items() if n not in wgmma), op
