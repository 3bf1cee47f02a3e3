"""One plan per operand signature: a plan runs its general form until its binder gives a bound launch."""

from tcgnn_py.products import Plan


def test_a_plan_runs_general_until_its_launch_binds():
    calls = []

    def general(values, casts, X, out):
        calls.append("general")
        return "Y"

    tries = iter([None, None, lambda values, casts, X, out: calls.append("bound") or "Y"])

    def binder(values, casts, X, out, general):
        calls.append("bind")
        return next(tries)

    plan = Plan(general, binder)
    for _ in range(4):
        assert plan("values", {}, "X", None) == "Y"
    # the launch is provisional twice (the binder gives None), then bound: later calls skip general and binder
    assert calls == ["general", "bind", "general", "bind", "general", "bind", "bound"]
    assert plan.bound is not None


def test_a_plan_without_a_binder_stays_general():
    n = []
    plan = Plan(lambda values, casts, X, out: n.append(1) or len(n))
    assert [plan(None, {}, None, None) for _ in range(3)] == [1, 2, 3] and plan.bound is None
