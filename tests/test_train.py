"""minilin.train: the MQAR generator (valid, deterministic, held-out apart), bad input, checkpoints that
resume a run exactly, and a short run that learns."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from minilin import cli
from minilin.nn import IGNORE
from minilin.train.loop import Run, load_checkpoint, state_bytes, train
from minilin.train.mqar import MQAR, batch, held_out


def test_mqar_examples_are_what_the_task_says():
    task = MQAR(vocab=40, seq_len=30, num_kv_pairs=6)
    tokens, targets = batch(task, 3, 16, seed=1)
    assert tokens.shape == targets.shape == (16, 30)
    for x, y in zip(tokens, targets):
        keys, values = x[0:12:2], x[1:12:2]
        assert len(set(keys)) == 6 and keys.min() >= 1 and keys.max() < 20 and values.min() >= 20
        asked = np.flatnonzero(y != IGNORE)
        assert len(asked) == 6 and asked.min() >= 12, "each key is queried once, after the context"
        assert sorted(x[asked]) == sorted(keys)
        for position in asked:
            assert y[position] == values[list(keys).index(x[position])]
        assert not x[12:][y[12:] == IGNORE].any(), "the query section is blank but for the queries"


def test_mqar_batches_are_a_function_of_seed_and_index():
    task = MQAR()
    a, b = batch(task, 5, 8, seed=2), batch(task, 5, 8, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(batch(task, 6, 8, seed=2)[0], a[0])
    assert not np.array_equal(held_out(task, 8, seed=2)[0], a[0])


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab=16, num_kv_pairs=8), "num_kv_pairs: expected at most vocab / 2 - 1 = 7"),
    (dict(seq_len=20, num_kv_pairs=8), "seq_len: expected at least 3 \\* num_kv_pairs = 24"),
    (dict(vocab=0), "vocab: expected a positive integer"),
])
def test_mqar_sizes_that_cannot_form_an_example(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MQAR(**kwargs)


def test_run_refuses_unknown_mixers_and_odd_widths():
    with pytest.raises(ValueError, match="mixer: expected one of .* got 'mamba3'"):
        Run(mixers=["mamba3"])
    with pytest.raises(ValueError, match="mixer: expected one of .*the causal mixers.* got 'linformer'"):
        Run(mixers=["linformer"])
    with pytest.raises(ValueError, match="d_model: expected a multiple of heads = 3, got 64"):
        Run(heads=3)


def test_state_bytes():
    task = MQAR(seq_len=64, num_kv_pairs=8)
    assert state_bytes(Run(mixers=["gated_deltanet"] * 2, d_model=64, heads=2, task=task)) == 2 * 2 * 32 * 32 * 4
    assert state_bytes(Run(mixers=["attention"], d_model=64, heads=2, task=task)) == 64 * 2 * (32 + 32) * 4


def tiny_run(**kwargs):
    defaults = dict(mixers=["gated_deltanet", "attention"], d_model=16, heads=2, task=MQAR(vocab=16, seq_len=16,
                    num_kv_pairs=3), steps=6, batch_size=4, eval_size=8, eval_every=2, chunk_size=8, warmup=2)
    defaults.update(kwargs)
    return Run(**defaults)


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    run = tiny_run()
    straight = train(run, progress=False)
    path = str(tmp_path / "ckpt.npz")
    train(run, checkpoint=path, checkpoint_every=2, progress=False, stop_after=3)   # interrupted after step 3
    step, _ = load_checkpoint(path, run, run.model(), __import__("minilin.nn", fromlist=["AdamW"]).AdamW(run.model()))
    assert step == 3
    resumed = train(run, checkpoint=path, checkpoint_every=2, progress=False)
    assert resumed["steps"] == straight["steps"] == 6
    assert resumed["loss"] == straight["loss"] and resumed["accuracy"] == straight["accuracy"]
    assert resumed["history"] == straight["history"]


def test_a_short_run_learns():
    """60 steps of a two-block model (Gated DeltaNet, attention) on 3 pairs: the training loss falls well below its
    start (about ln 8, 8 values to choose from) and the held-out accuracy reaches twice chance (1 / 8). Seeded, so
    the numbers repeat; measured 2.09 -> 1.57 and 0.34 on the development machine."""
    run = tiny_run(steps=60, batch_size=16, eval_size=32, eval_every=10, warmup=5, lr=1e-2)
    history = train(run, progress=False)["history"]
    (_, first_loss, _), (_, last_loss, last_accuracy) = history[0], history[-1]
    assert last_loss < first_loss - 0.25, history
    assert last_accuracy >= 2 / 8, history


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path):
    path = str(tmp_path / "ckpt.npz")
    train(tiny_run(), checkpoint=path, progress=False, stop_after=2)
    with pytest.raises(ValueError, match=r"checkpoint .*another configuration \(d_model = 16 there, 32 here\)"):
        train(tiny_run(d_model=32), checkpoint=path, progress=False)


@pytest.fixture
def one_thread(monkeypatch):
    """Run `minilin train` in this process: with one BLAS thread and the malloc thresholds asked for, it does not
    re-run itself."""
    from minilin.threads import compute_environment

    for name, value in compute_environment().items():
        monkeypatch.setenv(name, value)


def test_cli_writes_json(tmp_path, capsys, one_thread):
    path = tmp_path / "runs.json"
    code = cli.main(["train", "mqar", "--mixers", "attention", "--widths", "16", "--kv-pairs", "2", "--steps", "3",
                     "--seq-len", "12", "--vocab", "12", "--batch-size", "4", "--json", str(path)])
    assert code == 0
    runs = json.loads(path.read_text())["runs"]
    assert [r["mixer"] for r in runs] == ["attention"]
    assert {"mixer", "d_model", "num_kv_pairs", "state_bytes", "steps", "seconds", "loss", "accuracy"} <= set(runs[0])
    assert "| attention | 16 | 2 |" in capsys.readouterr().out


def test_cli_re_runs_itself_with_one_blas_thread(tmp_path, monkeypatch, capfd):
    """Started with BLAS threads unset, the command runs in a child Python with every thread variable at 1."""
    from minilin.threads import THREAD_VARIABLES

    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "runs.json"
    code = cli.main(["train", "mqar", "--mixers", "attention", "--widths", "16", "--kv-pairs", "2", "--steps", "2",
                     "--seq-len", "12", "--vocab", "12", "--batch-size", "4", "--json", str(path)])
    assert code == 0 and json.loads(path.read_text())["runs"][0]["steps"] == 2
    assert "| attention | 16 | 2 |" in capfd.readouterr().out


def test_cli_refuses_bad_sizes(capsys, one_thread):
    assert cli.main(["train", "mqar", "--kv-pairs", "40", "--vocab", "64", "--steps", "1"]) == 2
    assert "num_kv_pairs: expected at most vocab / 2 - 1" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(clip=-1.0), ValueError, "clip: expected a finite number > 0, got -1.0"),
    (dict(lr=float("nan")), ValueError, "lr: expected a finite number > 0, got nan"),
    (dict(weight_decay=-0.1), ValueError, "weight_decay: expected a finite number >= 0"),
    (dict(warmup=-5), ValueError, "warmup: expected a non-negative integer, got -5"),
    (dict(warmup=1.5), TypeError, "warmup: expected a non-negative integer, got 1.5"),
    (dict(mixers=[]), ValueError, "mixers: expected at least one mixer"),
])
def test_run_refuses_settings_that_would_train_wrong(kwargs, error, message):
    """A negative clip flipped every gradient (training climbed the loss: 2.3 -> 8.7 in 60 steps), lr = nan failed a
    step later naming q, and warmup's message reported warmup + 1."""
    with pytest.raises(error, match=re.escape(message)):
        tiny_run(**kwargs)


def test_clipping_refuses_a_bad_bound_and_a_non_finite_norm():
    from minilin import nn

    model = tiny_run().model()
    with pytest.raises(ValueError, match="clip: expected a finite number > 0"):
        nn.clip_grad_norm(model, 0.0)
    next(g for _, _, g in model.named_params())[...] = np.nan
    with pytest.raises(ValueError, match="gradients: expected a finite global norm, got nan"):
        nn.clip_grad_norm(model, 1.0)


def test_cli_zeros_are_refused_not_replaced_by_the_defaults(capsys, one_thread):
    for flag in ("--steps", "--batch-size", "--seq-len", "--vocab", "--layers"):
        code = cli.main(["train", "mqar", "--mixers", "attention", "--widths", "16", "--kv-pairs", "2", flag, "0"])
        assert code == 2, flag
        assert "expected" in capsys.readouterr().err, flag
