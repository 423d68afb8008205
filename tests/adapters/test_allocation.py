"""Rounds go where the model's latency is: the allocation of measurements among tasks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from relay_tasks.adapters.allocation import FAILED_MEASUREMENTS, ROUND, Allocation, apportion
from relay_tasks.adapters.base import Measurement, TunerTask

from zoo import load


def _task(key: str, weight: int = 1, group: str = "") -> TunerTask:
    return TunerTask(key, weight, "op", key, None, group=group)


def _rounds(allocation: Allocation, alive: list[int], count: int) -> list[int]:
    """The tasks of ``count`` rounds of ``ROUND`` measurements in which nothing gets faster."""
    picked = []
    for _ in range(count):
        index = allocation.pick(alive)
        assert index is not None
        for _ in range(ROUND):
            allocation.measured(index, 1.0)  # slower than every default: nothing improves
        allocation.round_done(index)
        picked.append(index)
    return picked


def test_rounds_follow_the_weighted_latency_of_the_defaults() -> None:
    """A task of 60% of the latency gets the first rounds, then shares them with the 30% one;
    the 1% task gets none of the first ten."""
    tasks = [_task("tiny"), _task("big"), _task("mid")]
    allocation = Allocation(tasks, [], {"tiny": 0.001, "big": 0.06, "mid": 0.03})
    picked = _rounds(allocation, [0, 1, 2], 10)
    assert picked[:2] == [1, 1]
    assert picked.count(1) > picked.count(2) > 0
    assert 0 not in picked


def test_a_latency_improves_on_the_best_known_default_or_record_alone() -> None:
    """What a tune checks before filing a measurement as valid: only one faster than every
    latency known of its task (its default, its records, this tune's valid measurements), a
    failure never counted; with nothing known, any."""
    tasks = [_task("known"), _task("unknown")]
    records = [Measurement("known", 0.004, "")]
    allocation = Allocation(tasks, records, {"known": 0.005})
    assert allocation.improves(0, 0.0039) and not allocation.improves(0, 0.0041)
    allocation.measured(0, 0.003)
    allocation.measured(0, None)
    assert not allocation.improves(0, 0.0031) and allocation.improves(0, 0.0029)
    assert allocation.improves(1, 10.0)


def test_weight_multiplies_a_tasks_latency() -> None:
    tasks = [_task("once", weight=1), _task("thrice", weight=3)]
    allocation = Allocation(tasks, [], {"once": 0.02, "thrice": 0.01})
    assert allocation.pick([0, 1]) == 1


def test_rounds_go_to_latency_above_the_fma_floor_where_the_peak_is_known() -> None:
    """ResNet-18's stage-2 convolutions as a 10-minute tune saw them (230 GFLOP/s peak): the
    direct one near its floor yields to the Winograd one with more above it, though its own
    latency is the larger; without the peak, the larger latency goes first."""
    tasks = [_task("direct", weight=2), _task("winograd", weight=2)]
    defaults = {"direct": 1.14e-3, "winograd": 0.86e-3}
    counts = [0.2318e9, 0.0933e9]
    assert Allocation(tasks, [], defaults).pick([0, 1]) == 0
    weighed = Allocation(tasks, [], defaults, counts, peak=230e9)
    assert weighed.score(0, 230e9) == pytest.approx(2 * 0.8 * (1.14e-3 - 0.2318e9 / 230e9))
    picked = _rounds(weighed, [0, 1], 6)
    assert picked[:3] == [1, 1, 1] and picked.count(1) == 5  # 0.454 ms above its floor, 0.132 ms


def test_a_task_at_its_floor_waits_and_one_without_a_flop_count_is_weighed_whole() -> None:
    tasks = [_task("dense"), _task("transform")]
    allocation = Allocation(tasks, [], {"dense": 1e-3, "transform": 0.1e-3}, [0.1e9, 0.0],
                            peak=100e9)  # fmt: skip
    assert allocation.score(0, 100e9) == 0.0
    assert allocation.score(1, 100e9) == pytest.approx(0.8 * 0.1e-3)
    assert allocation.pick([0, 1]) == 1


def test_a_peak_measured_low_leaves_every_task_at_its_floor_and_ties_go_by_latency() -> None:
    """Measured while another tune ran, the peak can read half the machine's: floors above
    every task then weigh nothing, and the latency decides (not the order of the tasks); a
    task measured faster than the peak stays at its floor, not below it."""
    tasks = [_task("a"), _task("b"), _task("c", weight=2)]
    defaults = {"a": 1.0e-3, "b": 1.2e-3, "c": 0.6e-3}
    allocation = Allocation(tasks, [], defaults, [0.23e9, 0.23e9, 0.23e9], peak=115e9)
    assert [allocation.score(i, 115e9) for i in range(3)] == [0.0, 0.0, 0.0]
    assert allocation.pick([0, 1, 2]) == 1  # 1.2 ms: the largest weighted latency
    assert allocation.pick([0, 2]) == 2  # 2 x 0.6 ms against a's 1.0


def test_a_task_of_which_nothing_is_known_is_measured_first() -> None:
    tasks = [_task("big"), _task("unknown"), _task("also")]
    allocation = Allocation(tasks, [], {"big": 1.0})
    assert allocation.pick([0, 1, 2]) == 1
    allocation.measured(1, 0.5)
    assert allocation.pick([0, 1, 2]) == 2


def test_tasks_with_schedules_to_start_from_get_a_first_round_before_any_weighing() -> None:
    """Of four tasks, the two with starts (seeds) that hold 1% or more of the latency get the
    first rounds, the larger first, each once; then the weighing, which gives the 60% task
    every round (the 0.5% task with starts gets none)."""
    tasks = [_task("big"), _task("mid"), _task("small"), _task("tiny")]
    allocation = Allocation(tasks, [], {"big": 0.6, "mid": 0.03, "small": 0.05, "tiny": 0.004})
    allocation.start_first([1, 2, 3])
    assert _rounds(allocation, [0, 1, 2, 3], 5) == [2, 1, 0, 0, 0]


def test_a_task_that_only_failed_is_tried_again_until_its_measurements_run_out() -> None:
    """A first round of two NaN candidates left a task with nothing to weigh, and every later
    pass measured nothing; a task that never builds still ends the tune."""
    allocation = Allocation([_task("a"), _task("b"), _task("known")], [], {"known": 1.0})
    allocation.measured(0, None)
    assert allocation.pick([0, 1, 2]) == 1  # untried first
    allocation.measured(1, None)
    assert allocation.score(0) == -math.inf
    assert allocation.pick([0, 1, 2]) == 0  # the fewest failures next, before any weighed task
    for _ in range(FAILED_MEASUREMENTS - 1):
        allocation.measured(0, None)
    assert allocation.pick([0, 1, 2]) == 1
    allocation.measured(1, 0.5)  # one valid: weighed from now on
    assert allocation.pick([0, 1]) == 1
    assert allocation.pick([0]) is None  # left after its failures ran out
    assert allocation.pick([]) is None


def test_the_records_of_earlier_tunes_count() -> None:
    """A task already measured many times, and fast by its records, yields to one that is not,
    though their defaults are equal."""
    earlier = [Measurement("a", 0.004)] * 40 + [Measurement("a", None, "failed")]
    allocation = Allocation([_task("a"), _task("b")], earlier, {"a": 0.01, "b": 0.01})
    assert allocation.shares[0].best == 0.004 and allocation.shares[0].trials == 41
    assert allocation.pick([0, 1]) == 1


def test_alternatives_share_their_functions_default_and_part() -> None:
    """One function, run once with its fastest alternative: its part (of the faster one)
    halved between the two, whichever is faster so far."""
    tasks = [_task("x", group="f"), _task("y", group="f"), _task("z")]
    allocation = Allocation(tasks, [Measurement("y", 0.01)], {"f": 0.02, "z": 0.02})
    assert [s.best for s in allocation.shares] == [0.02, 0.01, 0.02]
    assert allocation.parts() == [0.005, 0.005, 0.02]


@pytest.mark.parametrize(
    ("total", "parts", "shares"),
    [
        (7, [1, 1, 1], [3, 2, 2]),  # equal parts: the first ones one more
        (10, [0.06, 0.03, 0.01], [6, 3, 1]),
        (10, [2, 1], [7, 3]),  # the larger remainder first
        (3, [0, 0, 0], [1, 1, 1]),  # nothing known of any: equal
        (0, [1, 2], [0, 0]),
    ],
)
def test_apportion_is_whole_and_proportional(total, parts, shares) -> None:
    assert apportion(total, parts) == shares


def test_a_falling_curve_keeps_its_task_ahead() -> None:
    """Two tasks of equal latency and rounds: the one whose best fell over its last rounds
    scores higher than the one whose curve is flat."""
    allocation = Allocation([_task("falls"), _task("flat")], [], {})
    for seconds in (0.04, 0.03, 0.02, 0.01, 0.01):
        allocation.measured(0, seconds)
        allocation.round_done(0)
    for _ in range(5):
        allocation.measured(1, 0.01)
        allocation.round_done(1)
    assert allocation.score(0) > allocation.score(1)
    assert allocation.pick([0, 1]) == 0


def test_expected_measurements_follow_the_shares() -> None:
    tasks = [_task("big"), _task("small"), _task("unknown")]
    allocation = Allocation(tasks, [], {"big": 0.03, "small": 0.01})
    # The unknown task counts as the mean of the known ones: 0.02 of 0.06 in all.
    assert allocation.expected(60) == [30, 10, 20]
    assert allocation.expected(1) == [1, 1, 1]  # every task's search is sized for one at least
    assert Allocation(tasks, [], {}).expected(30) == [10, 10, 10]


def test_a_metaschedule_tune_measures_where_the_latency_is(tmp_path) -> None:
    """Three tasks, the last nearly all of the latency by their defaults: a short tune
    measures only that one (upstream's scheduler measures every task first, in order)."""
    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.adapters.base import Runner

    adapter, target = get_adapter("meta_schedule"), relay_tasks.host_target()
    mod, params = load("dense_softmax")
    tasks = adapter.extract(mod, target, params)
    assert len(tasks) == 3
    defaults = {t.alternatives_of: 1e-6 for t in tasks[:-1]} | {tasks[-1].alternatives_of: 1.0}
    adapter.tune(tasks, target, 3, tmp_path, Runner(), defaults=defaults)
    measured = adapter.measurements(tmp_path)
    assert any(m.valid for m in measured)
    assert {m.key for m in measured} == {tasks[-1].key}


def test_ansors_scheduler_counts_a_default_as_a_tasks_first_round(tmp_path) -> None:
    """A task with a default needs no warm-up round and starts at its default; one without is
    left to Ansor's warm-up; a record faster than the default stays its best."""
    import numpy as np

    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.adapters.ansor.session import _FromDefaults, _Tutors

    mod, params = load("dense_softmax")
    tasks = get_adapter("ansor").extract(mod, relay_tasks.host_target(), params)
    scheduler = _FromDefaults([t.native for t in tasks], [t.weight for t in tasks],
                              [None, 0.002, 0.5], (), _Tutors(), None, tmp_path, lambda: False)  # fmt: skip
    assert scheduler.task_cts == [0, 1, 1]
    assert scheduler.best_costs[1:].tolist() == [0.002, 0.5]
    assert scheduler.task_costs_history == [[], [0.002], [0.5]]
    weights = np.array([t.weight for t in tasks], dtype=float)
    assert scheduler.cur_score == scheduler._compute_score(scheduler.best_costs)
    assert weights[2] * 0.5 <= scheduler.cur_score
    scheduler.task_cts[2], scheduler.best_costs[2] = 0, 0.1  # as if a log restored a record
    scheduler._count_defaults()
    assert scheduler.task_cts[2] == 1 and scheduler.best_costs[2] == 0.1


def test_ansors_scheduler_leaves_a_task_whose_measurements_all_fail(monkeypatch, tmp_path) -> None:
    """A task none of whose first measurements is valid is left (Ansor would go on sending it
    the rounds its latency earns), in later passes too; one valid measurement keeps it in."""
    from tvm import auto_scheduler
    from tvm.auto_scheduler.measure import MeasureResult

    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.adapters.ansor.session import FAILED_MEASUREMENTS, _FromDefaults, _Tutors

    mod, params = load("dense_softmax")
    tasks = get_adapter("ansor").extract(mod, relay_tasks.host_target(), params)
    scheduler = _FromDefaults([t.native for t in tasks], [t.weight for t in tasks],
                              [0.5, 0.002, 0.5], (), _Tutors(), None, tmp_path, lambda: False)  # fmt: skip
    monkeypatch.setattr(auto_scheduler.TaskScheduler, "_tune_task", lambda self, index: None)

    def batch(index: int, error_nos: list[int]) -> None:
        task = SimpleNamespace(workload_key=tasks[index].native.workload_key)
        inp = SimpleNamespace(task=task, state=None)
        results = [MeasureResult([1e-5], error_no, "", 0.1, 0) for error_no in error_nos]
        scheduler.measured([inp] * len(results), results)

    batch(0, [1] * (FAILED_MEASUREMENTS - 1))  # INSTANTIATION_ERROR
    batch(2, [1] * FAILED_MEASUREMENTS + [0])
    scheduler._tune_task(0)
    scheduler._tune_task(2)
    assert scheduler.dead_tasks == set()  # not yet enough failures; one valid keeps it
    batch(0, [1])
    scheduler._tune_task(0)
    scheduler._tune_task(2)
    assert scheduler.dead_tasks == {0}
    failures = [Measurement(tasks[0].key, None, "INSTANTIATION_ERROR: x")] * FAILED_MEASUREMENTS
    again = _FromDefaults([t.native for t in tasks], [t.weight for t in tasks], [0.5, 0.002, 0.5],
                          failures, _Tutors(), None, tmp_path, lambda: False)  # fmt: skip
    assert again.dead_tasks == {0}  # a later pass does not try it again
