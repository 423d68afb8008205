"""Which task the next round of measurements goes to: the one whose part of the model's
estimated latency another round is likeliest to cut.

Upstream's task schedulers give every task a whole round before weighing any (MetaSchedule's
gradient scheduler 64 candidates each, in extraction order), so a short tune spends its budget
on whatever comes first, a 0.1%-of-the-FLOPs dense before the convolutions that are the
model's latency. Here each task starts from what is already known of it: the latency of TVM's
default schedule (measured before tuning) and the best record of earlier tunes. A task's
score is its weighted latency so far over the rounds it has had, plus a part for how fast its
best fell in its last rounds (the shape of upstream's gradient, without the warm-up round):
measurements go where the latency is, and a task whose curve is flat yields to the others.
A task of which nothing is known yet (no default, no valid record) is measured first, until
:data:`FAILED_MEASUREMENTS` of its measurements have all failed.

Where the machine's FMA peak is known, the latency a task is weighed by is what lies above
its floor (its FLOPs at that peak). TOPI's defaults run BERT-12's dense layers at the FMA
limit, and weighed by latency alone they took 1,281 of a 10-minute tune's 1,410
measurements for 1-4%, while its GELU, 0.29 ms by default and 0.07 after one measurement,
got that one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .base import TunerTask
from .index import Records, as_tally

#: The weight of the recent fall of a task's best against its latency per round (upstream's).
ALPHA = 0.2
#: Rounds over which the recent fall is taken (upstream's window).
WINDOW = 3
#: Measurements of a task, none valid, after which it is left (a tiny task's first candidates
#: can all fail or compute NaN before one is valid; a BERT's dense layers failed 241 times in a
#: row under Ansor).
FAILED_MEASUREMENTS = 32
#: Measurements that count as one round when tasks are weighed: a fixed unit, so that a pass
#: in small rounds (what a resumed tune has left) weighs tasks as the first pass did.
ROUND = 16
#: Least part of the model's weighted latency a task with schedules to start from must hold to
#: get its first round before any weighing (:meth:`Allocation.start_first`).
START_PART = 0.01


@dataclass
class Share:
    """What the allocation knows of one task: the best latency known (seconds; the faster of
    its default schedule and its records), the measurements it has had, and its best after
    each round of this tune."""

    weight: float
    best: float | None
    trials: int
    history: list[float] = field(default_factory=list)
    #: FLOPs a call (0: not counted); at the machine's peak, the least the task can take.
    flops: float = 0.0


class Allocation:
    """The rounds of one tune, each to the task :meth:`pick` names; :meth:`measured` is told
    each result as it comes, :meth:`round_done` when a round ends."""

    def __init__(
        self,
        tasks: Sequence[TunerTask],
        records: Records,
        defaults: Mapping[str, float],
        flops: Sequence[float] = (),
        peak: float | None = None,
    ) -> None:
        """``flops`` per task and ``peak`` (FLOP/s of the measuring device's FMA units) give
        each task its floor; without them every floor is 0. Only a peak measured by the
        roofline test: MetaSchedule's runner has timed dense candidates at 1.6x it (366
        GFLOP/s against 230; the same record timed alone took 0.78 ms, not 0.49), and floors
        at such a rate sink under every task. A peak measured beside another tune reads low:
        the compute tasks then all sit at their floors, and ties go by latency, as without."""
        self.peak = peak or 0.0
        self.groups = [task.alternatives_of for task in tasks]
        self.firsts: set[int] = set()
        self.shares = []
        summed = as_tally(records)
        counts = list(flops) or [0.0] * len(tasks)
        for task, count in zip(tasks, counts, strict=True):
            mine = summed.of(task.key)
            known = [seconds for seconds, _, _ in mine.best[:1]]
            default = defaults.get(task.alternatives_of)
            if default is not None:
                known.append(default)
            trials = mine.valid + mine.failed
            self.shares.append(
                Share(float(task.weight), min(known, default=None), trials, flops=max(count, 0.0))
            )

    def measured(self, index: int, seconds: float | None) -> None:
        """One measurement of task ``index``: its latency, or None where it failed."""
        share = self.shares[index]
        share.trials += 1
        if seconds is not None and 0 < seconds < 1e9:
            share.best = seconds if share.best is None else min(share.best, seconds)

    def improves(self, index: int, seconds: float) -> bool:
        """Whether ``seconds`` beats the best latency known of task ``index`` (none known:
        any does)."""
        best = self.shares[index].best
        return best is None or seconds < best

    def pick(self, alive: Sequence[int]) -> int | None:
        """The task of ``alive`` to measure next (None when none is left): of those with no
        valid latency and fewer than :data:`FAILED_MEASUREMENTS` measurements, the one with
        the fewest (the first of equals); else of those :meth:`start_first` named and not yet
        picked, the largest weighted latency; else the highest score (the first of equals)."""
        if not alive:
            return None
        unknown = [i for i in alive if self.shares[i].best is None]
        tried = [self.shares[i].trials for i in unknown]
        if tried and min(tried) < FAILED_MEASUREMENTS:
            return unknown[tried.index(min(tried))]
        first = [i for i in alive if i in self.firsts]
        if first:
            chosen = max(first, key=lambda i: (self.score(i), -i))
            self.firsts.discard(chosen)
            return chosen
        # Equal scores above the floors (every task left at its floor) go by latency.
        scores = [(self.score(i, self.peak), self.score(i)) for i in alive]
        best = max(scores)
        if best[0] == -math.inf:
            return None  # every task left failed all its measurements: nothing to weigh
        return alive[scores.index(best)]

    def start_first(self, indices: Sequence[int]) -> None:
        """Give the tasks ``indices`` (those with schedules to start from: shipped seeds, or
        similar tasks' records) their first round before any weighing, the largest part of
        the latency first, where they hold at least ``START_PART`` of it. That round measures
        only their starts, a few candidates: weighed, a task of 4% of ResNet-18 waited for
        rounds that never came in 10 minutes, its seeds unmeasured."""
        parts = self.parts()
        whole = sum(parts)
        self.firsts = {i for i in indices if whole > 0 and parts[i] >= START_PART * whole}

    def round_done(self, index: int) -> None:
        """Close task ``index``'s round: its best now is a point of its curve."""
        share = self.shares[index]
        if share.best is not None:
            share.history.append(share.best)

    def score(self, index: int, rate: float = 0.0) -> float:
        """Weighted latency above the task's floor (its FLOPs at ``rate``; none without) per
        round had (rounds of ``ROUND`` measurements, records of earlier tunes counted), plus
        ``ALPHA`` of the fall of the best over the last ``WINDOW`` rounds; a task with no valid
        latency yet scores lowest."""
        share = self.shares[index]
        if share.best is None:
            return -math.inf
        rounds = 1 + share.trials / ROUND
        fall = 0.0
        if len(share.history) > WINDOW:
            fall = (share.history[-1 - WINDOW] - share.best) / WINDOW
        above = share.best - share.flops / rate if rate else share.best
        return share.weight * ((1 - ALPHA) * max(above, 0.0) / rounds + ALPHA * fall)

    def expected(self, budget: int) -> list[int]:
        """Measurements each task may expect of ``budget`` (at least one): what sizes its
        search."""
        return [max(1, n) for n in apportion(budget, self.parts())]

    def parts(self) -> list[float]:
        """Each task's part of the weighted latency known, the mean of the known parts where
        nothing is known. Alternatives of one function (AutoTVM's ``dense_pack`` and
        ``dense_nopack``) share its part equally: the build runs the fastest of them once."""
        fastest: dict[str, float] = {}
        for group, share in zip(self.groups, self.shares, strict=True):
            if share.best is not None:
                part = share.weight * share.best
                fastest[group] = min(fastest.get(group, part), part)
        fallback = sum(fastest.values()) / len(fastest) if fastest else 1.0
        sizes = {g: self.groups.count(g) for g in self.groups}
        return [fastest.get(g, fallback) / sizes[g] for g in self.groups]


def apportion(total: int, parts: Sequence[float]) -> list[int]:
    """``total`` in whole shares proportional to ``parts`` (largest remainders, the first of
    equal remainders first): equal parts give ``total // n`` each and one more to the first
    ``total % n``."""
    whole = sum(parts)
    if whole <= 0:
        parts, whole = [1.0] * len(parts), float(len(parts))
    exact = [total * p / whole for p in parts]
    shares = [math.floor(x) for x in exact]
    order = sorted(range(len(parts)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    return shares
