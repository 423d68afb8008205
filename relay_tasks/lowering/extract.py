"""The shared backend: primitive functions of a fused module -> deduplicated, weighted tasks.

One extraction serves all three tuners. Functions are visited in upstream's post order,
deduplicated with upstream's compile-cache semantics (structurally equal function, same target),
weighted by how often they occur, and lowered to TE compute once each. Nothing is scheduled or
built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relay, te
from tvm.ir import IRModule
from tvm.ir.supply import NameSupply
from tvm.target import Target

from ..errors import (
    ExtractionError,
    RelayTasksError,
    SkippedTaskWarning,
    describe_failure,
    warn,
)
from ..inputs import ParamsLike, TargetLike
from ..ir import is_primitive_task, node_key
from ..optimize.pipeline import PassSettings, extraction_scope, optimize
from ..request import Request
from .lower import ConstantNames, LoweredTE, flatten_tuple_type, lower_to_te
from .vm_compiler import Call, compiler_calls


@dataclass(frozen=True, eq=False)
class Task:
    """One distinct primitive function of a model: what every tuner's task is made from.

    ``visits`` are the positions of the function's occurrences among the primitive functions of
    ``main`` in post order (the order upstream's MetaSchedule extraction walks); ``calls`` are the
    positions of its call sites among those the VM compiler lowers, in its order (every global
    function, loop bodies lifted, dead code dropped: see :func:`compiler_calls`), and
    ``planned`` those of them whose results its memory planning allocates. ``weight`` is
    how many times the function occurs in ``main`` (call sites, for a function only other global
    functions call). ``key`` identifies the function and target across processes and models.
    ``traced`` holds what a tuner's lowering scope recorded while this function was lowered.
    """

    name: str
    func: relay.Function
    target: Target
    lowered: LoweredTE
    weight: int
    key: str
    visits: tuple[int, ...]
    calls: tuple[int, ...]
    planned: tuple[int, ...] = ()
    traced: tuple[Any, ...] = ()

    @property
    def inputs(self) -> tuple[te.Tensor, ...]:
        return self.lowered.inputs

    @property
    def outputs(self) -> tuple[te.Tensor, ...]:
        return self.lowered.outputs

    @property
    def anchor_op(self) -> str:
        return self.lowered.anchor_op


@dataclass
class _Group:
    func: relay.Function
    visits: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    planned: list[int] = field(default_factory=list)


#: The primitive functions a compiler lowers from a fused module, one per call site, in order.
CallOrder = Callable[[IRModule], list[Call]]

#: Entered around the TE lowering of each distinct function (a tuner's tracing environment, for
#: instance); the list it yields is filled while lowering and kept as ``Task.traced``.
LoweringScope = Callable[[], AbstractContextManager[list[Any]]]


@contextmanager
def _no_tracing() -> Iterator[list[Any]]:
    yield []


def extract_tasks(
    mod: Any,
    target: TargetLike,
    params: ParamsLike = None,
    *,
    opt_level: int = 3,
    pass_config: Mapping[str, Any] | None = None,
    disabled_pass: Any = None,
) -> list[Task]:
    """Extract the distinct primitive functions of a Relay model as weighted tasks.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.relay.Function
        The model; its ``main`` is extracted.
    target : str or tvm.target.Target
        The target the tasks are for.
    params : dict of str to numpy.ndarray or tvm.nd.NDArray, optional
        Weights to bind into ``main`` by name before optimisation.
    opt_level, pass_config, disabled_pass
        The PassContext the optimisation and lowering run under.

    Returns
    -------
    list of Task
        In upstream's order: the reverse of the post order of first occurrences in ``main``;
        then functions only other global functions call, in the order the compiler lowers them.
    """
    settings = PassSettings(opt_level).merged(pass_config, disabled_pass)
    return run_extraction(Request.of(mod, target, params, settings))


def run_extraction(
    request: Request,
    *,
    environment: Callable[[], AbstractContextManager[Any]] = nullcontext,
    lowering_scope: LoweringScope = _no_tracing,
    call_order: CallOrder | None = compiler_calls,
) -> list[Task]:
    """:func:`extract_tasks` with the tuner-specific parts given as data by an adapter.

    ``environment`` is entered around optimisation and lowering (inside the target and
    PassContext); ``lowering_scope`` around the lowering of each distinct function;
    ``call_order`` gives the functions a compiler lowers, one per call site, in its order (the
    tasks' ``calls``; None for a tuner that only walks ``main``).
    """
    with extraction_scope(request.target, request.settings), environment():
        fused = optimize(request.mod, request.params, typed=False)
        groups = group_primitive_functions(fused, call_order)
        tasks = _lower_groups(groups, request.target, lowering_scope, call_order is not None)
    in_main = [task for task in tasks if task.visits]
    return in_main[::-1] + [task for task in tasks if not task.visits]


def group_primitive_functions(fused: IRModule, call_order: CallOrder | None) -> list[_Group]:
    """Primitive functions grouped by compile-cache equality: those of ``main`` by first visit,
    then those only other global functions call, by first call."""
    groups: list[_Group] = []
    by_hash: dict[int, list[_Group]] = {}

    def group_of(func: relay.Function) -> _Group:
        bucket = by_hash.setdefault(tvm.ir.structural_hash(func), [])
        group = next((g for g in bucket if tvm.ir.structural_equal(g.func, func)), None)
        if group is None:
            group = _Group(func)
            bucket.append(group)
            groups.append(group)
        return group

    seen: dict[int, _Group] = {}  # by object: the calls are mostly the very functions visited
    for index, func in enumerate(_post_order(fused["main"])):
        group = seen[node_key(func)] = group_of(func)
        group.visits.append(index)
    for index, (func, planned) in enumerate(call_order(fused) if call_order else ()):
        group = seen.get(node_key(func)) or group_of(func)
        group.calls.append(index)
        if planned:
            group.planned.append(index)
    return groups


def _post_order(main: relay.Function) -> list[relay.Function]:
    """Primitive functions of ``main`` in post order: the walk upstream's MetaSchedule
    extraction makes (it looks at ``main`` only)."""
    visited: list[relay.Function] = []

    def visit(node: Any) -> None:
        if isinstance(node, relay.Function) and is_primitive_task(node):
            visited.append(node)

    relay.analysis.post_order_visit(main, visit)
    return visited


def in_call_order(tasks: list[Task]) -> list[Task]:
    """The tasks a compiler lowers (and a tracing tuner so traces), in the order it lowers them;
    functions it never calls are left out."""
    return sorted((t for t in tasks if t.calls), key=lambda t: t.calls[0])


def dynamic_shape(func: relay.Function) -> str | None:
    """The first input or output shape of ``func`` with a dimension only known at run time.

    Printed with ``?`` for such dimensions, e.g. ``(?, 16)``; None when every shape is static.
    Tuners measure kernels on concrete shapes, so a function with one cannot become a task.
    """
    types = [p.checked_type for p in func.params] + [func.ret_type]
    shapes = (shape_text(t.shape) for ty in types for t in flatten_tuple_type(ty))
    return next((shape for shape in shapes if shape is not None), None)


def shape_text(dims: Any) -> str | None:
    """``(?, 16)`` for a shape with a dimension known only at run time (any dimension that is
    not an integer), None for a static shape."""
    texts = [str(int(d)) if isinstance(d, (int, tvm.tir.IntImm)) else "?" for d in dims]
    return f"({', '.join(texts)})" if "?" in texts else None


def display_name(task: Task) -> str:
    """The task's name as the tuners print it (TVM's raw fused names keep op names' dots)."""
    return task.name.replace(".", "_")


def warn_skipped_dynamic(task: Task, tuner: str) -> bool:
    """Warn that ``task`` is left out for its dynamic shape; False if its shapes are static."""
    shape = dynamic_shape(task.func)
    if shape is None:
        return False
    warn(
        f"{display_name(task)} has the dynamic shape {shape}: {tuner} cannot tune it and it "
        "is left out, as upstream leaves it out; give the model static input shapes to tune it",
        SkippedTaskWarning,
    )
    return True


def _lower_groups(
    groups: list[_Group], target: Target, scope: LoweringScope, compiled: bool
) -> list[Task]:
    """Lower each group once, sharing one constant-name supply as upstream does.

    The names of tensor constants (linked params) are drawn in the order upstream lowers, and
    they enter Ansor's workload keys. MetaSchedule's extraction lowers every occurrence in
    ``main``'s post order, so a repeated function draws its names again; a compiler
    (``compiled``: AutoTVM, Ansor) lowers each call site in call order and a cache hit draws
    nothing.
    """
    constant_names = NameSupply("")
    lowered: dict[int, tuple[LoweredTE, tuple[Any, ...]]] = {}

    def lower(group: _Group) -> None:
        group.func = typed_function(group.func)
        with scope() as record:
            result = _lower_one(group.func, target, constant_names)
        lowered[id(group)] = (result, tuple(record))

    if compiled:
        order = {c: g for g in groups for c in g.calls}
        for call in sorted(order):
            if id(order[call]) not in lowered:
                lower(order[call])
    else:
        owner = {v: g for g in groups for v in g.visits}
        for visit in sorted(owner):
            group = owner[visit]
            done = lowered.get(id(group))
            if done is None:
                lower(group)
                continue
            for base in done[0].constant_bases:
                constant_names.fresh_name(base)
    for group in groups:  # functions the walk above did not reach
        if id(group) not in lowered:
            lower(group)
    return [
        make_task(
            g.func,
            target,
            lowered[id(g)][0],
            weight=len(g.visits) or len(g.calls),
            visits=tuple(g.visits),
            calls=tuple(g.calls),
            planned=tuple(g.planned),
            traced=lowered[id(g)][1],
        )
        for g in groups
    ]


def typed_function(func: relay.Function) -> relay.Function:
    """A primitive function with every node typed, as type inference over its module types it
    (its parameters carry their types, so it is typed alone): the fused module itself is left
    untyped (see :func:`~relay_tasks.optimize.pipeline.FuseOps`), and lowering reads the types."""
    try:
        func.body.checked_type  # noqa: B018 (raises when the function was never typed)
    except ValueError:
        return relay.transform.InferType()(IRModule.from_expr(func))["main"]
    return func


def lower_function(
    func: relay.Function,
    target: Target,
    *,
    constant_names: Sequence[str] = (),
    lowering_scope: LoweringScope = _no_tracing,
) -> Task:
    """One primitive function lowered as extraction lowers it: how a task file's function
    becomes a tuner's task again on the machine that tunes it.

    Must run inside the tuner's extraction scope (target, PassContext, environment), as
    :func:`run_extraction` lowers there. ``constant_names`` are the names its tensor constants
    were given in the model (drawn from a supply the whole model shared); each must extend the
    base name lowering asks for, else ``ValueError``.
    """
    func = typed_function(func)
    with lowering_scope() as record:
        lowered = _lower_one(func, target, _NamesGiven(constant_names))
    return make_task(func, target, lowered, weight=1, traced=tuple(record))


class _NamesGiven:
    """A name supply that hands out names chosen earlier, in order (duck-types NameSupply)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def fresh_name(self, base: str) -> str:
        if not self.names or not self.names[0].startswith(base):
            raise ValueError(f"the function's constants are not named {self.names[:1]}")
        return self.names.pop(0)


def _lower_one(func: relay.Function, target: Target, constant_names: ConstantNames) -> LoweredTE:
    try:
        return lower_to_te(func, target, constant_names)
    except RelayTasksError:
        raise
    except Exception as err:  # strategies and TOPI computes raise anything at all
        raise ExtractionError(
            f"cannot lower a primitive function to TE compute for target {target.kind.name}: "
            f"{describe_failure(err)}"
        ) from err


def make_task(
    func: relay.Function,
    target: Target,
    lowered: LoweredTE,
    *,
    weight: int,
    visits: tuple[int, ...] = (),
    calls: tuple[int, ...] = (),
    planned: tuple[int, ...] = (),
    traced: tuple[Any, ...] = (),
) -> Task:
    """The task record of a lowered primitive function (its key: structural hash, in hex)."""
    return Task(
        name=lowered.fused_name,
        func=func,
        target=target,
        lowered=lowered,
        weight=weight,
        key=f"{tvm.ir.structural_hash(func) & (2**64 - 1):016x}",
        visits=visits,
        calls=calls,
        planned=planned,
        traced=traced,
    )
