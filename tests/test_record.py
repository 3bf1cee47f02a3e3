"""A layer's math is recorded once and replayed bound (tcgnn_py.nn._record): host checks, no GPU needed."""

import numpy as np
import pytest

from tcgnn_py.nn._record import Op, Tape, general, replay


def _ops(log):
    """Ops whose bound forms log how they were bound and run the same NumPy math."""
    def mm(a, b, bias=None):
        return a @ b if bias is None else a @ b + bias

    def mm_bind(a, b, bias=None, keep=False):
        log.append(("mm", keep, bias is None))
        return (lambda a, b: mm(a, b)) if bias is None else (lambda a, b, bias: mm(a, b, bias))

    def add(x, b):
        x += b
        return x

    def add_bind(x, b, keep=False):
        log.append(("add", keep))
        return add

    def scale(k, x):  # a constant (k) before the array
        return k * x

    def scale_bind(k, x, keep=False):
        log.append(("scale", keep, k))
        return lambda x: k * x

    return Op(mm, mm_bind), Op(add, add_bind), Op(scale, scale_bind)


def test_an_array_made_between_steps_is_not_bound():
    """A record replays arrays it can trace to the call's inputs or its steps; one made in between (a view, a
    converted input) would be fixed at its recorded address: no bound call, the general one stays."""
    MM, _, _ = _ops([])
    H, W = np.ones((2, 2)), np.ones((2, 2))
    tape = Tape()
    out = tape(MM, H, W.T)  # a view made by the math itself
    assert replay(tape, (H, W), (out,)) is None
    tape = Tape()
    assert replay(tape, (H, W), (tape(MM, H, W),)) is not None


def test_an_op_without_a_bound_form_leaves_the_call_general():
    none = Op(lambda x: x + 1, lambda x, keep=False: None)
    tape = Tape()
    H = np.zeros(3)
    assert replay(tape, (H,), (tape(none, H),)) is None


def test_inputs_that_are_not_arrays_are_passed_anew():
    """An input such as a random generator reaches its steps per call; numbers stay constants of the record."""
    draw = Op(lambda rng, scale: scale * rng.random(2),
              lambda rng, scale, keep=False: lambda rng: scale * rng.random(2))
    tape = Tape()
    rng = np.random.default_rng(0)
    out = tape(draw, rng, 3.0)
    call = replay(tape, (rng,), (out,))
    (a,), (b,) = call(np.random.default_rng(5)), call(np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, 3.0 * np.random.default_rng(5).random(2))


def test_replay_binds_each_step_once_and_reads_operands_from_inputs_and_steps():
    rng = np.random.default_rng(1)
    log = []
    MM, ADD, SCALE = _ops(log)
    H, W, b, I = (rng.integers(-4, 5, s).astype(np.float64) for s in ((5, 3), (3, 2), (2,), (2, 2)))

    def math(t, H, W, b, I):
        mid = t(MM, H, W)
        out = t(ADD, t(SCALE, 2.0, mid), b)
        return out, t(MM, out, I, b)

    tape = Tape()
    want = math(tape, H, W, b, I)
    call = replay(tape, (H, W, b, I), want)
    # H W is read within the call: its own array; 2 mid escapes through the in-place add; the last product too
    assert log == [("mm", True, True), ("scale", False, 2.0), ("add", False), ("mm", False, False)]
    for _ in range(2):
        H2, W2, b2, I2 = (rng.integers(-4, 5, x.shape).astype(np.float64) for x in (H, W, b, I))
        got = call(H2, W2, b2, I2)
        expect = math(general, H2, W2, b2, I2)
        for g_, e in zip(got, expect):
            np.testing.assert_array_equal(g_, e)
    assert len(log) == 4  # bound once, replayed since


def test_none_inputs_and_outputs_stay_none():
    log = []
    MM, _, _ = _ops(log)
    H, W = np.ones((2, 2)), np.ones((2, 2))
    tape = Tape()
    out = tape(MM, H, W, None)
    call = replay(tape, (H, W, None), (out, None))
    got, none = call(2 * H, W, None)
    assert none is None and got.tolist() == [[4.0, 4.0], [4.0, 4.0]]


def test_a_forward_replay_returns_its_output_and_a_vjp_of_what_the_call_saw_and_made():
    """``replay(..., vjp=f)`` is a layer's bound forward call: ``(outputs[0], partial(f, inputs + outputs,
    len(inputs)))``, the vjp reading this call's inputs and results (not the recording's)."""
    log = []
    MM, _, _ = _ops(log)
    H, W = np.ones((2, 2)), np.eye(2)
    tape = Tape()
    out = tape(MM, H, W, None)
    seen = []
    call = replay(tape, (H, W), (out,), vjp=lambda saved, n, g: seen.append((saved, n, g)))
    H2 = 3 * H
    got, vjp = call(H2, W)
    np.testing.assert_array_equal(got, H2)
    vjp("g")
    (saved, n, g), = seen
    assert n == 2 and g == "g" and saved[0] is H2 and saved[1] is W and saved[2] is got
