"""pytest hooks: skip ``gpu``/``kernels``/``sim`` tests with the reason (flags in ``_env``)."""

import pytest
from _env import GPU, GPU_REASON, SIM


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


@pytest.fixture(scope="module")
def xp():
    """The array module kernels take: CuPy on a GPU, NumPy in the simulator."""
    if GPU:
        import cupy

        return cupy
    import numpy

    return numpy
