"""A MetaSchedule or Ansor build lowers what no record covers as the build without the tuner.

With ``relay.backend.use_meta_schedule`` or ``relay.backend.use_auto_scheduler`` set, x86's
strategies for dense, batch_matmul and convolutions choose an implementation whose schedule is
TVM's naive one, left for the tuner to replace. A function the records do not cover keeps it:
a 2-layer BERT's tasks take 103 ms so under MetaSchedule and 7 ms with TOPI's schedules, and a
short tune's build was slower than the untuned one. Here each op call the records do not cover
has its implementation chosen with the tuner's setting off, as a build without the tuner
chooses it: the compute and schedule are TOPI's. The tuner's build finds no record for a
function made of such calls (its compute is another) and schedules it with the implementation's
own schedule, TOPI's.

A call is covered when a call of the same operator, attributes and types (:func:`signature`) is
in a function with a record and in none without one, or when a record's layout rewrite changed
it. The compiler lowers a call without saying which function it is in, so a call shared by a
tuned and an untuned function is lowered one way in both: TOPI's, which costs the tuned one at
most what its record gains over TOPI's default (a record is applied only where it beats that),
where the other way costs the untuned one the naive schedule (BERT-2's dense shared by a tuned
and an untuned function: 10.6 ms for the model, 3.3 untuned).

The compiler looks ``relay.backend.lower_call`` up once per process, when it first lowers a
call, and keeps what it found: :func:`_lower_call` is registered once, when this module is
imported (with relay_tasks), and is TVM's own outside such a build.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

import tvm
from tvm import relay, topi
from tvm.relay.backend import te_compiler

from ..errors import RelayTasksWarning
from .base import TunerTask

#: An op call by its operator, attributes, first argument's type and result type.
Signature = tuple[str, int, str, str]


def signature(call: relay.Call) -> Signature:
    """What identifies an op call across the extraction and the build. Not the types of the
    later arguments: a record's layout rewrite changes a weight's (Ansor's of a
    ``batch_matmul``, with no attribute saying so), and the weight's shape follows from the
    attributes and the other two types (units, channels, kernel size, the matmul's N)."""
    first = call.args[0].checked_type if call.args else None
    return _signature(call.op.name, call.attrs, first, call.checked_type)


def _signature(op: str, attrs: Any, first: Any, result: Any) -> Signature:
    return (
        op,
        tvm.ir.structural_hash(attrs) if attrs is not None else 0,
        _type_key(first),
        _type_key(result),
    )


def _type_key(ttype: Any) -> str:
    """A tensor type (Relay's, or a TE tensor's) as its static shape and dtype."""
    shape = getattr(ttype, "shape", None)
    if shape is None or not all(isinstance(d, (int, tvm.tir.IntImm)) for d in shape):
        return str(ttype)
    return f"{tuple(int(d) for d in shape)} {ttype.dtype}"


def signatures(funcs: Iterable[relay.Function]) -> frozenset[Signature]:
    """The signatures of every operator call in ``funcs`` (typed primitive functions)."""
    found: set[Signature] = set()

    def visit(node: Any) -> None:
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            found.add(signature(node))

    for func in funcs:
        relay.analysis.post_order_visit(func, visit)
    return frozenset(found)


#: For each op call signature of a model's functions, the types of its later arguments there.
Variants = Mapping[Signature, frozenset[tuple[str, ...]]]


def variants_of(tasks: Iterable[TunerTask]) -> Variants:
    """The later arguments' types of every op call of the ``tasks``' functions, by signature:
    a call of the build whose signature is one of them but whose weight has another type had
    it rewritten for a record (Ansor's ``batch_matmul`` carries no attribute saying so)."""
    found: dict[Signature, set[tuple[str, ...]]] = {}

    def visit(node: Any) -> None:
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            found.setdefault(signature(node), set()).add(_later_types(node))

    for task in tasks:
        if task.source is not None:
            relay.analysis.post_order_visit(task.source.func, visit)
    return {key: frozenset(types) for key, types in found.items()}


def _later_types(call: relay.Call) -> tuple[str, ...]:
    return tuple(_type_key(arg.checked_type) for arg in list(call.args)[1:])


def covered_by(tuned: Iterable[TunerTask], others: Iterable[TunerTask]) -> frozenset[Signature]:
    """The calls of the ``tuned`` tasks' functions that no function of ``others`` has."""

    def of(tasks: Iterable[TunerTask]) -> frozenset[Signature]:
        return signatures(t.source.func for t in tasks if t.source is not None)

    return of(tuned) - of(others)


def warn_unused(
    tuned: Sequence[TunerTask], applied: Iterable[str], others: Sequence[TunerTask]
) -> None:
    """Name the ``tuned`` tasks whose record the build never applied (``applied`` holds the
    keys it did), with the tasks without records that share a call with each: the build
    lowered that call TOPI's way, so the function is not the one the record is for."""
    found = set(applied)
    unused = [t for t in tuned if t.key not in found]
    if not unused:
        return
    theirs = [(o.name, signatures([o.source.func])) for o in others if o.source is not None]
    parts, shared = [], False
    for task in unused:
        calls = signatures([task.source.func]) if task.source is not None else frozenset()
        sharers = [name for name, their in theirs if calls & their]
        shared = shared or bool(sharers)
        parts.append(f"{task.name} (shares an op call with {', '.join(sharers)}, "
                     "which has none)" if sharers else task.name)  # fmt: skip
    why = (
        "A call shared with a task without records is lowered as that task needs it; tune the "
        "sharers too"
        if shared
        else "The build never asked for their workloads: the model is not the one they were "
        "extracted from, or TVM lowered their calls differently"
    )
    warnings.warn(
        f"the build did not use the records of {len(unused)} tuned task(s), built with TVM's "
        f"default schedules instead: {'; '.join(parts)}. {why}",
        RelayTasksWarning,
        stacklevel=3,
    )


class _Untuned(NamedTuple):
    setting: str
    covered: frozenset[Signature]
    variants: Variants


#: The build being made under :func:`untuned_as_without`, if any.
_CURRENT: ContextVar[_Untuned | None] = ContextVar("relay_tasks_untuned", default=None)
#: Calls of :func:`_lower_call` so far: none during a build means TVM's compiler holds its own.
_CALLS = [0]
#: Where :func:`naive_calls` collects, the signatures of :data:`TUNER_ONLY` calls lowered
#: without a record.
_NAIVE: ContextVar[set[Signature] | None] = ContextVar("relay_tasks_naive", default=None)


@contextmanager
def naive_calls() -> Iterator[set[Signature]]:
    """The signatures of the :data:`TUNER_ONLY` calls that builds inside lowered with the
    tuner's naive schedule, no record covering them: what a caller may build another way
    (a Winograd convolution unscheduled took ResNet-18 from 18 to 61 ms)."""
    found: set[Signature] = set()
    token = _NAIVE.set(found)
    try:
        yield found
    finally:
        _NAIVE.reset(token)


def _lower_call(call: relay.Call, inputs: Any, target: Any, otype: Any = None) -> Any:
    """The compiler's ``relay.backend.lower_call``: TVM's own, outside a build that asks for
    its untuned calls to be lowered without the tuner."""
    _CALLS[0] += 1
    current = _CURRENT.get()
    if current is None or _rewritten_for_a_record(call) or _kept_for_the_tuner(call, current):
        return te_compiler.lower_call(call, inputs, target, otype)
    with _switched_off(current.setting):
        return te_compiler.lower_call(call, inputs, target, otype)


tvm.register_func("relay.backend.lower_call", _lower_call, override=True)


#: Operators x86's strategies implement for the tuners only (without them, choosing an
#: implementation raises): lowered with the tuner's naive schedule where no record covers them.
WINOGRAD = "nn.contrib_conv2d_winograd_without_weight_transform"
TUNER_ONLY = frozenset({WINOGRAD})


def _kept_for_the_tuner(call: relay.Call, current: _Untuned) -> bool:
    """A call a record covers, one whose weight a record's layout rewrite changed (its
    signature is the model's, its later arguments' types are not), or one of
    :data:`TUNER_ONLY`."""
    key = signature(call)
    if key in current.covered:
        return True
    if call.op.name in TUNER_ONLY:
        naive = _NAIVE.get()
        if naive is not None:
            naive.add(key)
        return True
    known = current.variants.get(key)
    return known is not None and _later_types(call) not in known


@contextmanager
def untuned_as_without(
    setting: str, covered: frozenset[Signature], variants: Variants | None = None
) -> Iterator[None]:
    """Inside, the compiler lowers each op call outside ``covered`` with the pass context's
    ``setting`` (the tuner's switch) off, unless its weight was rewritten for a record
    (``variants``: the model's calls, :func:`variants_of`)."""
    calls = _CALLS[0]
    token = _CURRENT.set(_Untuned(setting, covered, variants or {}))
    hook = topi.nn.dense_alter_layout
    topi.nn.dense_alter_layout = _dense_layout_as_without(hook, setting, covered)
    try:
        yield
    finally:
        topi.nn.dense_alter_layout = hook
        _CURRENT.reset(token)
    if _CALLS[0] == calls:
        warnings.warn(
            "TVM's compiler lowered this build with its own relay.backend.lower_call (it keeps "
            "the one it finds first: TVM built a model before relay_tasks was imported), so "
            "the functions without a record got the tuner's naive schedules; import "
            "relay_tasks before building anything with TVM",
            RelayTasksWarning,
            stacklevel=3,
        )


def _dense_layout_as_without(
    hook: Callable[..., Any], setting: str, covered: frozenset[Signature]
) -> Callable[..., Any]:
    """TOPI's dense layout hook (``AlterOpLayout``), run for a dense no record covers with the
    tuner's switch off: it packs the weight as a build without the tuner does (under the
    tuner, the strategy's naive implementation has no layout to ask for). Unpacked, TOPI's
    dense repacks its weight on every run: BERT-2 with every function TOPI's took 5.06 ms so
    against 3.47 packed."""

    def dense_alter_layout(attrs: Any, inputs: Any, tinfos: Any, out_type: Any) -> Any:
        if _signature("nn.dense", attrs, tinfos[0], out_type) in covered:
            return hook(attrs, inputs, tinfos, out_type)
        with _switched_off(setting):
            return hook(attrs, inputs, tinfos, out_type)

    return dense_alter_layout


#: Attributes the tuners' relay-level layout rewrites set on a call whose record they apply.
_REWRITTEN = ("auto_scheduler_rewritten_layout", "meta_schedule_original_shape")


def _rewritten_for_a_record(call: relay.Call) -> bool:
    """Whether a layout rewrite changed ``call`` for a record (its weight's type is the
    rewritten one: no signature of the extraction matches it, and only the tuner's
    implementation reads that layout)."""
    return any(bool(getattr(call.attrs, name, None)) for name in _REWRITTEN)


@contextmanager
def _switched_off(setting: str) -> Iterator[None]:
    current = tvm.transform.PassContext.current()
    config = {**current.config, setting: False}
    with tvm.transform.PassContext(
        opt_level=current.opt_level,
        required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass),
        config=config,
    ):
        yield
