"""Differential fuzzing: random Relay graphs, ours against upstream, for every tuner and target.

Each tuner is fuzzed on x86, CUDA and aarch64 separately. The default run checks a small fixed
set of graphs per tuner and target (derandomized, so CI is reproducible). ``--fuzz-examples N``
(or ``RELAY_TASKS_FUZZ_EXAMPLES=N``) runs N fresh random graphs per tuner and target instead; hypothesis shrinks any mismatch to a minimal graph and prints it as
Relay text, and its example database replays it first on the next run.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from relay_tasks.adapters.meta_schedule import MODULE_EQUALITIES

from checks import assert_ansor_matches, assert_autotvm_matches, assert_meta_schedule_matches
from relay_graphs import Graph, relay_graphs
from zoo import AARCH64, CUDA, X86

_BUDGET = os.environ.get("RELAY_TASKS_FUZZ_EXAMPLES")
fuzz = settings(
    max_examples=int(_BUDGET) if _BUDGET else 10,
    derandomize=not _BUDGET,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
targets = pytest.mark.parametrize("target", [X86, CUDA, AARCH64], ids=["x86", "cuda", "aarch64"])
# Graphs with a dynamic batch leave functions out, with a warning each time.
pytestmark = pytest.mark.filterwarnings("ignore::relay_tasks.SkippedTaskWarning")


def _count(graph: Graph) -> None:
    """Which ops the run drew, for ``--hypothesis-show-statistics``."""
    for op in sorted(set(graph.ops)):
        event(op)


@targets
@fuzz
@given(graph=relay_graphs(), module_equality=st.sampled_from(MODULE_EQUALITIES))
def test_meta_schedule_equals_upstream(graph: Graph, target: str, module_equality: str) -> None:
    _count(graph)
    assert_meta_schedule_matches(graph.mod, graph.params, target, module_equality)


@targets
@fuzz
@given(graph=relay_graphs())
def test_autotvm_equals_upstream(graph: Graph, target: str) -> None:
    _count(graph)
    assert_autotvm_matches(graph.mod, graph.params, target)


@targets
@fuzz
@given(graph=relay_graphs(), simple=st.booleans())
def test_ansor_equals_upstream(graph: Graph, target: str, simple: bool) -> None:
    _count(graph)
    assert_ansor_matches(graph.mod, graph.params, target, simple)
