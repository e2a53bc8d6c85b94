"""`minilin tour`: the whole quick tour runs end to end with a counted line per experiment, one experiment can be
picked, and --plots without matplotlib is refused on stderr before anything runs."""
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
    headings = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert headings == [f"[{i}/{len(EXPERIMENTS)}] {e.name}: {e.title}" for i, e in enumerate(EXPERIMENTS, 1)]
    for e in EXPERIMENTS:
        assert e.claim in result.stdout
    assert f"minilin tour: {len(EXPERIMENTS)} experiment(s), quick sizes" in result.stdout


def test_plots_without_matplotlib_are_an_error_before_anything_runs(monkeypatch, capsys, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # `import matplotlib` now raises ImportError
    import dataclasses

    from minilin import experiments

    ran = []
    monkeypatch.setattr(experiments, "EXPERIMENTS",
                        [dataclasses.replace(e, run=lambda quick: ran.append(quick)) for e in EXPERIMENTS])
    plots = tmp_path / "plots"
    status = cli.main(["tour", "fact_update", "--quick", "--plots", str(plots)])
    out, err = capsys.readouterr()
    assert status == 2
    assert "needs matplotlib" in err and "pip install matplotlib" in err and '".[plot]"' in err
    assert out == "" and ran == []                            # refused before any experiment ran
    assert not plots.exists()


def test_the_heading_says_how_far_the_tour_is(capsys):
    assert cli.main(["tour", "fact_update", "state_tracking", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "[1/2] fact_update: Updating a fact" in out.splitlines()
    assert "[2/2] state_tracking: State tracking: parity" in out.splitlines()
    assert out.index("[1/2]") < out.index("[2/2]")


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


def test_list_takes_the_named_experiments_and_refuses_unknown_ones(capsys):
    assert cli.main(["tour", "--list", "capacity", "write_rules"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["capacity", "write_rules"]
    assert cli.main(["tour", "--list", "capacity", "nosuch"]) == 2
    assert "unknown experiment(s) ['nosuch']" in capsys.readouterr().err


def test_an_empty_plots_directory_is_refused(capsys):
    assert cli.main(["tour", "exactness", "--plots", ""]) == 2
    assert "--plots: expected a directory, got ''" in capsys.readouterr().err


def test_the_hybrids_recall_is_checked_too():
    """The claim names the hybrid; a hybrid at 5% is reported as not reproduced."""
    from minilin.experiments import trained_recall

    records = [{"mixer": m, "accuracy": a} for m, a in [("attention", 1.0), ("linear_attention", 0.24),
                                                        ("gated_deltanet", 1.0), ("gated_deltanet+attention", 0.05)]]
    hybrid = [c for c in trained_recall.checks({"records": records}) if "hybrid" in c["claim"]]
    assert len(hybrid) == 1 and not hybrid[0]["reproduced"] and hybrid[0]["measured"] == "gated_deltanet+attention 5%"
