"""Comparisons shared by the equality tests, with messages that show where two lists part."""

from __future__ import annotations

import tvm


def assert_same_extracted_tasks(expected: list, actual: list) -> None:
    """Same count, names, order, weights; structurally equal relay and dispatched modules."""
    exp_rows = [(t.task_name, int(t.weight)) for t in expected]
    act_rows = [(t.task_name, int(t.weight)) for t in actual]
    assert act_rows == exp_rows, _first_difference(exp_rows, act_rows)
    for exp, act in zip(expected, actual, strict=True):
        assert str(act.target) == str(exp.target), exp.task_name
        assert len(act.dispatched) == len(exp.dispatched), exp.task_name
        for exp_mod, act_mod in zip(exp.dispatched, act.dispatched, strict=True):
            assert tvm.ir.structural_equal(exp_mod, act_mod), f"dispatched TIR of {exp.task_name}"
        assert tvm.ir.structural_equal(exp.mod, act.mod), f"relay function of {exp.task_name}"


def _first_difference(expected: list, actual: list) -> str:
    for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
        if e != a:
            return f"first difference at {i}: expected {e}, got {a}"
    return f"expected {len(expected)} tasks, got {len(actual)}"
