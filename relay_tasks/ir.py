"""Small IR helpers every stage shares: rebuilding modules and reading TVM's diagnostics.

Kept apart from the input layer so that the pipeline and the loaders depend on TVM's IR only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import tvm
from tvm import relay
from tvm.ir import IRModule
from tvm.ir import diagnostics as _diagnostics
from tvm.runtime import Object
from tvm.runtime.object import _ffi_node_api as _node_api


def with_functions(mod: IRModule, updates: Mapping[Any, relay.Function]) -> IRModule:
    """A new module: ``mod`` with some functions replaced (keyed by GlobalVar or name).

    Built the way TVM's own passes update a module: the function and type-definition ``Map``s
    are shared with ``mod`` (copied on the first write) and replaced functions keep their
    places. So the module iterates its functions in upstream's order, which decides the order
    the VM compiler lowers them in; and the Prelude's type definitions, whose ``GlobalTypeVar``
    keys cannot be keys of a Python dict, travel untouched.
    """
    new = IRModule(mod.functions, mod.type_definitions, mod.attrs, mod.global_infos)
    for key, func in updates.items():
        new.update_func(mod.get_global_var(key) if isinstance(key, str) else key, func)
    return new


def is_primitive_task(func: relay.Function) -> bool:
    """A primitive function (FuseOps made it) that TVM itself compiles, so a tuner can tune it;
    functions offloaded to an external compiler (BYOC) are not TVM's to tune."""
    attrs = func.attrs
    if attrs is None or "Primitive" not in attrs or not int(attrs["Primitive"]):
        return False
    return "Compiler" not in attrs


@contextlib.contextmanager
def diagnostics() -> Iterator[list[str]]:
    """Collect TVM's error diagnostics instead of letting them render to the terminal."""
    messages: list[str] = []

    def collect(ctx: Any) -> None:
        messages.extend(str(diag.message).strip() for diag in ctx.diagnostics)

    _diagnostics.override_renderer(collect)
    try:
        yield messages
    finally:
        _diagnostics.override_renderer(None)


@contextlib.contextmanager
def native_warnings_muted() -> Iterator[None]:
    """File descriptor 2 to /dev/null meanwhile: TVM's C++ warnings are written there, past
    Python (``ConvertLayout`` warns once for every operator it has no layout for: 21 lines
    for a ResNet-18). Errors still come as exceptions."""
    sys.stderr.flush()
    saved = os.dup(2)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)
    os.close(quiet)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def diagnostic_text(messages: list[str], err: BaseException) -> str:
    """One line from collected diagnostics (their own line breaks folded), or from the error
    itself when there were none."""
    detail = "; ".join(dict.fromkeys(" ".join(m.split()) for m in messages if m.strip()))
    if detail:
        return detail
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def is_optimizable(func: relay.Function) -> bool:
    """Whether TVM's function passes and the VM compiler's lowering visit ``func``: not one for
    an external compiler, not extern, not marked to skip optimisation (TVM's
    ``AsOptimizableFunctionNode``)."""
    attrs = func.attrs
    if attrs is None:
        return True
    if "Compiler" in attrs:
        return False
    return not any(key in attrs and int(attrs[key]) for key in ("Extern", "SkipOptimization"))


def stand_in(
    real: tvm.transform.Pass, run: Callable[[tvm.IRModule], tvm.IRModule]
) -> tvm.transform.Pass:
    """A module pass under ``real``'s name, opt level and requirements (so a PassContext
    enables, disables and requires it as it would ``real``) that does ``run``."""
    info = real.info

    @tvm.transform.module_pass(  # type: ignore[untyped-decorator]
        opt_level=int(info.opt_level), name=str(info.name), required=list(info.required)
    )
    def standing_in(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return run(mod)

    return standing_in


_MISSING = object()
#: Attributes set by :func:`patched`, with how many are inside and what to restore.
_PATCHES: dict[tuple[Any, str], list[Any]] = {}
_PATCHES_LOCK = threading.Lock()


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` (a class or module attribute) set to ``value`` while anyone is inside,
    then restored: reference-counted, so extractions in several threads neither restore it
    under each other nor leave it set."""
    key = (owner, name)
    with _PATCHES_LOCK:
        entry = _PATCHES.get(key)
        if entry is None:
            entry = _PATCHES[key] = [0, vars(owner).get(name, _MISSING)]
            setattr(owner, name, value)
        entry[0] += 1
    try:
        yield
    finally:
        with _PATCHES_LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                del _PATCHES[key]
                if entry[1] is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, entry[1])


def dunders_answered_in_python() -> contextlib.AbstractContextManager[None]:
    """Answer "no such attribute" for ``__dunder__`` names on TVM objects without asking C++.

    TOPI's CUDA convolutions build numpy arrays of TE variables; numpy probes each for
    ``__array_interface__`` and the like, and TVM looks every probe up as a node field, which
    fails in C++: the first failure of a process loads backtrace symbols (0.14 s, most of a
    single convolution's extraction), each one after costs 0.1 ms. No node field is a dunder
    name, so the answer is the same ``AttributeError``.
    """
    return patched(Object, "__getattr__", _answered)


def pointers_made_cheaply() -> contextlib.AbstractContextManager[None]:
    """Make the ctypes pointer TVM's Cython FFI builds for every object it returns, and never
    uses, the cheap way.

    Each node, array or op that crosses the FFI first gets a ``ctypes.cast`` of its address to
    ``c_void_p``, which TVM drops (its ``make_ret_object``): 1 us of a 3-4 us field read, on
    the ~50,000 objects a transformer's extraction reads. Inside, the FFI module's ``ctypes``
    is ctypes itself but for ``cast``, which builds that one kind of pointer directly (the
    same value) and leaves any other cast to ctypes. Reference-counted like every patch here;
    nothing to do under TVM's ctypes FFI.
    """
    core = sys.modules.get("tvm._ffi._cy3.core")
    if core is None or vars(core).get("ctypes") is not ctypes:
        return contextlib.nullcontext()
    return patched(core, "ctypes", _CHEAP_CTYPES)


def _void_pointer(obj: Any, typ: Any) -> Any:
    if typ is ctypes.c_void_p and type(obj) is int:
        return ctypes.c_void_p(obj)
    return ctypes.cast(obj, typ)


_CHEAP_CTYPES = types.ModuleType("ctypes")
vars(_CHEAP_CTYPES).update(vars(ctypes))
_CHEAP_CTYPES.cast = _void_pointer  # type: ignore[attr-defined]


def _answered(self: Any, name: str) -> Any:
    # TVM's own lookup with the dunder test in front, in one frame: every field read runs it.
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"{type(self)} has no attribute {name}")
    if name == "handle":
        raise AttributeError("handle is not set")
    try:
        return _FIELD(self, name)
    except AttributeError:
        raise AttributeError(f"{type(self)} has no attribute {name}") from None


def node_key(node: Object) -> int:
    """The address of the C++ object behind ``node``: every Python handle of one node gives the
    same key, two live nodes never do (TVM's pointer hash is the address; a test checks). Read
    through the FFI in 0.1 us, against 0.6 us for ``node.handle.value``, which builds a ctypes
    pointer first: memos keyed by node read it for every node they visit."""
    key: int = _POINTER_HASH(node)
    return key


_POINTER_HASH = tvm.runtime._ffi_api.ObjectPtrHash
_FIELD = _node_api.NodeGetAttr
_ARRAY_SIZE = tvm.runtime._ffi_api.ArraySize
_ARRAY_ITEM = tvm.runtime._ffi_api.ArrayGetItem


def raw_data(const: relay.Constant) -> tvm.nd.NDArray:
    """A constant's NDArray, read without filling it (a deferred fold result's buffer is
    filled only on reads through ``data``; see :mod:`relay_tasks.optimize.placeholders`)."""
    data: tvm.nd.NDArray = Object.__getattr__(const, "data")
    return data


def items(array: Any) -> list[Any]:
    """A TVM ``Array``'s elements, one FFI call each and one for the size: iterating the Array
    itself asks for its size again before every element (a third of reading a call)."""
    return [_ARRAY_ITEM(array, i) for i in range(_ARRAY_SIZE(array))]


def call_parts(call: relay.Call) -> tuple[Any, list[Any]]:
    """A call's op and arguments, read straight through the FFI (the hot read of every walk)."""
    return _FIELD(call, "op"), items(_FIELD(call, "args"))


_OP_NAMES: dict[int, str] = {}


def op_name(op: tvm.ir.Op) -> str:
    """An op's name, read through TVM's FFI once per op (ops are registered for the life of the
    process, so the key names one op for good)."""
    key = node_key(op)
    name = _OP_NAMES.get(key)
    if name is None:
        name = _OP_NAMES[key] = str(op.name)
    return name


def callee_name(op: Any) -> str:
    """The name of what a call calls if it is an op; "" for a function or variable."""
    return op_name(op) if isinstance(op, tvm.ir.Op) else ""


class FunctionReads:
    """A function's nodes in post order, and each call's op and arguments, read once.

    Every read of a node's field is a call through TVM's FFI (1.7 us; an argument list 5 us),
    and the gates, screens and folds of the pipeline read the same calls of a function, which
    stays the same object while no pass rewrites it: seven walks in a row over the ONNX BERT.
    Within :func:`reads_shared` they share one of these per function.
    """

    def __init__(self, func: relay.Function) -> None:
        self.func = func
        self.nodes: list[Any] = []
        relay.analysis.post_order_visit(func, self.nodes.append)
        # By node key; each entry holds its node, so that no key is reused while it is here.
        self._calls: dict[int, tuple[relay.Call, Any, list[Any]]] = {}

    def _read(self, call: relay.Call) -> tuple[relay.Call, Any, list[Any]]:
        key = node_key(call)
        entry = self._calls.get(key)
        if entry is None:
            entry = self._calls[key] = (call, *call_parts(call))
        return entry

    def op(self, call: relay.Call) -> Any:
        return self._read(call)[1]

    def args(self, call: relay.Call) -> list[Any]:
        return self._read(call)[2]

    def op_name(self, node: Any) -> str:
        """The name of the op ``node`` calls; "" for anything but a call of an op."""
        if not isinstance(node, relay.Call):
            return ""
        return callee_name(self._read(node)[1])

    def children(self, node: Any) -> list[Any] | None:
        """:func:`children`, a call's read through this memo."""
        if isinstance(node, relay.Call):
            _, op, args = self._read(node)
            return [op, *args]
        return children(node)


#: The reads of the functions met last inside :func:`reads_shared` (None outside), newest last.
_SHARED: ContextVar[list[FunctionReads] | None] = ContextVar("relay_tasks_reads", default=None)
#: How many functions' reads are kept: the pipeline reads one function (``main``) at a time;
#: older versions are let go, with the constants only they hold.
_SHARED_FUNCTIONS = 4


@contextlib.contextmanager
def reads_shared() -> Iterator[None]:
    """Let everything inside share the reads of each function it looks at (:func:`reads_of`)."""
    token = _SHARED.set([])
    try:
        yield
    finally:
        _SHARED.reset(token)


def reads_of(func: relay.Function) -> FunctionReads:
    """``func``'s nodes and calls, read once per function inside :func:`reads_shared`."""
    shared = _SHARED.get()
    if shared is None:
        return FunctionReads(func)
    for reads in shared:
        if reads.func.same_as(func):
            return reads
    reads = FunctionReads(func)
    shared.append(reads)
    del shared[:-_SHARED_FUNCTIONS]
    return reads


def children(node: Any) -> list[Any] | None:
    """A node's children, each read once (every read of a field is a call through TVM's FFI):
    a call's op then its arguments, a tuple's fields, and so on; [] for a leaf, None for a
    node kind :func:`with_children` cannot rebuild (a ``Match``, a reference)."""
    if isinstance(node, (relay.Var, relay.Constant, tvm.ir.Op, relay.GlobalVar)):
        return []
    if isinstance(node, relay.Call):
        op, args = call_parts(node)
        return [op, *args]
    if isinstance(node, relay.Tuple):
        return items(_FIELD(node, "fields"))
    if isinstance(node, relay.TupleGetItem):
        return [node.tuple_value]
    if isinstance(node, relay.Function):
        return [node.body]
    if isinstance(node, relay.Let):
        return [node.value, node.body]
    if isinstance(node, relay.If):
        return [node.cond, node.true_branch, node.false_branch]
    return None


def with_children(node: Any, new: list[Any]) -> Any:
    """``node`` rebuilt over ``new`` children, given in the order of :func:`children`, as TVM's
    own mutators rebuild (its ``WithFields``: one FFI call, every other field kept, the checked
    type too until the next type inference; building a call from Python instead reads three
    fields and converts the arguments one by one, twice the cost)."""
    if isinstance(node, relay.Call):
        return _CALL_WITH(node, new[0], new[1:], None, None, None, None)
    if isinstance(node, relay.Tuple):
        return _TUPLE_WITH(node, new, None, None)
    if isinstance(node, relay.TupleGetItem):
        return _PROJECTION_WITH(node, new[0], None, None, None)
    if isinstance(node, relay.Function):
        return _FUNCTION_WITH(node, None, new[0], None, None, None, None, None)
    if isinstance(node, relay.Let):
        return _LET_WITH(node, None, new[0], new[1], None, None)
    assert isinstance(node, relay.If), type(node)
    return _IF_WITH(node, *new, None, None)


_CALL_WITH = tvm.get_global_func("relay.ir.CallWithFields")
_TUPLE_WITH = tvm.get_global_func("relay.ir.TupleWithFields")
_PROJECTION_WITH = tvm.get_global_func("relay.ir.TupleGetItemWithFields")
_FUNCTION_WITH = tvm.get_global_func("relay.ir.FunctionWithFields")
_LET_WITH = tvm.get_global_func("relay.ir.LetWithFields")
_IF_WITH = tvm.get_global_func("relay.ir.IfWithFields")


def rebuild(node: Any, get: Callable[[Any], Any]) -> Any:
    """``node`` with its children replaced by ``get(child)`` (``node`` itself when none changed);
    None for a node kind this cannot rebuild (a ``Match``, a reference)."""
    old = children(node)
    if not old:
        return node if old is not None else None
    new = [get(child) for child in old]
    if all(a.same_as(b) for a, b in zip(new, old, strict=True)):
        return node
    return with_children(node, new)


def static_shape(shape: Sequence[Any]) -> bool:
    """Whether every dimension of a Relay type's shape is a number (none is ``Any``)."""
    return all(isinstance(d, int) or hasattr(d, "value") for d in shape)
