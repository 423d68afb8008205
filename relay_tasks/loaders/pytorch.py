"""PyTorch models: TorchScript files, and ``torch.nn.Module`` / ``ScriptModule`` objects.

TVM's PyTorch frontend converts TorchScript graphs. A module object is traced here (eval mode,
no grad) from example inputs, or from zero tensors of the shapes given. ``torch`` is imported
only when a PyTorch model is loaded: it is an optional extra (``relay-tasks[torch]``), pinned to
the 2.2 line whose traced ops TVM 0.16's frontend maps.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm
from tvm.ir import IRModule

from ..errors import ModelError, describe_failure
from ..ir import patched
from .frontend import DTypes, Params, Shapes, convert, require
from .values import values_in_numpy

#: How to get a model from any torch version in: the frontend-neutral exchange format.
ONNX_WAY_IN = (
    "export it with torch.onnx.export(model, example_inputs, 'model.onnx') and load the .onnx"
)


def import_torch() -> Any:
    """``torch``, or one ``DependencyError`` naming the extra that installs it."""
    return require(
        "torch",
        "PyTorch models need torch: pip install 'relay-tasks[torch]' (torch 2.2.2, "
        f"torchvision 0.17.2, transformers 4.44.2); or {ONNX_WAY_IN}",
    )


def load_torchscript(
    path: Path, shapes: Shapes | None = None, dtypes: DTypes | None = None
) -> tuple[IRModule, Params]:
    """Convert a TorchScript file (``torch.jit.save``); ``shapes`` are required, in input order.

    A ``torch.save`` checkpoint is a pickle, and unpickling runs code, so it is refused before
    torch ever reads it.
    """
    torch = import_torch()
    _check_archive(path, torch)
    try:
        script = torch.jit.load(str(path), map_location="cpu")
    except Exception as err:
        raise ModelError(f"{path}: cannot load the TorchScript file: {_load_failure(err)}") from err
    return convert_script_module(script, shapes, dtypes, source=path)


def _check_archive(path: Path, torch: Any) -> None:
    """Screen the archive's code as torch will load it: its zip directory first (one folder,
    plain names, each once, code files within :data:`MAX_CODE_BYTES`: Python's ``zipfile``
    returns the last of two equal names, torch's reader the first), then every code file read
    through torch's own reader, then parsed against the allowlist. Anything it cannot read
    this way is refused, never skipped."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (OSError, zipfile.BadZipFile) as err:
        raise ModelError(
            f"{path}: not a TorchScript file (not a zip archive: {err}); save the model with "
            f"torch.jit.trace(model, example_inputs).save(path), or {ONNX_WAY_IN}"
        ) from err
    problem = _directory_problem(entries)
    if problem:
        raise ModelError(
            f"{path}: {problem}, which torch.jit.save never writes; save the model again with "
            "torch.jit.trace(model, example_inputs).save(path)"
        )
    names = [entry.filename.split("/", 1)[1] for entry in entries]
    if not any(name.startswith("code/") or name == "constants.pkl" for name in names):
        raise ModelError(
            f"{path}: a torch.save checkpoint, not TorchScript (relay-tasks does not unpickle "
            "model files: unpickling runs code); save the model with "
            f"torch.jit.trace(model, example_inputs).save(path), or {ONNX_WAY_IN}"
        )
    try:
        reader = torch._C.PyTorchFileReader(str(path))
        records = list(reader.get_all_records())
        code = {name: bytes(reader.get_record(name)) for name in records if _is_code(name)}
    except Exception as err:  # torch's reader raises RuntimeError on what it cannot read
        raise ModelError(f"{path}: cannot load the TorchScript file: {_load_failure(err)}") from err
    if sorted(code) != sorted(name for name in names if _is_code(name)):
        raise ModelError(f"{path}: torch's reader sees other code files than its zip directory "
                         "lists; save the model again")  # fmt: skip
    if any(len(source) > MAX_CODE_BYTES for source in code.values()):
        raise ModelError(f"{path}: a code file larger than its zip directory says; save the "
                         "model again")  # fmt: skip
    trees = {name: _parsed(source) for name, source in code.items()}
    methods = {n.name for tree in trees.values() if tree for n in ast.walk(tree)
               if isinstance(n, ast.FunctionDef)}  # fmt: skip
    for name, tree in trees.items():
        problem = _code_problem(tree, methods)
        if problem:
            raise ModelError(
                f"{path}: its TorchScript code ({name.removeprefix('code/')}) {problem}; "
                "relay-tasks loads only what TVM's PyTorch frontend converts (TorchScript is "
                f"code, and loading some of it runs it); {ONNX_WAY_IN}"
            )


#: TorchScript files hold each module's code as Python-like source; a model's is small.
MAX_CODE_BYTES = 16 * 2**20
#: A name inside the archive's folder (named after the file: any name but a way up), plain
#: components below it.
_ENTRY = re.compile(r"[^/\\\x00]{1,255}(/[A-Za-z0-9_.\-]{1,255}){1,63}\Z")


def _is_code(name: str) -> bool:
    """A module's source, as torch's reader names it (``code/__torch__/....py``)."""
    return name.startswith("code/") and name.endswith(".py")


def _directory_problem(entries: Sequence[zipfile.ZipInfo]) -> str | None:
    """Why a zip directory is not one ``torch.jit.save`` writes, or None."""
    if not entries:
        return "an empty archive"
    folder = entries[0].filename.split("/", 1)[0]
    seen: set[str] = set()
    for entry in entries:
        name = entry.filename
        parts = name.split("/")
        if not _ENTRY.match(name) or {".", ".."} & set(parts) or parts[0] != folder:
            return f"an entry {name[:60]!r} outside the archive's folder {folder[:60]!r}"
        if name in seen:
            return f"two entries named {name[:60]!r}"
        seen.add(name)
        if _is_code(name.split("/", 1)[1]) and entry.file_size > MAX_CODE_BYTES:
            return f"a code file of {entry.file_size:,} bytes ({name[:60]})"
    return None


#: Builtins the TorchScript serializer writes into traced and scripted modules.
_BUILTINS = frozenset(
    {"int", "float", "bool", "str", "len", "range", "annotate", "unchecked_cast",
     "uninitialized", "getattr", "isinstance", "print", "ops.prim.NumToTensor"}
)  # fmt: skip


def _parsed(source: bytes) -> ast.Module | None:
    try:
        return ast.parse(source.decode())
    except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
        return None


def _code_problem(tree: ast.Module | None, methods: set[str]) -> str | None:
    """What in one TorchScript source file is outside the allowlist, read with Python's ``ast``
    (parsed, never run): module classes only, no special methods (``__setstate__`` runs while
    the file loads), and calls only of operators the frontend converts, the serializer's
    builtins and the archive's own methods (``methods``)."""
    if tree is None:
        return "cannot be read"
    for node in tree.body:
        bases = [ast.unparse(b) for b in node.bases] if isinstance(node, ast.ClassDef) else []
        if bases != ["Module"]:
            return "defines something other than a module class"
    for found in ast.walk(tree):
        if isinstance(found, ast.FunctionDef) and found.name.startswith("__"):
            return f"defines {found.name}"
        if isinstance(found, ast.Call):
            called = _callee(found.func, methods)
            if called is not None:
                return f"calls {called[:60]}"
    return None


def _callee(func: ast.expr, methods: set[str]) -> str | None:
    """The name a call reaches when it is not on the allowlist; None when it is."""
    name = ast.unparse(func)
    if name in _BUILTINS:
        return None
    if isinstance(func, ast.Attribute):
        if func.attr in methods and not name.startswith(("torch.", "ops.")):
            return None  # a submodule's method: (self.conv).forward(x)
        for prefix, namespace in (("torch.", "aten"), ("ops.aten.", "aten"), ("ops.prim.", "prim")):
            if name.startswith(prefix):
                op = f"{namespace}::{func.attr}"
                return None if _converts(op) else f"{op}, which TVM's frontend cannot convert"
    return name


def _converts(op: str) -> bool:
    ops = _converted_ops()
    return op in ops or op.rstrip("_") in ops  # in-place variants convert as their op


@functools.cache
def _converted_ops() -> frozenset[str]:
    """The operators TVM's PyTorch frontend has a converter for (``aten::conv2d``, ...)."""
    return frozenset(_frontend().PyTorchOpConverter(None, "float32").convert_map)


def _frontend() -> Any:
    """TVM's PyTorch frontend module alone (see relay_tasks._deferred: the other frontends,
    hhb's TFLite one with its quantizer first, are not imported with it)."""
    return importlib.import_module("tvm.relay.frontend.pytorch")


_NEWER_FORMAT = re.compile(r"version (\d+), but the maximum supported version for reading is (\d+)")


def _load_failure(err: BaseException) -> str:
    found = _NEWER_FORMAT.search(str(err))
    if found is None:
        return describe_failure(err)
    torch = import_torch()
    return (
        f"it was saved by a newer PyTorch (file format {found[1]}; torch {torch.__version__}, "
        f"the version TVM's frontend needs, reads up to {found[2]}); {ONNX_WAY_IN}"
    )


def load_torch_module(
    module: Any,
    example_inputs: Any = None,
    *,
    shapes: Shapes | None = None,
    dtypes: DTypes | None = None,
) -> tuple[IRModule, Params]:
    """Trace a ``torch.nn.Module`` (or take a ``ScriptModule`` as it is) and convert it.

    A module is traced from ``example_inputs`` (a tensor or a tuple of tensors), or from zero
    tensors of ``shapes`` (and ``dtypes``, float32 by default); Relay inputs are named after the
    parameters of its ``forward`` unless ``shapes`` names them.
    """
    torch = import_torch()
    if isinstance(module, torch.jit.ScriptModule):
        if example_inputs is not None and shapes is None:
            examples = _as_tuple(example_inputs)
            shapes, dtypes = _specs_of(_named(_input_names(module), len(examples)), examples)
        return convert_script_module(module, shapes, dtypes, source=type(module).__name__)
    if not isinstance(module, torch.nn.Module):
        raise ModelError(
            f"expected a torch.nn.Module or torch.jit.ScriptModule, got {type(module).__name__}"
        )
    if example_inputs is None:
        if not shapes:
            raise ModelError(
                f"tracing {type(module).__name__} needs example_inputs or input shapes "
                "(shapes={'input': [1, 3, 224, 224]}, and dtypes for inputs that are not float32)"
            )
        example_inputs = tuple(
            torch.zeros(tuple(shape), dtype=getattr(torch, (dtypes or {}).get(name, "float32")))
            for name, shape in shapes.items()
        )
    examples = _as_tuple(example_inputs)
    if shapes is None:
        shapes, dtypes = _specs_of(_named(_forward_parameters(module), len(examples)), examples)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            traced = torch.jit.trace(module, examples)
    except Exception as err:
        raise ModelError(
            f"cannot trace {type(module).__name__}: {describe_failure(err)} (build Hugging Face "
            "models with torchscript=True in their config, so that they return tuples)"
        ) from err
    finally:
        module.train(was_training)
    return convert_script_module(traced, shapes, dtypes, source=type(module).__name__)


def convert_script_module(
    script: Any, shapes: Shapes | None, dtypes: DTypes | None, *, source: str | Path
) -> tuple[IRModule, Params]:
    """Convert a TorchScript module with TVM's PyTorch frontend."""
    expected = _input_names(script)
    if not shapes:
        wanted = " ".join(f"{name}:[...]" for name in expected)
        raise ModelError(
            f"{source}: PyTorch models need input shapes, in input order; "
            f"give --input-shapes '{wanted}' (add :int64 after a shape for token ids)"
        )
    if len(shapes) != len(expected):
        raise ModelError(
            f"{source}: the model takes {len(expected)} input(s) ({', '.join(expected)}), "
            f"--input-shapes gives {len(shapes)} ({', '.join(shapes)}); give one shape per input, "
            "in input order"
        )
    unknown = sorted(set(dtypes or {}) - set(shapes))
    if unknown:
        raise ModelError(f"{source}: a dtype for {', '.join(unknown)}, which has no input shape")
    infos = [
        (name, (list(shape), (dtypes or {}).get(name, "float32"))) for name, shape in shapes.items()
    ]
    given = " ".join(f"{name}:{list(shape)}" for name, shape in shapes.items())
    frontend = _frontend()
    with (
        _without_spans(),
        patched(frontend, "is_version_greater_than", _torch_newer_than),
        values_in_numpy(frontend),
        patched(frontend.PyTorchOpConverter, "infer_type", _infer_type(frontend)),
    ):
        return convert(
            source,
            "PyTorch",
            lambda: frontend.from_pytorch(script, infos),
            unsupported_hint=f"; replace the op, or {ONNX_WAY_IN}",
            failed_hint=f" (input shapes given: {given}; check them and their dtypes)",
        )


def _without_spans() -> tvm.transform.PassContext:
    """The current pass context without the frontend's span filling, TVM's own switch for it.

    The frontend walks each converted op's expression again to tag it with its source line
    (0.6 s of a 2-layer Llama's conversion). Spans are text for error messages: no pass and no
    task reads them, and ``structural_equal`` ignores them.
    """
    current = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=current.opt_level,
        required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass),
        config={**dict(current.config.items()), "relay.frontend.fill_span": False},
    )


def _infer_type(frontend: Any) -> Any:
    """The converter's ``infer_type``, typing a node alone where it reads nothing of a module.

    The frontend types each converted op's output as it goes (its ``_TypeFinder`` stands the
    parts already typed in for variables), in a module it first fills with all of the Prelude
    (the List ADT and its functions, about 100 definitions), then trims again: 1.3 ms a call
    and 0.4 s of a 4-layer Llama's conversion, for graphs that use none of them. A node that
    calls a global function, builds or matches an ADT value or has a variable of a type other
    than tensors and tuples of them is typed as the frontend types it; the others in a module
    of their own, where they get the same type.
    """
    relay = tvm.relay

    def infer_type(converter: Any, node: Any, mod: Any = None) -> Any:
        if node in converter.types:
            return converter.types[node]
        if isinstance(node, relay.Var):
            return node.type_annotation
        finder = frontend._TypeFinder(types=converter.types)
        body = finder.visit(node)
        func = relay.Function(list(finder.vars.values()), body)
        typed = IRModule({"main": func})
        if mod is not None and _reads_a_module(func):
            typed.update(mod)
            typed = relay.transform.RemoveUnusedFunctions()(typed)
        converter.types[node] = relay.transform.InferType()(typed)["main"].body.checked_type
        return converter.types[node]

    return infer_type


def _reads_a_module(func: tvm.relay.Function) -> bool:
    relay = tvm.relay
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, (relay.GlobalVar, relay.Constructor, relay.Match)) or (
            isinstance(node, relay.Var) and not _of_tensors(node.type_annotation)
        ):
            found.append(node)

    relay.analysis.post_order_visit(func, visit)
    return bool(found)


def _of_tensors(ttype: Any) -> bool:
    if ttype is None or isinstance(ttype, tvm.ir.TensorType):
        return True
    return isinstance(ttype, tvm.ir.TupleType) and all(_of_tensors(t) for t in ttype.fields)


def _torch_newer_than(version: str) -> bool:
    """The frontend's ``is_version_greater_than``, without its ``distutils`` import (which brings
    setuptools in: 0.35 s): release numbers compared as numbers, a local suffix dropped."""
    import torch

    def numbers(text: str) -> tuple[int, ...]:
        release = re.match(r"[\d.]*\d", text.split("+")[0])
        return tuple(int(part) for part in release.group().split(".")) if release else ()

    return numbers(str(torch.__version__)) > numbers(version)


def _input_names(script: Any) -> list[str]:
    """The graph's input names (without ``self``), as TorchScript spells them (``x.1`` -> x)."""
    return [value.debugName().split(".")[0] for value in list(script.graph.inputs())[1:]]


def _forward_parameters(module: Any) -> list[str]:
    try:
        return list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return []


def _named(names: Sequence[str], count: int) -> list[str]:
    """Names for ``count`` example inputs: the model's own, then ``input<i>`` for any extra (the
    input-count check then names the mismatch)."""
    return [*names[:count], *(f"input{i}" for i in range(len(names), count))]


def _as_tuple(example_inputs: Any) -> tuple[Any, ...]:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _specs_of(names: Sequence[str], examples: Sequence[Any]) -> tuple[Shapes, DTypes]:
    pairs = list(zip(names, examples, strict=True))
    shapes = {name: list(t.shape) for name, t in pairs}
    dtypes = {name: str(t.dtype).removeprefix("torch.") for name, t in pairs}
    return shapes, dtypes
