"""Run existing tuning scripts on the shared backend without changing a line of them.

:func:`install` replaces upstream's three extraction entry points with wrappers of the same
signature and return type; :func:`uninstall` (or leaving :func:`installed`) puts the originals
back. Calls that use an option the backend does not model (pass instruments, extra Ansor targets)
go to the original function, so an installed drop-in never changes what a script can do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .adapters import ansor, autotvm, meta_schedule
from .errors import RelayTasksError

_originals: dict[tuple[str, str], Any] = {}


def install() -> None:
    """Make upstream's task extractors run on relay-tasks (idempotent)."""
    import importlib

    for module_path, name, wrap in _ENTRY_POINTS:
        module = importlib.import_module(module_path)
        key = (module_path, name)
        if key in _originals:
            continue
        original = getattr(module, name)
        _originals[key] = original
        setattr(module, name, wrap(original))


def uninstall() -> None:
    """Restore upstream's own task extractors (idempotent)."""
    import importlib

    for (module_path, name), original in list(_originals.items()):
        setattr(importlib.import_module(module_path), name, original)
        del _originals[(module_path, name)]


def is_installed() -> bool:
    return bool(_originals)


@contextmanager
def installed() -> Iterator[None]:
    """``with relay_tasks.installed(): ...`` runs the block on relay-tasks, then restores."""
    was_installed = is_installed()
    install()
    try:
        yield
    finally:
        if not was_installed:
            uninstall()


def _upstream_errors(extract: Callable[..., Any]) -> Callable[..., Any]:
    """Scripts written for upstream catch ``tvm.TVMError``: relay-tasks' own errors reach them
    as classes that are both (a ``ModelError`` that is also a ``TVMError``), same message."""

    @functools.wraps(extract)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return extract(*args, **kwargs)
        except RelayTasksError as err:
            raise _also_tvm_error(type(err))(*err.args) from err

    return call


def _also_tvm_error(cls: type[RelayTasksError]) -> type[RelayTasksError]:
    import tvm

    if cls not in _BOTH:
        _BOTH[cls] = type(cls.__name__, (cls, tvm.TVMError), {"__module__": cls.__module__})
    return _BOTH[cls]


_BOTH: dict[type[RelayTasksError], type[RelayTasksError]] = {}


def _bound_by_name(mod: Any, params: Any) -> Any:
    """The params upstream would bind: those naming a parameter of ``main``.

    Upstream's ``bind_params_by_name`` skips the others without a word, and scripts rely on it
    (MetaSchedule's ``get_network`` traces torchvision models in training mode, which leaves
    BatchNorm counters among the params). The house API warns about such params, and refuses
    params of which none match; the drop-in keeps upstream's outcome by handing on only the
    matching ones. Anything it cannot read is handed on as is, for the house checks to name.
    """
    from tvm import relay
    from tvm.ir import IRModule

    main = mod
    if isinstance(mod, IRModule):
        main = mod["main"] if any(v.name_hint == "main" for v in mod.get_global_vars()) else None
    if not isinstance(main, relay.Function) or not hasattr(params, "items"):
        return params
    names = {var.name_hint for var in main.params}
    return {k: v for k, v in params.items() if not isinstance(k, str) or k in names}


def _meta_schedule(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def extract_tasks(
        mod: Any,
        target: Any,
        params: Any,
        *,
        opt_level: int = 3,
        pass_config: Any = meta_schedule.DEFAULT_PASS_CONFIG,
        executor: Any = None,
        runtime: Any = None,
        module_equality: str = "structural",
        disabled_pass: Any = None,
        instruments: Sequence[Any] | None = None,
    ) -> Any:
        if instruments:
            return original(
                mod, target, params, opt_level=opt_level, pass_config=pass_config,
                executor=executor, runtime=runtime, module_equality=module_equality,
                disabled_pass=disabled_pass, instruments=instruments,
            )  # fmt: skip
        return _upstream_errors(meta_schedule.extract_task_from_relay)(
            mod,
            target,
            _bound_by_name(mod, params),
            opt_level=opt_level,
            pass_config=pass_config,
            disabled_pass=disabled_pass,
            module_equality=module_equality,
            executor=executor,
        )

    return extract_tasks


def _autotvm_single(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def extract_from_program(
        mod: Any, params: Any, target: Any, target_host: Any = None, ops: Any = None
    ) -> Any:
        return _upstream_errors(autotvm.extract_tasks)(
            mod, target, _bound_by_name(mod, params), ops=ops, target_host=target_host
        )

    return extract_from_program


def _autotvm_multiple(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def extract_from_multiple_program(
        mods: Any, params: Any, target: Any, target_host: Any = None, ops: Any = None
    ) -> Any:
        pairs = list(zip(mods, params, strict=False))  # upstream zips, so the shorter list rules
        return _upstream_errors(autotvm.extract_tasks_from_models)(
            [m for m, _ in pairs],
            target,
            [_bound_by_name(m, p) for m, p in pairs],
            ops=ops,
            target_host=target_host,
        )

    return extract_from_multiple_program


def _ansor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def extract_tasks(
        mod: Any,
        params: Any,
        target: Any,
        target_host: Any = None,
        hardware_params: Any = None,
        include_simple_tasks: bool = False,
        dump_workload_to_dag_log: Any = None,
        opt_level: int = 3,
        other_targets: Any = None,
    ) -> Any:
        if other_targets:
            return original(
                mod, params, target, target_host, hardware_params, include_simple_tasks,
                dump_workload_to_dag_log, opt_level, other_targets,
            )  # fmt: skip
        return _upstream_errors(ansor.extract_tasks)(
            mod,
            target,
            _bound_by_name(mod, params),
            target_host=target_host,
            hardware_params=hardware_params,
            include_simple_tasks=include_simple_tasks,
            dump_workload_to_dag_log=dump_workload_to_dag_log,
            opt_level=opt_level,
        )

    return extract_tasks


#: Every upstream entry point the drop-in replaces: (module, attribute, wrapper factory). The
#: AutoTVM and Ansor functions are also re-exported one package up, so both names are replaced.
_ENTRY_POINTS: tuple[tuple[str, str, Callable[[Callable[..., Any]], Callable[..., Any]]], ...] = (
    ("tvm.meta_schedule.relay_integration", "extract_tasks", _meta_schedule),
    ("tvm.autotvm.task.relay_integration", "extract_from_program", _autotvm_single),
    ("tvm.autotvm.task.relay_integration", "extract_from_multiple_program", _autotvm_multiple),
    ("tvm.autotvm.task", "extract_from_program", _autotvm_single),
    ("tvm.autotvm.task", "extract_from_multiple_program", _autotvm_multiple),
    ("tvm.auto_scheduler.relay_integration", "extract_tasks", _ansor),
    ("tvm.auto_scheduler", "extract_tasks", _ansor),
)
