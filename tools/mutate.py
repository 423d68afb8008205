"""Mutation testing: mutmut over each core module with that module's fast tests.

    ./dev mutate                                  every module in TARGETS
    ./dev mutate relay_tasks/optimize/fold.py --children 2 one module, two mutants at a time

Each module runs in its own scratch copy of the repository (under ``--work``), because mutmut
reads one test selection per run from ``pyproject.toml``. Prints, per module, how many mutants
the tests kill and the diff of every one that survives; ``--json`` writes the figures.
A survivor is either a missing test or a change nobody can observe; docs/testing.md
says how the latter are judged.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: The adapters' equality rows on ResNet-18 take most of a run, and the small graphs run the same
#: adapter code.
NOT_THE_ZOO = ["-k", "not resnet"]

#: Each module with the tests written for it (the fast ones: no model-zoo comparison marked slow).
TARGETS: dict[str, list[str]] = {
    "relay_tasks/lowering/extract.py": ["tests/lowering/test_extract.py"],
    "relay_tasks/optimize/pipeline.py": [
        "tests/optimize/test_pipeline.py",
        "tests/lowering/test_extract.py",
    ],
    "relay_tasks/optimize/fold.py": ["tests/optimize/test_fold.py"],
    "relay_tasks/optimize/evaluate.py": ["tests/optimize/test_fold.py"],
    "relay_tasks/optimize/placeholders.py": ["tests/optimize/test_fold.py"],
    "relay_tasks/export.py": ["tests/test_export.py"],
    "relay_tasks/dropin.py": ["tests/test_dropin.py", "-k", "not tuning_script"],
    "relay_tasks/cli.py": ["tests/test_cli.py"],
    # An adapter's task encoding is tested through the task files it writes.
    "relay_tasks/adapters/meta_schedule.py": [
        "tests/adapters/test_meta_schedule.py",
        "tests/test_export.py",
        *NOT_THE_ZOO,
    ],
    "relay_tasks/adapters/autotvm.py": [
        "tests/adapters/test_autotvm.py",
        "tests/test_export.py",
        "tests/test_model_kinds.py::test_autotvm_names_the_dynamic_shape_where_upstream_fails",
        "tests/test_model_kinds.py::test_autotvm_names_a_dynamic_shape_a_layout_hook_traced",
        *NOT_THE_ZOO,
    ],
    "relay_tasks/adapters/ansor.py": [
        "tests/adapters/test_ansor.py",
        "tests/adapters/test_meta_schedule.py::test_search_effort_grows_with_the_budget_within_upstreams_defaults",
        "tests/test_export.py",
        "tests/test_model_kinds.py::test_ansor_on_dynamic_shapes_equals_upstream",
        "tests/test_model_kinds.py::test_ansor_keeps_a_function_that_reads_only_a_dynamic_inputs_shape",
        *NOT_THE_ZOO,
    ],
}

#: Seconds one test may take under a mutant (the slowest, a tuning test, takes about 30).
TEST_TIMEOUT = 120

_KILLED = {"killed", "timeout", "segfault", "caught by type check"}


def _scratch(module: str, tests: list[str], work: Path) -> Path:
    """A copy of the tracked files with mutmut told which module to mutate and which tests run."""
    where = work / module.replace("/", "_").removesuffix(".py")
    shutil.rmtree(where, ignore_errors=True)
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    for name in files:
        if (REPO / name).is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, where / name)
    config = {
        "source_paths": [module],
        "also_copy": ["tests/", "bench/", "tools/", "relay_tasks/", "README.md"],
        # A mutant can leave a tuner waiting forever, which no CPU-time limit ends.
        "pytest_add_cli_args": [
            "-n",
            "0",
            "-p",
            "no:randomly",
            "-q",
            "-m",
            "not slow",
            "--timeout",
            str(TEST_TIMEOUT),
            "--timeout-method",
            "thread",
        ],
        "pytest_add_cli_args_test_selection": tests,
    }
    lines = [
        "",
        "[tool.mutmut]",
        *(f"{key} = {json.dumps(value)}" for key, value in config.items()),
    ]
    with open(where / "pyproject.toml", "a") as handle:
        handle.write("\n".join(lines) + "\n")
    return where


def _statuses(where: Path) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code

    result: dict[str, str] = {}
    for meta in (where / "mutants").rglob("*.meta"):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        result.update({name: status_by_exit_code[code] for name, code in codes.items()})
    return result


def _diff(where: Path, name: str) -> str:
    shown = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", name], cwd=where, capture_output=True, text=True
    ).stdout
    return "\n".join(
        line for line in shown.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")
    )


def mutate(module: str, work: Path, children: int, resume: bool = False) -> dict[str, object]:
    where = work / module.replace("/", "_").removesuffix(".py")
    if not (resume and where.is_dir()):
        where = _scratch(module, TARGETS[module], work)
    subprocess.run(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)],
        cwd=where, stdout=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    statuses = _statuses(where)
    counts = Counter(statuses.values())
    killed = sum(counts[s] for s in _KILLED)
    survivors = sorted(n for n, s in statuses.items() if s not in _KILLED)
    print(f"\n## {module}: {killed}/{len(statuses)} killed ({killed / max(len(statuses), 1):.1%})")
    print("   " + ", ".join(f"{status} {count}" for status, count in sorted(counts.items())))
    for name in survivors:
        if statuses[name] != "not checked":  # mutmut stopped before it (e.g. a failing test)
            print(f"\n{name} ({statuses[name]})\n{_diff(where, name)}")
    return {"killed": killed, "total": len(statuses), "survivors": survivors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"any of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--children", type=int, default=2, help="mutants run at once")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/relay-tasks-mutants")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--resume", action="store_true", help="go on with a module's stopped run where it stopped"
    )
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"not a module with a mutation target: {', '.join(unknown)}")
    results = {m: mutate(m, args.work, args.children, args.resume) for m in args.modules or TARGETS}
    killed = sum(int(r["killed"]) for r in results.values())  # type: ignore[call-overload]
    total = sum(int(r["total"]) for r in results.values())  # type: ignore[call-overload]
    print(f"\nall: {killed}/{total} killed ({killed / max(total, 1):.1%})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
