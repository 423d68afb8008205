"""The records allowlists admit what the tuners themselves write: every instruction and
annotation MetaSchedule's design spaces and postprocessors put in a trace, on every zoo row."""

from __future__ import annotations

import importlib

import pytest
import tvm
from tvm import meta_schedule as ms
from tvm import tir

import relay_tasks
from relay_tasks.adapters.meta_schedule.database import trace_json
from relay_tasks.adapters.records import trace_problem

from zoo import load, model_target_rows

#: What MetaSchedule's CPU and GPU rules read from a target beyond its kind.
TARGET_LIMITS = {
    "llvm": " -num-cores 2",
    "cuda": " -max_threads_per_block=1024 -max_shared_memory_per_block=49152 -thread_warp_size=32",
}


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_every_trace_metaschedule_writes_for_the_zoo_passes(model: str, target: str) -> None:
    """Each task's design spaces, then each postprocessor applied as tuning applies them: the
    traces a tune records (a custom rule's ``Unannotate("schedule_rule")`` among them)."""
    for module in ("arm_cpu", "cuda", "rocm", "x86"):  # the rules look intrinsics up by name
        importlib.import_module(f"tvm.tir.tensor_intrin.{module}")
    limits = TARGET_LIMITS[tvm.target.Target(target).kind.name]
    mod, params = load(model)
    seen = set()
    for task in relay_tasks.extract(mod, target, params, tuner="meta_schedule"):
        context = ms.TuneContext(
            mod=task.native.dispatched[0], target=tvm.target.Target(target + limits),
            space_generator="post-order-apply", search_strategy="replay-trace", task_name=task.name,
            rand_state=1,
        )  # fmt: skip
        for space in context.generate_design_space():
            # As the search does it: the space's trace replayed on the task, then each
            # postprocessor (applied to the design space itself, one crashes TVM on some draws).
            sch = tir.Schedule(context.mod, seed=1)
            space.trace.apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            for postproc in context.space_generator.postprocs:
                if not postproc.apply(sch):
                    break
            trace = trace_json(sch.trace)
            assert trace_problem(trace) is None, (task.name, trace_problem(trace))
            seen |= {inst[0] for inst in trace[0]}
    assert "SamplePerfectTile" in seen or "Split" in seen or len(seen) > 2, seen
