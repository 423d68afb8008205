"""What a tuner's record may ask of the schedule it replays: allowlists, checked before any
tuner reads a work dir.

A record is replayed on a task's compute when ``tune`` resumes and when ``compile`` builds, and
a schedule can carry code: a MetaSchedule ``Annotate`` or an Ansor pragma named
``pragma_import_llvm`` makes TVM's CPU code generator link the LLVM IR it holds. So a record may
only use the instructions, annotations and pragmas the tuners themselves write; anything else
is a damaged record (a ``ModelError`` naming file and line), never something to build.
"""

from __future__ import annotations

import re
from typing import Any

#: Schedule instructions MetaSchedule's search and postprocessors write (TVM's registered
#: instruction kinds, less the two marked unsafe).
TRACE_INSTRUCTIONS = frozenset(
    [
        "AddUnitLoop",
        "Annotate",
        "Bind",
        "Blockize",
        "CacheIndex",
        "CacheInplace",
        "CacheRead",
        "CacheWrite",
        "ComputeAt",
        "ComputeInline",
        "DecomposePadding",
        "DecomposeReduction",
        "EnterPostproc",
        "Fuse",
        "GetBlock",
        "GetChildBlocks",
        "GetConsumers",
        "GetLoops",
        "GetOutputBlocks",
        "GetProducers",
        "LoopPartition",
        "Merge",
        "PadEinsum",
        "Parallel",
        "RFactor",
        "ReIndex",
        "ReadAt",
        "ReindexCacheRead",
        "ReindexCacheWrite",
        "Reorder",
        "ReorderBlockIterVar",
        "ReverseComputeAt",
        "ReverseComputeInline",
        "RollingBuffer",
        "SampleCategorical",
        "SampleComputeLocation",
        "SamplePartitionedTile",
        "SamplePerfectTile",
        "SetAxisSeparator",
        "SetScope",
        "Split",
        "StorageAlign",
        "Tensorize",
        "TransformBlockLayout",
        "TransformLayout",
        "Unannotate",
        "Unroll",
        "Vectorize",
        "WriteAt",
    ]
)
#: Annotation keys MetaSchedule's schedule rules and postprocessors set.
TRACE_ANNOTATIONS = frozenset(
    [
        *(
            f"meta_schedule.{name}"
            for name in [
                "tiling_structure",
                "cooperative_fetch",
                "thread_extent_low_inclusive",
                "thread_extent_high_inclusive",
                "random_compute_producer",
                "parallel",
                "vectorize",
                "unroll_explicit",
                "unroll_implicit",
                "auto_tensorize",
                "layout_rewrite_preproc",
                "auto_tensorize_init",
                "tensor_core_enabled",
                "cache_type",
                "inline_rule",
            ]
        ),
        "software_pipeline_stage",
        "software_pipeline_order",
        "software_pipeline_async_stages",
        "double_buffer_scope",
        "permuted_layout",
        "warp_execution",
        "vector_bytes",
        "tir.manifest_shared_memory_local_stage",
        "local_stage",
        "pragma_unroll_explicit",
        "pragma_auto_unroll_max_step",
    ]
)
#: Ansor's transform steps by their record names (``ANSOR_STEPS`` of its serialisation).
ANSOR_STEPS = frozenset(
    ["AN", "FU", "PR", "RE", "SP", "FSP", "FFSP", "SA", "CA", "CI", "CR", "CHR", "CHW", "RF"]
)
#: The pragmas Ansor's search writes: an unroll depth, or the debugging region skip.
ANSOR_PRAGMA = re.compile(r"(auto_unroll_max_step\$\d{1,6}|debug_skip_region)\Z")


def trace_problem(trace: Any) -> str | None:
    """Why a MetaSchedule trace (``[instructions, decisions]``) is not one MetaSchedule writes,
    or None."""
    if not isinstance(trace, list) or len(trace) != 2 or not isinstance(trace[0], list):
        return "its trace is not [instructions, decisions]"
    for inst in trace[0]:
        if not isinstance(inst, list) or len(inst) != 4 or not isinstance(inst[2], list):
            return "an instruction is not [kind, inputs, attributes, outputs]"
        kind = inst[0]
        if not _one_of(kind, TRACE_INSTRUCTIONS):
            return f"its trace holds the instruction {str(kind)[:60]!r}, which no search writes"
        if kind in ("Annotate", "Unannotate"):
            key = inst[2][0] if inst[2] else None
            if not _one_of(key, TRACE_ANNOTATIONS):
                return f"its trace annotates {str(key)[:60]!r}, which no search writes"
    return None


def ansor_problem(steps: Any) -> str | None:
    """Why an Ansor record's transform steps are not ones Ansor's search writes, or None."""
    if not isinstance(steps, list):
        return "its steps are not a list"
    for step in steps:
        if not isinstance(step, list) or not step or not _one_of(step[0], ANSOR_STEPS):
            name = step[0] if isinstance(step, list) and step else step
            return f"it holds the step {str(name)[:60]!r}, which Ansor does not write"
        if step[0] == "PR" and not (len(step) == 4 and ANSOR_PRAGMA.match(str(step[3]))):
            return f"it asks for the pragma {str(step[-1])[:60]!r}, which Ansor does not write"
    return None


#: Knob kinds of AutoTVM's config entities: split, reorder, annotate, other option.
AUTOTVM_KNOBS = frozenset({"sp", "re", "an", "ot"})
_KNOB_TEXT = re.compile(r"[A-Za-z0-9_]{0,64}\Z")


def autotvm_problem(record: Any, templates: Any) -> str | None:
    """Why an AutoTVM record does not name one of ``templates`` with knobs of plain values, or
    None (a knob's value only ever fills a choice its template makes)."""
    try:
        template = record["input"][1]
        entity = record["config"]["entity"]
    except (KeyError, IndexError, TypeError):
        return "it is not an AutoTVM record"
    if not _one_of(template, templates):
        return f"it names {str(template)[:60]!r}, which is no registered AutoTVM template"
    for knob in entity if isinstance(entity, list) else [None]:
        if not isinstance(knob, list) or len(knob) != 3 or not _one_of(knob[1], AUTOTVM_KNOBS):
            return f"its knob {str(knob)[:60]} is not one AutoTVM writes"
        if knob[1] == "ot" and not (
            type(knob[2]) in (bool, int, float)
            or (isinstance(knob[2], str) and _KNOB_TEXT.match(knob[2]))
        ):
            return f"its knob {knob[0]!r} has the value {str(knob[2])[:60]!r}"
    return None


def _one_of(value: Any, allowed: Any) -> bool:
    """``value`` is one of the ``allowed`` names (a record can hold any JSON value there)."""
    return isinstance(value, str) and value in allowed
