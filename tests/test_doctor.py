"""`minilin doctor` runs anywhere (no GPU, no CuPy, no nvcc) and says what it found."""
from __future__ import annotations

import json

import pytest

from minilin import cli, doctor


def test_doctor_reports_every_piece(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for word in ("nvcc", "CuPy", "GPU", "extension", "install", "baselines"):
        assert word in out


def test_doctor_json(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)
    assert {"nvcc", "cupy", "gpus", "extension", "install", "todo"} <= findings.keys()
    assert isinstance(findings["extension"]["built"], bool)


def test_doctor_says_how_to_get_what_is_missing(monkeypatch):
    monkeypatch.setattr(doctor, "find_nvcc", lambda: {"found": False})
    monkeypatch.setattr(doctor, "find_cupy", lambda: {"found": False, "error": "No module named 'cupy'"})
    monkeypatch.setattr(doctor, "find_extension", lambda: {"built": False, "error": "no _cuda"})
    monkeypatch.setattr(doctor, "find_gpu_without_cupy", lambda: [])
    todo = " ".join(doctor.diagnose()["todo"])
    assert "CUDA toolkit" in todo and "MINILIN_CUDA=1 pip install -e ." in todo and "pip install -e '.[cuda]'" in todo


@pytest.mark.parametrize("arch, capability, runs", [
    ("sm_90,compute_90", "9.0", True), ("sm_90,compute_90", "8.0", False), ("sm_80,compute_80", "9.0", True),
    ("sm_80,sm_90,compute_90", "8.0", True), ("sm_90a,compute_90a", "10.0", False), ("sm_90,compute_90", "12.0", True),
    ("sm_90a,compute_90", "9.0", True), ("sm_90a,sm_100,compute_100", "9.0", True)])
def test_arch_runs_on(arch, capability, runs):
    assert doctor.arch_runs_on(arch, capability) is runs


def test_doctor_shows_what_the_install_decided(monkeypatch, tmp_path, capsys):
    record = tmp_path / "_build.json"
    monkeypatch.setattr(doctor, "BUILD_RECORD", str(record))
    assert doctor.find_build_record() is None
    assert "no record of a `pip install`" in doctor.format_report(doctor.diagnose())
    line = "minilin: no GPU visible, skipping the CUDA extension; MINILIN_CUDA=1 builds it anyway"
    record.write_text(json.dumps({"line": line, "build": False, "built": False, "mode": "auto"}))
    assert doctor.find_build_record()["line"] == line
    assert cli.main(["doctor"]) == 0
    assert f"  install    {line}" in capsys.readouterr().out.splitlines()
    record.write_text("{not json")
    assert doctor.find_build_record() is None
