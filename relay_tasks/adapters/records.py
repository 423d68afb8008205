"""What a tuner's record may ask of the schedule it replays: allowlists, checked before any
tuner reads a work dir.

A record is replayed on a task's compute when ``tune`` resumes and when ``compile`` builds, and
a schedule can carry code: a MetaSchedule ``Annotate`` or an Ansor pragma named
``pragma_import_llvm`` makes TVM's CPU code generator link the LLVM IR it holds. So a record may
only use the instructions, annotations and pragmas the tuners themselves write; anything else
is a damaged record (a ``ModelError`` naming file and line), never something to build.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ..targets import target_problem

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
        # What TOPI's computes ask of MetaSchedule: a custom rule, which removes the annotation.
        "schedule_rule",
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
        problem = next(filter(None, map(_object_json_problem, _strings(inst[1:3]))), None)
        if problem:
            return f"its {kind} instruction holds {problem}"
    return None


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    if isinstance(value, dict):
        return [s for item in value.items() for s in _strings(list(item))]
    return []


@functools.lru_cache(maxsize=4096)  # records of one task repeat their layout transforms
def _object_json_problem(text: str) -> str | None:
    """A trace's string that TVM would read as object JSON (an input written ``{...}``, a layout
    transform's attribute) must be an index map as MetaSchedule's layout transforms write them:
    TVM's object JSON reader builds whatever node types a text names, and sets each
    reference without checking its type."""
    if not text.strip().startswith("{"):
        return None
    try:
        document = json.loads(text)
        problem = index_map_problem(document)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        problem = "it is not TVM object JSON"
    return None if problem is None else f"object JSON that is no index map ({problem})"


#: Reference kinds of index map attributes: a reference to the null node ("0"), to one of the
#: node types named, or to an array of such nodes; or a plain value.
_EXPRESSIONS = frozenset(
    [
        "tir.Var",
        "IntImm",
        "tir.Cast",
        "tir.Add",
        "tir.Sub",
        "tir.Mul",
        "tir.Div",
        "tir.Mod",
        "tir.FloorDiv",
        "tir.FloorMod",
        "tir.Min",
        "tir.Max",
    ]
)
_BINARY = {"a": _EXPRESSIONS, "b": _EXPRESSIONS, "dtype": "dtype", "span": "null"}
#: The nodes an index map may hold and each one's attributes.
INDEX_MAP_NODES: dict[str, dict[str, Any]] = {
    "tir.IndexMap": {
        "initial_indices": ("array", frozenset(["tir.Var"])),
        "final_indices": ("array", _EXPRESSIONS),
        "inverse_index_map": frozenset(["", "tir.IndexMap"]),
    },
    "tir.Var": {
        "dtype": "dtype",
        "name": frozenset(["runtime.String"]),
        "span": "null",
        "type_annotation": frozenset(["PrimType"]),
    },
    "PrimType": {"dtype": "dtype"},
    "IntImm": {"dtype": "dtype", "span": "null", "value": "int"},
    "tir.Cast": {"dtype": "dtype", "span": "null", "value": _EXPRESSIONS},
    **{op: _BINARY for op in _EXPRESSIONS - {"tir.Var", "IntImm", "tir.Cast"}},
}
_PLAIN = {
    "dtype": re.compile(r"u?int(8|16|32|64)\Z"),
    "int": re.compile(r"-?\d{1,19}\Z"),
    "null": re.compile(r"0\Z"),
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
#: Nodes an index map needs are a few dozen; this bounds the check and what TVM would build.
MAX_INDEX_MAP_NODES = 10_000


def index_map_problem(document: Any) -> str | None:
    """Why a TVM object JSON document is not an acyclic index map of integer arithmetic with
    every reference of the type its attribute holds, or None."""
    if set(document) - {"root", "nodes", "b64ndarrays", "attrs"} or document.get("b64ndarrays"):
        return "fields other than an index map's"
    nodes = document["nodes"]
    if not isinstance(nodes, list) or not 1 < len(nodes) <= MAX_INDEX_MAP_NODES:
        return "no node table of a bounded size"
    root = document["root"]
    if not (type(root) is int and 0 < root < len(nodes)) or nodes[0] != {"type_key": ""}:
        return "no root in its node table"
    if nodes[root]["type_key"] != "tir.IndexMap":
        return "no index map at its root"
    edges: dict[int, list[int]] = {}
    for index, node in enumerate(nodes[1:], start=1):
        problem, edges[index] = _node_problem(node, nodes)
        if problem:
            return f"node {index}: {problem}"
    return "a cycle of references" if _has_cycle(edges) else None


def _node_problem(node: Any, nodes: list[Any]) -> tuple[str | None, list[int]]:
    """What is wrong with one node, and the nodes it refers to."""
    kind = node["type_key"]
    if kind == "runtime.String":
        name = node.get("repr_str")
        named = set(node) == {"type_key", "repr_str"} and isinstance(name, str)
        return (None if named and _NAME.match(name) else "a name that is no identifier"), []
    if kind == "Array":
        data = node.get("data")
        listed = set(node) == {"type_key", "data"} and isinstance(data, list)
        if listed and all(type(i) is int and 0 < i < len(nodes) for i in data):
            return None, []
        return "an array that is not a list of its nodes", []
    fields = INDEX_MAP_NODES.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return f"the node type {str(kind)[:60]!r}", []
    attrs = node.get("attrs")
    if (
        set(node) != {"type_key", "attrs"}
        or not isinstance(attrs, dict)
        or set(attrs) != set(fields)
    ):
        return f"{kind} with other attributes", []
    refers: list[int] = []
    for name, want in fields.items():
        value = attrs[name]
        if not isinstance(value, str):
            return f"{kind}.{name} is no reference", []
        if isinstance(want, str):
            if not _PLAIN[want].match(value):
                return f"{kind}.{name} is not {want}", []
            continue
        target = int(value) if value.isdigit() and int(value) < len(nodes) else -1
        if target < 0:
            return f"{kind}.{name} refers to no node", []
        if isinstance(want, tuple):
            if nodes[target]["type_key"] != "Array" or not isinstance(nodes[target]["data"], list):
                return f"{kind}.{name} is not an array", []
            members, allowed = nodes[target]["data"], want[1]
            refers.append(target)
        else:
            members, allowed = [target], want
        for member in members:
            if not (type(member) is int and 0 <= member < len(nodes)) or (
                nodes[member]["type_key"] not in allowed
            ):
                return f"{kind}.{name} refers to a node of another type", []
            refers.append(member)
    return None, refers


def _has_cycle(edges: dict[int, list[int]]) -> bool:
    """Whether references loop (TVM would build objects that hold themselves)."""
    state: dict[int, int] = {}  # 1: being visited, 2: done
    for start in edges:
        stack = [(start, iter(edges[start]))]
        if state.get(start):
            continue
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                return True
            elif not state.get(child) and child in edges:
                state[child] = 1
                stack.append((child, iter(edges[child])))
    return False


def ansor_problem(task: Any, steps: Any) -> str | None:
    """Why an Ansor record's task names a target a file may not (:mod:`relay_tasks.targets`),
    or its transform steps are not ones Ansor's search writes, or None."""
    if not isinstance(task, list) or len(task) < 4:
        return "its task is not a list of Ansor's fields"
    problem = target_problem(task[1]) or (task[3] and target_problem(task[3]))
    if problem:
        return problem
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
        target, template = record["input"][:2]
        entity = record["config"]["entity"]
    except (KeyError, IndexError, TypeError, ValueError):
        return "it is not an AutoTVM record"
    problem = target_problem(target)
    if problem:
        return problem
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
