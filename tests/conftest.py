"""Shared test helpers: relative error, sequence slicing, state comparison."""
from __future__ import annotations

import numpy as np
import pytest

from minilin import catalog


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| (CONVENTIONS.md); NaN anywhere gives NaN, which fails every `<` check."""
    return catalog.relative_error(out, ref)


def is_sequence(arg) -> bool:
    """Per-token inputs are [B, T, ...] with ndim >= 3; lower-rank args are per-head parameters."""
    return hasattr(arg, "ndim") and arg.ndim >= 3


def time_slice(args, sl):
    return tuple(a[:, sl] if is_sequence(a) else a for a in args)


def state_err(a, b) -> float:
    """Largest relative error between two states: arrays, tuples of arrays (KV caches) or None."""
    if a is None or b is None:
        assert a is None and b is None, "one state is None and the other is not"
        return 0.0
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        return max((state_err(x, y) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max((state_err(a[key], b[key]) for key in a), default=0.0)
    if not hasattr(a, "shape"):  # a plain number (a position counter)
        assert a == b
        return 0.0
    assert a.shape == b.shape, f"state shapes differ: {a.shape} vs {b.shape}"
    return rel_err(a, b) if np.any(np.asarray(b)) else float(np.abs(np.asarray(a)).max(initial=0.0))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# The shape rules of minilin.cuda.versions() entries (csrc/minilin_cuda.h's ShapeRule), for the fake ladders of
# tests that run without the extension: a token loop's (K <= 256) and a tensor-core version's.
TOKEN_LOOP_SHAPE = {"max_k": 256, "keys": None, "value_multiple": 8}
TENSOR_CORE_SHAPE = {"max_k": 128, "keys": [64, 128], "value_multiple": 64}


def cuda_version_cases(op: str) -> list[tuple[int, str]]:
    """(version, dtype) for every kernel version of `op` that this GPU runs, in every dtype it takes (a Hopper-only
    version cannot be tested on an older card; minilin.cuda refuses it there); [] where minilin.cuda cannot run."""
    from minilin import cuda
    from minilin.cuda import front

    if not cuda.available()[0]:
        return []
    import cupy

    capability = int(cupy.cuda.Device().compute_capability)  # '90' for 9.0
    return [(v["version"], dtype) for v in cuda.versions(op)
            if front._runs_on(v, capability) for dtype in ("float32", "bfloat16") if v[dtype]]


@pytest.fixture
def poisoned_allocations():
    """Every new CuPy allocation starts as NaN bytes (0xFF), so an output a kernel never wrote shows; nothing to do
    where minilin.cuda cannot run."""
    from minilin import cuda

    if not cuda.available()[0]:
        yield
        return
    import cupy

    pool = cupy.cuda.MemoryPool()

    def malloc(size):
        memory = pool.malloc(size)
        if size:
            cupy.cuda.runtime.memsetAsync(memory.ptr, 0xFF, size, cupy.cuda.get_current_stream().ptr)
        return memory

    cupy.cuda.set_allocator(malloc)
    yield
    cupy.cuda.get_current_stream().synchronize()
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    pool.free_all_blocks()


@pytest.fixture(autouse=True)
def bench_in_process(monkeypatch):
    """`minilin bench --device cpu` re-runs itself in a one-thread child (minilin.threads); under test it runs in
    this process, so that capsys sees its output (tests/test_cpu_bench.py checks the re-run itself)."""
    import minilin.bench

    monkeypatch.setattr(minilin.bench, "is_one_thread", lambda: True)


def load_tool(name: str):
    """tools/<name>.py imported as a module of its own name (the scripts there are not part of the package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass in it looks its module up there
    spec.loader.exec_module(module)
    return module
