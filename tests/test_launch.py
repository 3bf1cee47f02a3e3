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


def test_a_bound_launch_holds_each_argument_s_slot_and_the_table_of_their_addresses(monkeypatch):
    """``bound_launch`` fills one buffer: a slot per argument (integers as they are; arrays, None and floats as
    ``slot_value`` reads them), then the addresses of those slots, which is what the driver is handed."""
    import ctypes

    from tcgnn_py.kernels import driver

    seen = []

    def fake_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        table = (ctypes.c_void_p * 6).from_address(params)
        seen.append([ctypes.c_int64.from_address(p).value for p in table])

    monkeypatch.setattr(driver, "_cuda", lambda: fake_launch)
    class Scalar:  # (a 0-d device array: an integer by __index__, and an address)
        data = _array(12).data

        def __index__(self):
            return 3

    mixed = [_array(10), None, 2.25, np.float32(1.5), 7, 2**64 - 1]
    addressed = [5, 6, Scalar(), 8, 0, 9]
    ints = [5, np.int64(-3), np.uint32(2**31), True, 0, 2**63]
    for args in (mixed, ints, addressed):
        driver.bound_launch(1, 1, 32, args, (4,), 0)(_array(99))
        # (the slot's 64 bits read back signed: 2**64 - 1 is -1, 2**63 is -2**63)
        assert seen[-1] == [(slot_value(a) + 2**63) % 2**64 - 2**63 if i != 4 else 99 for i, a in enumerate(args)]


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


SOURCE = r"""
template <typename T, int C>
__global__ void __launch_bounds__(128, (C > 1 ? 4 : 8))
tc_test(const int4* __restrict__ units, /* a comment, with, commas */ int n, float* __restrict__ Y,
        float* partial, float slope, long long m, T v, const unsigned* __restrict__ seed) {}
// __global__ void tc_commented(int x) {}
extern "C" __global__ void tc_fix(float* __restrict__ partial, float* __restrict__ Y, int D) {}
"""
#: The same kernel with its parameters in another order: the launches follow the declaration.
SWAPPED = SOURCE.replace("int n, float* __restrict__ Y,", "float* __restrict__ Y, int n,").replace(
    "float slope, long long m,", "long long m, float slope,")


def _array(ptr):
    import types

    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))


def test_kernel_declarations_are_read_in_order():
    from tcgnn_py.kernels.registry import kernel_parameters

    got = kernel_parameters(SOURCE)
    assert got == {"tc_test": (("units", "ptr"), ("n", "i32"), ("Y", "ptr"), ("partial", "ptr"), ("slope", "f32"),
                               ("m", "i64"), ("v", "value"), ("seed", "ptr")),
                   "tc_fix": (("partial", "ptr"), ("Y", "ptr"), ("D", "i32"))}
    assert [p for p, _ in kernel_parameters(SWAPPED)["tc_test"]] == ["units", "Y", "n", "partial", "m", "slope", "v",
                                                                     "seed"]
    with pytest.raises(ValueError, match="no slot kind"):
        kernel_parameters("__global__ void k(float2 x) {}")


def test_every_registered_kernel_declares_parameters_a_launch_can_fill():
    """Each ``__global__`` function of every family reads (each parameter a pointer or a known scalar), and each
    compiled name expression names one of them."""
    import tcgnn_py.bench  # noqa: F401  (registers the "baseline" family)
    from tcgnn_py.kernels import registry

    for family, (source, names) in registry.families().items():
        table = registry.kernel_parameters(source)
        assert table, family
        for name in names:
            params = registry.parameters(family, name)
            assert params and len({p for p, _ in params}) == len(params), (family, name)


@pytest.fixture
def test_families(monkeypatch):
    """Two families registered for the test only: the kernel, and its parameters in another order."""
    from tcgnn_py.kernels import registry

    monkeypatch.setitem(registry._FAMILIES, "launch test", (SOURCE, ("tc_test<float, 1>", "tc_fix")))
    monkeypatch.setitem(registry._FAMILIES, "launch test swapped", (SWAPPED, ("tc_test<float, 1>", "tc_fix")))
    return "launch test", "launch test swapped"


def test_launch_arguments_go_where_the_kernel_declares_them(test_families, monkeypatch):
    """A launch names its arguments; each lands in its parameter's slot as the declaration reads, in the declared
    width: reordering the kernel's parameters reorders the slots, not the launches."""
    from tcgnn_py.kernels import launches as kl
    from tcgnn_py.kernels.driver import f32_bits, f64_bits

    monkeypatch.setattr(kl, "current_stream", lambda: 99)
    store = {}
    buffers = {}
    monkeypatch.setattr(kl.Scratch, "get", lambda self, store, stream: buffers.setdefault((self, stream),
                                                                                          _array(70 + stream)))
    units, seed = _array(10), _array(20)
    for family in test_families:
        L = kl.make(family, "tc_test<float, 1>", 4, 128, ("Y",), dict(units=units, n=5, slope=0.5, m=2**40,
                                                                      v=np.float64(1.5), seed=seed,
                                                                      partial=kl.Scratch("partial", (2,), "f")),
                    scratch=store)
        args = dict(zip([p for p, _ in kl.parameters(family, "tc_test")], L.arguments([_array(30)])))
        assert args == {"units": 10, "n": 5, "Y": 30, "partial": 169, "slope": f32_bits(0.5), "m": 2**40,
                        "v": f64_bits(1.5), "seed": 20}


@pytest.mark.parametrize("kind, lo, hi", [("i32", -2**31, 2**31), ("u32", 0, 2**32), ("i64", -2**63, 2**63),
                                           ("u64", 0, 2**64)])
def test_an_integer_slot_takes_its_kinds_range_whatever_the_integers_type(kind, lo, hi):
    from tcgnn_py.kernels.launches import encode

    numpy_int = np.uint64 if kind[0] == "u" else np.int64
    for v in (lo, hi - 1, 0, 1):
        assert encode(v, kind) == v and encode(numpy_int(v), kind) == v
    assert encode(True, kind) == 1
    for v in (lo - 1, hi):
        with pytest.raises(OverflowError, match=f"does not fit a {kind} parameter"):
            encode(v, kind)
    with pytest.raises(TypeError, match="takes an integer"):
        encode(1.0, kind)


def test_a_launch_names_every_parameter_once(test_families):
    from tcgnn_py.kernels.launches import Scratch, make

    family = test_families[0]
    full = dict(units=None, n=1, slope=0.0, m=0, v=0.0, seed=None, partial=None)
    make(family, "tc_test<float, 1>", 1, 32, ("Y",), full)
    with pytest.raises(TypeError, match="'seed' is not given"):
        make(family, "tc_test<float, 1>", 1, 32, ("Y",), {k: v for k, v in full.items() if k != "seed"})
    with pytest.raises(TypeError, match="no parameter 'out'"):
        make(family, "tc_test<float, 1>", 1, 32, ("out",), full)
    with pytest.raises(TypeError, match="'Y' is given twice"):
        make(family, "tc_test<float, 1>", 1, 32, ("Y", "Y"), full)
    with pytest.raises(TypeError, match="'n' is not a pointer parameter"):
        make(family, "tc_test<float, 1>", 1, 32, ("Y", "n"), {k: v for k, v in full.items() if k != "n"})
    with pytest.raises(TypeError, match="parameter 'n': an integer parameter takes an integer"):
        make(family, "tc_test<float, 1>", 1, 32, ("Y",), dict(full, n=1.5))
    with pytest.raises(OverflowError, match="parameter 'n'"):
        make(family, "tc_test<float, 1>", 1, 32, ("Y",), dict(full, n=2**31))
    with pytest.raises(TypeError, match="parameter 'units': a pointer parameter takes a device array"):
        make(family, "tc_test<float, 1>", 1, 32, ("Y",), dict(full, units=np.zeros(2)))
    with pytest.raises(TypeError, match="needs a scratch store"):
        make(family, "tc_test<float, 1>", 1, 32, ("Y",), dict(full, partial=Scratch("p", (1,), "f")))
    with pytest.raises(KeyError, match="no __global__ function 'tc_other'"):
        make(family, "tc_other", 1, 32, (), {})
    # the names' checks are worked out once per way of naming: a naming refused is refused again, and one taken
    # takes each launch's own values
    for _ in range(2):
        with pytest.raises(TypeError, match="'seed' is not given"):
            make(family, "tc_test<float, 1>", 1, 32, ["Y"], {k: v for k, v in full.items() if k != "seed"})
    a, b = (make(family, "tc_test<float, 1>", 1, 32, ["Y"], dict(full, n=n, m=2 * n)) for n in (3, 4))
    assert a.slots == b.slots and a.operands == b.operands == ("Y",)
    assert sorted(set(a.values) ^ set(b.values)) == [3, 4, 6, 8]


def test_one_array_fills_every_parameter_named_with_it(test_families, monkeypatch):
    """An operand given as a tuple of names (Y in the partial tiles' place, where a product has none) fills each;
    a follower (a fixup) runs after the launch on the call's operand it names."""
    from tcgnn_py.kernels import launches as kl

    monkeypatch.setattr(kl, "current_stream", lambda: 99)
    family = test_families[0]
    ran = []
    monkeypatch.setattr(kl, "launch", lambda function, grid, block, values, stream, smem=0: ran.append(values))
    monkeypatch.setattr(kl.Launch, "function", lambda self: self.name)
    fix = kl.make(family, "tc_fix", 2, 256, ("Y",), dict(partial=_array(5), D=3))
    L = kl.make(family, "tc_test<float, 1>", 1, 32, ("units", ("Y", "partial")),
                dict(n=1, slope=0.0, m=0, v=np.float32(2), seed=None), then=(fix, "Y"))
    L.run(_array(1), _array(30))
    assert ran == [[1, 1, 30, 30, 0, 0, np.float32(2).view(np.int32), 0], [5, 30, 3]]
    with pytest.raises(TypeError, match="takes 2 operands"):
        L.run(_array(1))


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


def test_a_bound_launch_writes_the_call_s_arrays_where_the_kernel_takes_them(test_families, monkeypatch):
    """The bound launch holds every fixed slot and the stream's scratch, and writes each array's address where
    the kernel takes it (one array in two places too)."""
    import ctypes

    from tcgnn_py.kernels import driver
    from tcgnn_py.kernels import launches as kl

    seen = []

    def fake_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        ptrs = (ctypes.c_void_p * 8).from_address(params)
        seen.append([ctypes.c_int64.from_address(p).value for p in ptrs])

    monkeypatch.setattr(driver, "_cuda", lambda: fake_launch)
    monkeypatch.setattr(kl, "current_stream", lambda: 99)
    monkeypatch.setattr(kl.Launch, "function", lambda self: 7)
    monkeypatch.setattr(kl.Scratch, "get", lambda self, store, stream: _array(40))
    fixed = dict(n=5, slope=0.0, m=6, v=0, seed=_array(2))
    bound = kl.make(test_families[0], "tc_test<float, 1>", 3, 128, ("units", "Y"),
                    dict(fixed, partial=kl.Scratch("partial", (1,), "f")), scratch={}).bind()
    bound(_array(10), _array(30))
    assert seen[-1] == [10, 5, 30, 40, 0, 6, 0, 2]
    kl.make(test_families[1], "tc_test<float, 1>", 3, 128, ("units", ("Y", "partial")), fixed).bind()(
        _array(10), _array(30))
    assert seen[-1] == [10, 30, 5, 30, 6, 0, 0, 2]  # (the swapped declaration: Y before n, m before slope)


def test_a_launch_bound_by_rows_writes_each_call_s_count_and_grid(test_families, monkeypatch):
    """``Launch.bind(rows=(name, per[, most]))``: ``f(m, *arrays)`` writes ``m`` in that parameter's slot and
    launches ``ceil(m / per)`` blocks along x (at least one, at most ``most``), the grid's other dimensions and
    every other slot as bound; a name the kernel does not have fails when bound."""
    import ctypes

    from tcgnn_py.kernels import driver
    from tcgnn_py.kernels import launches as kl

    seen = []

    def fake_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        ptrs = (ctypes.c_void_p * 8).from_address(params)
        seen.append(((gx, gy, gz), [ctypes.c_int64.from_address(p).value for p in ptrs]))

    monkeypatch.setattr(driver, "_cuda", lambda: fake_launch)
    monkeypatch.setattr(kl, "current_stream", lambda: 99)
    monkeypatch.setattr(kl.Launch, "function", lambda self: 7)
    monkeypatch.setattr(kl.Scratch, "get", lambda self, store, stream: _array(40))
    fixed = dict(slope=0.0, m=6, v=0, seed=_array(2), partial=kl.Scratch("partial", (1,), "f"))
    L = kl.make(test_families[0], "tc_test<float, 1>", (3, 2), 128, ("units", "Y"), dict(fixed, n=5), scratch={})
    bound = L.bind(rows=("n", 64))
    for m, blocks in ((1, 1), (64, 1), (65, 2), (1000, 16)):
        bound(m, _array(10), _array(30))
        assert seen[-1] == ((blocks, 2, 1), [10, m, 30, 40, 0, 6, 0, 2])
    capped = L.bind(rows=("n", 64, 5))  # (at least one block, at most the most)
    for m, blocks in ((0, 1), (300, 5), (100000, 5)):
        capped(m, _array(10), _array(30))
        assert seen[-1] == ((blocks, 2, 1), [10, m, 30, 40, 0, 6, 0, 2])
    with pytest.raises(TypeError, match="has no parameter 'rows'"):
        L.bind(rows=("rows", 64))


def test_a_fixed_launch_writes_every_slot_once_and_replays_them(test_families, monkeypatch):
    """``Launch.fixed(*arrays)``: every slot written when it is made (the arrays', the fixed ones, the stream's
    scratch), each call the same launch with nothing written; it holds what its addresses point at."""
    import ctypes

    from tcgnn_py.kernels import driver
    from tcgnn_py.kernels import launches as kl

    seen = []

    def fake_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        ptrs = (ctypes.c_void_p * 8).from_address(params)
        seen.append((function, stream, [ctypes.c_int64.from_address(p).value for p in ptrs]))

    monkeypatch.setattr(driver, "_cuda", lambda: fake_launch)
    monkeypatch.setattr(kl, "current_stream", lambda: 99)
    monkeypatch.setattr(kl.Launch, "function", lambda self: 7)
    scratch = _array(40)
    monkeypatch.setattr(kl.Scratch, "get", lambda self, store, stream: scratch)
    L = kl.make(test_families[0], "tc_test<float, 1>", 3, 128, ("units", "Y"),
                dict(n=5, slope=0.0, m=6, v=0, seed=_array(2), partial=kl.Scratch("partial", (1,), "f")), scratch={})
    units, Y = _array(10), _array(30)
    replay = L.fixed(units, Y)
    replay()
    replay()
    assert seen == [(7, 99, [10, 5, 30, 40, 0, 6, 0, 2])] * 2
    assert units in replay.held and Y in replay.held and scratch in replay.held
    with pytest.raises(TypeError, match="takes 2 operands"):
        L.fixed(units)
    # a launch with a follower (a fixup): the follower fixed too, on the operand it takes, after the launch
    fixup = kl.make(test_families[0], "tc_test<float, 1>", 1, 32, ("Y",),
                    dict(units=_array(11), n=1, slope=0.0, m=2, v=0, seed=_array(3),
                         partial=kl.Scratch("p", (1,), "f")), scratch={})
    seen.clear()
    both = L._replace(then=(fixup, 1)).fixed(units, Y)
    both()
    assert [slots for _, _, slots in seen] == [[10, 5, 30, 40, 0, 6, 0, 2], [11, 1, 30, 40, 0, 2, 0, 3]]


def test_the_blas_loader_takes_a_name_then_the_mapped_copy():
    """cuBLAS and cuBLASLt load by name, else from the copy already mapped into the process (libc stands in)."""
    from tcgnn_py.kernels.blas import _load

    assert _load(("libnot-there.so.0", "libc.so.6"), lambda line: False)._name == "libc.so.6"
    mapped = _load(("libnot-there.so.0",), lambda line: "/libc.so" in line or "/libc-" in line)
    assert mapped._name.startswith("/") and "libc" in mapped._name


#: Each kernel family and the modules that write its launches.
LAUNCH_SITES = {
    "attention": ("products/families/attention.py",),
    "nn": ("products/families/dense.py", "products/families/pointwise.py", "products/families/optimizer.py"),
    "tf32": ("products/families/tf32.py", "products/_launch.py"),
    "core": ("products/families/core.py", "products/_launch.py"),
    "vec": ("products/families/vec.py", "products/_vec_layout.py", "products/_launch.py"),
    "half": ("products/families/half.py", "products/_vec_layout.py", "products/_launch.py"),
    "sparse": ("products/families/sparse.py", "products/_launch.py"),
    "dist": ("distributed/_matrix.py",),
    "timing": ("kernels/timing.py",),
    "baseline": ("bench/_baselines.py",),
}
#: Keywords of the launch helpers that are not kernel parameters.
_HELPER_KEYWORDS = {"smem", "scratch", "then", "cooperative", "dense", "n_slices", "partial", "fixup", "extra",
                    "values"}


def _named_parameters(tree):
    """Every name a module's launch calls give a kernel parameter: the operands' strings, the keyword arguments
    and ``fixed`` dicts of ``make``, ``spmm``, ``sddmm`` (their first argument a family's name), ``launch`` and
    ``_pass`` (``values=`` and ``extra=`` name the products' values and extra operands), and what the module puts
    in a dict named ``fixed``."""
    import ast

    def strings(node):
        return {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and type(c.value) is str}

    def keys(node):  # dict(a=...) and {"a": ...}
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict":
            return {kw.arg for kw in node.keywords if kw.arg}
        if isinstance(node, ast.Dict):
            return {k.value for k in node.keys if isinstance(k, ast.Constant)}
        return set()

    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "fixed" for t in node.targets):
            names |= keys(node.value)
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "fixed" and \
                isinstance(node.slice, ast.Constant):
            names.add(node.slice.value)
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if fname == "update" and getattr(f.value, "id", "") == "fixed":
            names |= {kw.arg for kw in node.keywords if kw.arg}
            continue
        for kw in node.keywords:  # (the products' extra operands, wherever they are handed on)
            if kw.arg == "extra":
                names |= strings(kw.value)
        family_first = node.args and isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is str
        if not (fname in ("launch", "_pass", "_launch", "make") or fname in ("spmm", "sddmm") and family_first):
            continue
        for kw in node.keywords:
            if kw.arg and kw.arg not in _HELPER_KEYWORDS:
                names.add(kw.arg)
            if kw.arg in ("values", "extra"):
                names |= strings(kw.value)
        for arg in node.args[2 if family_first else 1:]:
            if isinstance(arg, (ast.Tuple, ast.BinOp)):  # operands: ("V", "G", ...) + seed
                names |= strings(arg)
            names |= keys(arg)
    return names


@pytest.mark.parametrize("family", sorted(LAUNCH_SITES))
def test_every_kernel_parameter_is_named_by_its_launches_and_no_other_name(family):
    """The launches name their arguments after the kernels' parameters, read from the CUDA declarations, and a
    launch must name every parameter: a parameter renamed in a kernel is named by no launch, and a name mistyped
    here is no kernel's -- either fails this host test, not a GPU run.  (A reordered parameter needs no test: the
    launches follow the declaration, :func:`test_launch_arguments_go_where_the_kernel_declares_them`.)"""
    import ast
    import pathlib

    import tcgnn_py
    import tcgnn_py.bench  # noqa: F401  (registers the "baseline" family)
    from tcgnn_py.kernels import registry

    root = pathlib.Path(tcgnn_py.__file__).parent
    trees = [ast.parse((root / m).read_text()) for m in LAUNCH_SITES[family]]
    named = set().union(*(_named_parameters(t) for t in trees))  # what the launch calls name, read strictly
    mentioned = named.union(*({n.value for n in ast.walk(t) if isinstance(n, ast.Constant) and type(n.value) is str}
                              | {n.arg for n in ast.walk(t) if isinstance(n, ast.keyword) and n.arg} for t in trees))
    if family == "nn":  # (the multi-tensor Adam names its gradients g0, g1, ... by their index)
        from tcgnn_py.kernels import nn as kn

        mentioned |= {f"g{i}" for i in range(kn.ADAM_MULTI)}
    declared = {p for params in registry.kernel_parameters(registry.families()[family][0]).values() for p, _ in params}
    assert sorted(declared - mentioned) == []  # a parameter no launch names (renamed in its kernel?)
    if family not in ("tf32", "core", "vec", "half", "sparse"):  # (their modules share the products' names)
        assert sorted(named - declared) == []  # a name no kernel declares
