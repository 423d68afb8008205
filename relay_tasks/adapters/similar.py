"""Similar tasks: the same operators at other shapes.

A task with no records starts from the best schedules of its nearest similar tasks tuned
before (this tune's, another model's in the work dir, a ``--reuse`` dir's). Transfer-tuning
reports most of a tune's gain from the schedules of similar tasks at a fraction of its search;
each tuner says what "the same operators" means for its schedules, and which are nearest is
told alike for all of them here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TypeVar

#: Schedules a task with no records starts from, and most of them from one similar task.
STARTS, STARTS_EACH = 4, 2

#: What nearness compares: the shapes of a task's buffers, in order, and its FLOPs.
Sizes = tuple[Sequence[tuple[int, ...]], float]

T = TypeVar("T")


def stem(name: str) -> str:
    """A task name less the number that tells shapes apart (``fused_nn_conv2d_add_3``)."""
    return re.sub(r"_\d+$", "", name)


def keep_fastest(kept: list[tuple[float, T]], seconds: float, schedule: T) -> None:
    """Keep ``schedule`` among a task's ``STARTS_EACH`` fastest, fastest first."""
    kept.append((seconds, schedule))
    kept.sort(key=lambda pair: pair[0])
    del kept[STARTS_EACH:]


def nearest(mine: Sizes, tutors: Sequence[tuple[Sizes, T]]) -> list[T]:
    """``tutors`` nearest first: closest in the shapes of their buffers, then in FLOPs (DCGAN's
    transposed convolutions all have the same FLOPs, each its own shapes)."""
    return [t for _, t in sorted(tutors, key=lambda pair: _nearness(mine, pair[0]))]


def _nearness(task: Sizes, tutor: Sizes) -> tuple[float, float]:
    """Apart in shapes, then in FLOPs (as |log| of their ratio)."""
    return apart(task[0], tutor[0]), abs(math.log((tutor[1] + 1) / (task[1] + 1)))


def apart(mine: Sequence[tuple[int, ...]], theirs: Sequence[tuple[int, ...]]) -> float:
    """How far two tasks' buffer shapes are: the sum of |log| of each extent's ratio, or
    infinity where the buffers or their ranks differ in number."""
    if [len(s) for s in mine] != [len(s) for s in theirs]:
        return math.inf
    return sum(abs(math.log(max(a, 1) / max(b, 1)))
               for ours, its in zip(mine, theirs, strict=True)
               for a, b in zip(ours, its, strict=True))  # fmt: skip
