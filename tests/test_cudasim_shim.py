"""One-warp kernels through the simulator shim, checked against NumPy expectations."""

import time

import numpy as np
import pytest

pytest.importorskip("numba")
# Module level on purpose: the simulator swaps only a module-global ``cuda``.
from numba import cuda  # noqa: E402

pytestmark = pytest.mark.sim


def run(kernel, n_threads, *arrays):
    kernel[1, n_threads](*arrays)
    return arrays


def lanes():
    return np.arange(32, dtype=np.int32)


def test_shuffles():
    @cuda.jit
    def k(x, a, b, c, d):
        i = cuda.threadIdx.x
        a[i] = cuda.shfl_sync(0xFFFFFFFF, x[i], 5)
        b[i] = cuda.shfl_up_sync(0xFFFFFFFF, x[i], 3)
        c[i] = cuda.shfl_down_sync(0xFFFFFFFF, x[i], 4)
        d[i] = cuda.shfl_xor_sync(0xFFFFFFFF, x[i], 6)

    x = lanes() * 10
    a, b, c, d = (np.zeros(32, np.int32) for _ in range(4))
    run(k, 32, x, a, b, c, d)
    L = lanes()
    np.testing.assert_array_equal(a, np.full(32, 50))
    np.testing.assert_array_equal(b, np.where(L >= 3, x[np.maximum(L - 3, 0)], x))
    np.testing.assert_array_equal(c, np.where(L + 4 < 32, x[np.minimum(L + 4, 31)], x))
    np.testing.assert_array_equal(d, x[L ^ 6])


def test_ballot_vote_popc():
    @cuda.jit
    def k(x, bal, allv, anyv, eqv, pc):
        i = cuda.threadIdx.x
        m = cuda.ballot_sync(0xFFFFFFFF, x[i] > 0)
        bal[i] = m
        allv[i] = cuda.all_sync(0xFFFFFFFF, x[i] >= 0)
        anyv[i] = cuda.any_sync(0xFFFFFFFF, x[i] > 30)
        eqv[i] = cuda.eq_sync(0xFFFFFFFF, x[i] > 0)
        pc[i] = cuda.popc(m)

    x = np.where(lanes() % 3 == 0, 0, lanes()).astype(np.int32)
    x[31] = 31  # bit 31 set: the mask is negative as an int32
    out = [np.zeros(32, np.int64) for _ in range(5)]
    run(k, 32, x, *out)
    bits = sum(1 << int(l) for l in np.flatnonzero(x > 0))
    want = np.uint32(bits).view(np.int32)
    assert want < 0
    np.testing.assert_array_equal(out[0], np.full(32, want))
    assert out[1].all() and out[2].all() and not out[3].any()
    np.testing.assert_array_equal(out[4], np.full(32, bin(bits).count("1")))


def test_match_and_activemask_with_exited_lanes():
    @cuda.jit
    def k(x, m_any, m_all, act):
        i = cuda.threadIdx.x
        if i >= 24:
            return  # lanes 24..31 exit: they drop out of later collectives
        m_any[i] = cuda.match_any_sync(0xFFFFFFFF, x[i])
        mm, pred = cuda.match_all_sync(0xFFFFFFFF, 7)
        m_all[i] = mm if pred else -1
        act[i] = cuda.activemask()
        cuda.syncwarp(0xFFFFFFFF)

    x = (lanes() % 4).astype(np.int32)
    m_any, m_all, act = (np.zeros(32, np.int64) for _ in range(3))
    run(k, 32, x, m_any, m_all, act)
    for i in range(24):
        assert m_any[i] == sum(1 << j for j in range(24) if x[j] == x[i])
    np.testing.assert_array_equal(m_all[:24], np.full(24, (1 << 24) - 1))
    np.testing.assert_array_equal(act[:24], np.full(24, (1 << 24) - 1))


def test_partial_mask_groups_and_short_block():
    @cuda.jit
    def k(x, out):
        i = cuda.threadIdx.x
        # Two half-warps reduce independently, each with its own mask.
        mask = 0x0000FFFF if i < 16 else 0xFFFF0000
        v = x[i]
        off = 8
        while off > 0:
            v += cuda.shfl_xor_sync(mask, v, off)
            off >>= 1
        out[i] = v

    x = lanes() + 1
    out = np.zeros(32, np.int32)
    run(k, 32, x, out)
    np.testing.assert_array_equal(out[:16], np.full(16, x[:16].sum()))
    np.testing.assert_array_equal(out[16:], np.full(16, x[16:].sum()))


def test_reading_a_non_participant_raises():
    @cuda.jit
    def k(out):
        i = cuda.threadIdx.x
        if i < 16:
            out[i] = cuda.shfl_sync(0x0000FFFF, i, 20)

    with pytest.raises(RuntimeError, match="did not take part"):
        run(k, 32, np.zeros(32, np.int32))


def test_popc_widths():
    @cuda.jit
    def k(a, b, c, out):
        out[0] = cuda.popc(a[0])
        out[1] = cuda.popc(b[0])
        out[2] = cuda.popc(c[0])

    out = np.zeros(3, np.int64)
    run(k, 32, np.array([-1], np.int32), np.array([-1], np.int64), np.array([0xF0F0F0F0], np.uint32), out)
    np.testing.assert_array_equal(out, [32, 64, 16])


def test_a_static_shared_array_is_one_array_for_the_block(monkeypatch):
    # A slow allocation lets every thread reach the simulator's lookup before the first array is stored: without
    # the shim's lock each would keep an array of its own and read slots that no other thread wrote.
    real_empty = np.empty

    def slow_empty(*args, **kwargs):
        time.sleep(0.01)
        return real_empty(*args, **kwargs)

    @cuda.jit
    def k(out):
        i = cuda.threadIdx.x
        s = cuda.shared.array(64, dtype=np.int32)
        s[i] = i + 1
        cuda.syncthreads()
        t = 0
        for j in range(cuda.blockDim.x):
            t += s[j]
        out[i] = t

    out = np.zeros(64, np.int64)
    monkeypatch.setattr(np, "empty", slow_empty)
    run(k, 64, out)
    monkeypatch.undo()
    np.testing.assert_array_equal(out, np.full(64, 64 * 65 // 2))
