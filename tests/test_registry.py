"""The compile registry's bookkeeping, without a GPU: families, registration, the background worker's state."""

import concurrent.futures
import os
import warnings

import pytest

from tcgnn_py.kernels import registry


def test_library_families_register_themselves():
    fams = registry.families()
    assert {"tf32", "core", "vec", "half", "sparse", "nn", "timing"} <= set(fams)
    code, names = fams["vec"]
    assert "tcgnn_spmm_vec_async" in code and all(n.startswith("tcgnn_") for n in names)


def test_register_is_idempotent_and_refuses_another_source():
    code, names = registry.families()["timing"]
    registry.register("timing", code, names)  # the same family again: nothing happens
    with pytest.raises(ValueError, match="already registered"):
        registry.register("timing", code + "\n// changed", names)
    assert registry.families()["timing"] == (code, names)


def test_wait_for_compiles_returns_when_nothing_is_pending():
    """After a wait nothing is pending (whatever earlier tests of the process compiled), and a wait returns."""
    registry.wait_for_compiles()
    assert not registry._pending
    registry.wait_for_compiles()


def test_wait_for_compiles_waits_for_a_tracked_compile_of_another_thread():
    """A compile on a thread of its own (the translation kernels' warm-up) is waited for like the worker's: a
    benchmark times nothing beside it.  It leaves the pending set once done."""
    import threading

    done = concurrent.futures.Future()
    done.set_running_or_notify_cancel()
    finished = []
    registry.track(done)

    def run():
        threading.Event().wait(0.2)
        finished.append(1)
        done.set_result(None)

    t = threading.Thread(target=run)
    t.start()
    try:
        registry.wait_for_compiles()
        assert finished == [1] and not registry._pending
    finally:
        t.join()
        registry._pending.clear()


def test_a_tracked_compile_leaves_the_pending_set_when_it_ends():
    """A tracked compile that ended before anyone waited (the translation kernels' warm-up, in a process that runs
    on) is not left pending: nothing waits on it, and the registry holds no finished future."""
    done = concurrent.futures.Future()
    done.set_running_or_notify_cancel()
    registry.track(done)
    assert ("tracked", id(done)) in registry._pending
    done.set_result(None)
    assert ("tracked", id(done)) not in registry._pending


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# (JAX, loaded in this worker by the JAX tests, warns at any fork; the child here runs no JAX)
@pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")
def test_forked_child_forgets_the_worker():
    """A child forked while compiles were queued gets no worker thread: it must not wait on them."""
    registry._worker.append(object())
    registry._pending[("vec", "x", 0)] = concurrent.futures.Future()
    try:
        with warnings.catch_warnings():  # Python 3.12 warns when a process with threads forks
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: reset by the at-fork hook, so waiting returns at once
            registry.wait_for_compiles()
            os._exit(0 if not registry._worker and not registry._pending else 1)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        registry._worker.clear()
        registry._pending.clear()
