"""Load models: built-in zoo names and Relay text files (with an optional params file).

Each loader returns ``(IRModule, params)``; every failure is a :class:`ModelError` that names the
file and the cause.
"""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import relay
from tvm.ir import IRModule

from .errors import ModelError
from .inputs import diagnostic_text, diagnostics
from .zoo import MODELS, load_zoo_model

Params = dict[str, tvm.nd.NDArray]

RELAY_SUFFIXES = (".relay", ".txt", ".rly")


def load_model(source: str | Path, *, params: str | Path | None = None) -> tuple[IRModule, Params]:
    """Load a model by built-in name or from a Relay text file.

    Parameters
    ----------
    source : str or pathlib.Path
        A built-in model name (see ``relay_tasks.zoo.MODELS``) or a Relay text file.
    params : str or pathlib.Path, optional
        A params file written by ``relay.save_param_dict``; for Relay text only.
    """
    text = str(source)
    if text in MODELS and not Path(text).exists():
        if params is not None:
            raise ModelError(f"built-in model {text!r} brings its own params; drop --params")
        return load_zoo_model(text)
    path = Path(text)
    if not path.exists():
        raise ModelError(
            f"{text}: no such file, and not a built-in model (built-ins: {', '.join(MODELS)})"
        )
    mod = load_relay_text(path)
    return mod, load_params(Path(params)) if params is not None else {}


def load_relay_text(path: Path) -> IRModule:
    """Parse a Relay text file (as written by ``mod.astext()``)."""
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
