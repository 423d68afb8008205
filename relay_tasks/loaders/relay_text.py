"""Relay text files (``mod.astext()``) and params files (``relay.save_param_dict``)."""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import relay
from tvm.ir import IRModule

from ..errors import ModelError
from ..ir import diagnostic_text, diagnostics
from .frontend import Params


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
