"""`minilin tour`: the whole quick tour runs end to end, one experiment can be picked, and --plots without
matplotlib says how to get it instead of failing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from minilin import cli
from minilin.experiments import EXPERIMENTS


def test_quick_tour_runs_every_experiment_end_to_end():
    result = subprocess.run([sys.executable, "-m", "minilin", "tour", "--quick"], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "MPLBACKEND": "Agg"})
    assert result.returncode == 0, result.stderr[-3000:]
    for i, e in enumerate(EXPERIMENTS, 1):
        assert f"== {i}. {e.title} ({e.name})" in result.stdout
        assert e.claim in result.stdout
    assert f"minilin tour: {len(EXPERIMENTS)} experiment(s), quick sizes" in result.stdout


def test_plots_without_matplotlib_say_how_to_get_it(monkeypatch, capsys, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # `import matplotlib` now raises ImportError
    plots = tmp_path / "plots"
    status = cli.main(["tour", "fact_update", "--quick", "--plots", str(plots)])
    out = capsys.readouterr().out
    assert status == 0
    assert "needs matplotlib" in out and "pip install matplotlib" in out and '".[plot]"' in out
    assert "== 1. Updating a fact (fact_update)" in out      # the table is printed anyway
    assert not plots.exists()


def test_plots_are_written_with_matplotlib(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    status = cli.main(["tour", "fact_update", "write_rules", "--quick", "--plots", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0
    for name in ("fact_update", "write_rules"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
        assert f"plot: {tmp_path / (name + '.png')}" in out


def test_unknown_experiment_is_refused(capsys):
    assert cli.main(["tour", "no_such_experiment"]) == 2
    assert "unknown experiment" in capsys.readouterr().err


def test_list_names_every_experiment(capsys):
    assert cli.main(["tour", "--list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == [e.name for e in EXPERIMENTS]
