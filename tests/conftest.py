"""Test modes, decided before anything imports Numba.

* ``NUMBA_ENABLE_CUDASIM=1``: the Numba kernels run in the CUDA simulator, with
  the project's warp-intrinsic shim; tests marked ``kernels`` or ``sim`` run.
* a usable GPU: everything runs, ``gpu`` and ``kernels`` tests on the device.
* neither: ``gpu``/``kernels`` tests are skipped with the reason.
"""

import os
import pathlib
import sys

import numpy as np
import pytest

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
if SIM:
    sys.setswitchinterval(1e-3)  # the simulator is thread-bound: switch often
    from tcgnn_py import _cudasim

    _cudasim.install()

import tcgnn_py  # noqa: E402
from tcgnn_py._device import _probe  # noqa: E402

GPU = tcgnn_py.gpu_available()
GPU_REASON = _probe()[1]

_ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIRS = [
    pathlib.Path(p)
    for p in (os.environ.get("TCGNN_PY_DATA"), _ROOT / ".gpu" / "data", _ROOT.parent / "shared" / "data")
    if p
]


@pytest.fixture(scope="module")
def xp():
    """The array module kernels take: CuPy on a GPU, NumPy in the simulator."""
    if GPU:
        import cupy

        return cupy
    import numpy

    return numpy


def host(x):
    """A NumPy copy of a NumPy or CuPy array."""
    return x.get() if hasattr(x, "get") else np.asarray(x)


def graph_dir(name):
    """Folder of a ../shared/data graph, or skip with the reason."""
    for d in DATA_DIRS:
        if (d / name / "adj_csr.npz").exists():
            return d / name
    pytest.skip(f"graph {name!r} not found in {[str(d) for d in DATA_DIRS]}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        if "sim" in marks and not SIM:
            item.add_marker(pytest.mark.skip(reason="shim tests need NUMBA_ENABLE_CUDASIM=1"))
        elif "gpu" in marks and not GPU:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {GPU_REASON}"))
        elif "kernels" in marks and not (GPU or SIM):
            item.add_marker(
                pytest.mark.skip(reason=f"needs a CUDA GPU or NUMBA_ENABLE_CUDASIM=1: {GPU_REASON}")
            )
