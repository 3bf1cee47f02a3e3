"""Host-side pieces of the launch paths (no GPU needed): parameter slots, and what a capture refuses."""

import numpy as np
import pytest
import scipy.sparse as sp

import tcgnn_py as tg
from tcgnn_py.kernels.driver import slot_value


def test_slot_values_are_what_the_driver_reads():
    # One 8-byte little-endian slot per parameter: 32-bit values in the low half, floats as their bits.
    assert slot_value(None) == 0
    assert slot_value(np.int32(-3)) == -3 and np.int64(slot_value(np.int32(-3))).astype("<i8").tobytes()[:4] == \
        np.int32(-3).tobytes()
    assert np.int64(slot_value(np.float32(1.5))).tobytes()[:4] == np.float32(1.5).tobytes()
    assert np.int64(slot_value(2.25)).tobytes() == np.float64(2.25).tobytes()
    assert np.int64(slot_value(np.float64(-0.5))).tobytes() == np.float64(-0.5).tobytes()
    assert slot_value(7) == 7 and slot_value(np.uint32(2**31)) == 2**31
    # signed zeros keep their sign bit, asked in either order (no cache by value confuses 0.0 with -0.0)
    for z in (0.0, -0.0, 0.0):
        assert np.int64(slot_value(z)).tobytes() == np.float64(z).tobytes()
        assert np.int64(slot_value(np.float32(z))).tobytes()[:4] == np.float32(z).tobytes()
    assert np.int64(slot_value(np.float32(-1e-40))).tobytes()[:4] == np.float32(-1e-40).tobytes()  # subnormal


def test_cuda_graph_training_needs_the_gpu():
    g = tg.load_cora()
    A = tg.TiledMatrix(sp.csr_array(g.adj[:50, :50]), device="cpu")
    rng = np.random.default_rng(0)
    params = tg.nn.gcn_init((8, 4, 3), rng)
    X = rng.standard_normal((50, 8)).astype(np.float32)
    labels = rng.integers(0, 3, 50)
    opt = tg.nn.Adam(params)
    with pytest.raises(ValueError, match="cuda_graph=True needs the graph on the GPU"):
        tg.nn.train(tg.nn.gcn_apply, params, A, X, labels, (np.arange(10), np.arange(10, 20), np.arange(20, 30)),
                    opt, epochs=2, rng=rng, cuda_graph=True)


def test_adam_counts_steps_on_the_host():
    params = {"w": np.array([1.0, -1.0])}
    opt = tg.nn.Adam(params, lr=0.1)
    for _ in range(3):
        opt.step({"w": np.array([2.0, -3.0])})
    assert opt.t == 3


def test_launch_argument_order(monkeypatch):
    # run() and bind() assemble the arguments in one place (Launch._args): head, the call's arrays, the tail
    # (a Scratch is this stream's buffer), the extras; "partial" is the launch's buffer, or Y without one.
    import types

    from tcgnn_py.products import _launch as _launches

    monkeypatch.setattr(_launches, "_stream", lambda: 99)  # the current stream's pointer
    calls = []
    kernel = lambda grid, block, args, shared_mem=0: calls.append(args)  # noqa: E731
    store = {}
    partial = types.SimpleNamespace(get=lambda store, stream: "P")  # a Scratch: this stream's buffer
    t = _launches.Launch(kernel, (1,), (32,), 0, ("units", "bp"), (None, "M", "D"))
    t.run("v", "X", "Y")
    assert calls[-1] == ("units", "bp", "v", "X", "Y", "Y", None, "M", "D")
    v = _launches.Launch(kernel, (1,), (32,), 0, ("units",), ("M",), partial=partial, scratch=store, n_extra=1)
    v.run("v", "X", "Y", "u")
    assert calls[-1] == ("units", "v", "X", "Y", "P", "M", "u")
    f = _launches.Launch(kernel, (1,), (256,), 0, ("splits",), ("M", "D", "H"), ("partial", "Y"), partial, store)
    main = v._replace(fixup=f)
    main.run("v", "X", "Y", "u")
    assert calls[-2:] == [("units", "v", "X", "Y", "P", "M", "u"), ("splits", "P", "Y", "M", "D", "H")]
    s = _launches.Launch(kernel, (1,), (32,), 0, ("h",), ("t",), _launches.SDDMM_OPERANDS)
    s.run("v", "a", "b", "e")
    assert calls[-1] == ("h", "v", "a", "b", "e", "t")


@pytest.mark.gpu
def test_a_failed_driver_launch_raises():
    """The bound plans' launch reports the driver's error instead of returning as if it had run."""
    import cupy as cp

    from tcgnn_py.kernels.driver import bound_launch, launch

    k = cp.RawKernel(r'extern "C" __global__ void tc_empty(float* p) { if (p) p[0] = 1.f; }', "tc_empty")
    k((1,), (1,), (None,))  # loads the module
    stream = cp.cuda.get_current_stream().ptr
    with pytest.raises(Exception, match="INVALID_VALUE|invalid"):
        launch(k.kernel.ptr, 1, 4096, [0], stream)  # 4096 threads per block: more than any GPU takes
    y = cp.zeros(1, cp.float32)
    bound_launch(k.kernel.ptr, 1, 1, [None], (0,), stream)(y)
    assert float(y[0]) == 1.0  # synchronize!
    with pytest.raises(Exception, match="INVALID_VALUE|invalid"):
        bound_launch(k.kernel.ptr, 1, 4096, [None], (0,), stream)(y)


@pytest.mark.gpu
def test_a_bound_launch_runs_its_follower_on_the_call_s_array():
    """``then``: one call runs the launch, then the follower (a fixup) on the array at the index given, in order."""
    import cupy as cp

    from tcgnn_py.kernels.driver import bound_launch

    src = r'''extern "C" __global__ void tc_set(float* a, float* p) { p[0] = 1.f; a[0] = 7.f; }
    extern "C" __global__ void tc_twice(float* p) { p[0] = 2.f * p[0] + 1.f; }'''
    m = cp.RawModule(code=src)
    first, after = m.get_function("tc_set"), m.get_function("tc_twice")
    stream = cp.cuda.get_current_stream().ptr
    a, y = cp.zeros(1, cp.float32), cp.zeros(1, cp.float32)
    fix = bound_launch(after.kernel.ptr, 1, 1, [None], (0,), stream)
    bound_launch(first.kernel.ptr, 1, 1, [None, None], (0, 1), stream, then=(fix, 1))(a, y)
    assert a.tolist() == [7.0] and y.tolist() == [3.0]  # synchronize!


def test_bound_launch_extra_slots(monkeypatch):
    """The bound launch writes each array's address where the kernel takes it, the 16-bit kernel's unscale last,
    and Y in the partial tiles' place where the launch has none."""
    import types

    from tcgnn_py.products import _launch as _launches

    from tcgnn_py.kernels import driver

    seen = []

    def fake_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        import ctypes

        ptrs = (ctypes.c_void_p * n_args).from_address(params)
        seen.append([ctypes.c_int64.from_address(p).value for p in ptrs])

    monkeypatch.setattr(driver, "_cuda", lambda: fake_launch)
    monkeypatch.setattr(_launches, "_stream", lambda: 99)  # the current stream's pointer
    arr = lambda p: types.SimpleNamespace(data=types.SimpleNamespace(ptr=p))  # noqa: E731
    kernel = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=7))
    head, tail = (arr(1), arr(2)), (np.int32(5), np.int32(6))
    n_args = len(head) + 4 + len(tail) + 1
    partial = types.SimpleNamespace(get=lambda store, stream: arr(40))
    _launches.Launch(kernel, (3,), (128,), 0, head, tail, partial=partial, scratch={}, n_extra=1).bind()(
        arr(10), arr(20), arr(30), arr(50))
    assert seen[-1] == [1, 2, 10, 20, 30, 40, 5, 6, 50]
    # Without partial tiles Y is the partial too.
    _launches.Launch(kernel, (3,), (128,), 0, head, tail, n_extra=1).bind()(arr(10), arr(20), arr(30), arr(50))
    assert seen[-1] == [1, 2, 10, 20, 30, 30, 5, 6, 50]


def test_the_blas_loader_takes_a_name_then_the_mapped_copy():
    """cuBLAS and cuBLASLt load by name, else from the copy already mapped into the process (libc stands in)."""
    from tcgnn_py.kernels.blas import _load

    assert _load(("libnot-there.so.0", "libc.so.6"), lambda line: False)._name == "libc.so.6"
    mapped = _load(("libnot-there.so.0",), lambda line: "/libc.so" in line or "/libc-" in line)
    assert mapped._name.startswith("/") and "libc" in mapped._name
