"""What every file loader shares: the result type, input specs, and one way to report a failed
conversion by one of TVM's frontends."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tvm
from tvm.ir import IRModule

from ..errors import DependencyError, ModelError
from ..ir import diagnostic_text, diagnostics, patched
from .subpixel import subpixel_convolutions

Params = dict[str, tvm.nd.NDArray]
Shapes = Mapping[str, Sequence[int]]
DTypes = Mapping[str, str]


def require(module: str, missing: str) -> Any:
    """Import an optional frontend package, or raise one ``DependencyError`` (``missing`` says
    how to install it)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise DependencyError(missing) from err


def convert(
    source: str | Path,
    frontend: str,
    run: Callable[[], tuple[IRModule, Any]],
    *,
    unsupported_hint: str = "",
    failed_hint: str = "",
) -> tuple[IRModule, Params]:
    """Run a frontend converter; any failure becomes one ``ModelError`` naming the source, the
    cause and what the user can change (the hint for an op the frontend cannot convert, or for
    any other failure, appended).

    Transposed convolutions come back as convolutions (:mod:`.subpixel`): what every
    frontend gives there, TOPI runs several times slower.

    Frontends type-check what they build; where that fails, TVM reports through diagnostics and
    raises a generic "error diagnostics were emitted", so the diagnostics are what is shown.
    """
    with diagnostics() as messages, relax_left_unimported():
        try:
            mod, params = run()
        except (tvm.error.OpNotImplemented, NotImplementedError) as err:
            raise ModelError(
                f"{source}: TVM's {frontend} frontend cannot convert it: "
                f"{diagnostic_text(messages, err)}{unsupported_hint}"
            ) from err
        except Exception as err:
            raise ModelError(
                f"{source}: TVM's {frontend} frontend failed: {diagnostic_text(messages, err)}"
                f"{failed_hint}"
            ) from err
    return subpixel_convolutions(mod, dict(params.items()))


def relax_left_unimported() -> contextlib.AbstractContextManager[None]:
    """Calling a ``GlobalVar`` asks whether its arguments are Relax expressions, and asking
    imports ``tvm.relax``, whose TIR intrinsics are parsed from TVMScript on import: 4.5 s of
    a PyTorch conversion (the frontend's Prelude calls global functions 261 times). No Relax
    expression can exist in a process that never imported Relax, so the answer is "no" then
    without the import."""
    ask = tvm.ir.expr.is_relax_expr

    def is_relax_expr(expr: Any) -> bool:
        return "tvm.relax" in sys.modules and bool(ask(expr))

    return patched(tvm.ir.expr, "is_relax_expr", is_relax_expr)


def unknown_inputs(source: str | Path, given: Sequence[str], names: Sequence[str]) -> None:
    """Reject input shapes for names the model has no input of."""
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ModelError(
            f"{source}: no input named {', '.join(unknown)}; "
            f"the inputs are {', '.join(names) or '(none)'}"
        )
