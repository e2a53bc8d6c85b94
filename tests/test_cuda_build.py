"""setup.py's CUDA build configuration (MINILIN_CUDA, MINILIN_CUDA_ARCH, finding nvcc), without compiling."""
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


def test_no_nvcc_means_no_extension_unless_required(setup_module_, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert setup_module_.find_nvcc() is None
    monkeypatch.delenv("MINILIN_CUDA", raising=False)
    assert setup_module_.extensions() == []
    monkeypatch.setenv("MINILIN_CUDA", "0")
    assert setup_module_.extensions() == []


def test_required_build_without_nvcc_fails_loudly(tmp_path):
    env = {**os.environ, "MINILIN_CUDA": "1", "PATH": str(tmp_path)}
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    result = subprocess.run([sys.executable, str(ROOT / "setup.py"), "build_ext"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "MINILIN_CUDA=1 but nvcc was not found" in result.stderr


def test_sources_are_every_kernel_file(setup_module_, monkeypatch):
    if setup_module_.find_nvcc() is None:
        pytest.skip("nvcc not on PATH: the extension is not configured")
    monkeypatch.delenv("MINILIN_CUDA", raising=False)
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


def test_the_built_extension_lists_the_wgmma_version_exactly_when_it_holds_sm90a_code():
    # Runs wherever the extension is built, GPU or not (CI compiles it): if MINILIN_SM90A stopped reaching the
    # host compile, v10 would silently drop out of the ladder and every GPU test would pass on v9.
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    delta = {v["version"]: v for v in cuda.versions() if v["op"] == "delta"}
    assert (10 in delta) == ("sm_90a" in cuda.cuda_arch.split(",")), (cuda.cuda_arch, sorted(delta))
    if 10 in delta:
        assert delta[10]["min_compute_capability"] == delta[10]["max_compute_capability"] == 90
        assert not delta[10]["float32"] and delta[10]["bfloat16"]
    assert all(v["max_compute_capability"] == 0 for n, v in delta.items() if n != 10)
