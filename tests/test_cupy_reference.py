"""The reference's chunked and parallel forms run unchanged on CuPy arrays (the GPU bench's "reference (CuPy)"
row). Skipped, with the reason, where CuPy or a GPU is missing."""
from __future__ import annotations

import numpy as np
import pytest

from minilin import catalog
from conftest import rel_err, state_err

cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install -e '.[cuda]')")
try:
    GPUS = cupy.cuda.runtime.getDeviceCount()
except cupy.cuda.runtime.CUDARuntimeError:
    GPUS = 0
pytestmark = pytest.mark.skipif(GPUS == 0, reason="CuPy sees no GPU")


def to_cupy(x):
    return cupy.asarray(x) if isinstance(x, np.ndarray) else x


def to_host(state):
    if isinstance(state, tuple):
        return type(state)(*(to_host(s) for s in state)) if hasattr(state, "_fields") else tuple(map(to_host, state))
    return cupy.asnumpy(state) if isinstance(state, cupy.ndarray) else state


@pytest.mark.parametrize("name", catalog.names())
def test_chunked_and_parallel_run_on_cupy(name):
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(2, 100, 3, 16, 8, seed=5)
    for form in [f for f in ("chunked", "parallel") if f in catalog.forms(name)]:
        ref, ref_state = getattr(mod, form)(*args, **kwargs)
        out, state = getattr(mod, form)(*map(to_cupy, args), **kwargs)
        assert isinstance(out, cupy.ndarray), f"{name}.{form} returned {type(out)} for CuPy inputs"
        assert rel_err(cupy.asnumpy(out), ref) < 1e-10
        assert state_err(to_host(state), ref_state) < 1e-10
