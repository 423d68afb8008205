"""Relay text files (``mod.astext()``) and params files (``relay.save_param_dict``)."""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import relay
from tvm.ir import IRModule

from ..errors import ModelError
from ..ir import diagnostic_text, diagnostics
from .frontend import DTypes, Params, Shapes, unknown_inputs


def load_relay_text(path: Path) -> IRModule:
    """Parse a Relay text file. Parsing builds IR only: nothing in the file is executed."""
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ModelError(f"{path}: cannot read the file as text ({err})") from err
    with diagnostics() as messages:
        try:
            return relay.parse(source, str(path))
        except tvm.TVMError as err:
            raise ModelError(
                f"{path}: not valid Relay text: {diagnostic_text(messages, err)}"
            ) from err


def load_params(path: Path) -> Params:
    """Read a params file written by ``relay.save_param_dict``."""
    try:
        blob = path.read_bytes()
    except OSError as err:
        raise ModelError(f"{path}: cannot read the params file ({err})") from err
    try:
        return dict(relay.load_param_dict(bytearray(blob)))
    except (tvm.TVMError, ValueError) as err:
        raise ModelError(f"{path}: not a params file written by relay.save_param_dict") from err


def with_input_types(path: Path, mod: IRModule, shapes: Shapes, dtypes: DTypes) -> IRModule:
    """``main`` with the named inputs retyped (``--input-shapes``), e.g. another batch size.

    Only inputs are retyped; whether the rest of the model fits is the type checker's to say.
    """
    main = mod["main"]
    names = [p.name_hint for p in main.params]
    unknown_inputs(path, [*shapes, *dtypes], names)
    retyped = {}
    for param in main.params:
        name = param.name_hint
        if name in shapes or name in dtypes:
            old = param.checked_type if param.type_annotation is None else param.type_annotation
            shape = shapes.get(name, [int(d) for d in old.shape])
            retyped[param] = relay.var(name, shape=shape, dtype=dtypes.get(name, old.dtype))
    params = [retyped.get(p, p) for p in main.params]
    body = relay.bind(main.body, dict(retyped.items()))
    func = relay.Function(params, body, None, main.type_params, main.attrs)
    result = IRModule(mod.functions, mod.type_definitions)
    result["main"] = func
    with diagnostics() as messages:
        try:
            return relay.transform.InferType()(result)
        except tvm.TVMError as err:
            raise ModelError(f"{path}: the model does not type-check with these input shapes: "
                             f"{diagnostic_text(messages, err)}") from err  # fmt: skip
