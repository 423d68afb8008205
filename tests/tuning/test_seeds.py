"""Seeds made from a work dir (``relay_tasks/tuning/seeds.py``), read back through the allowlist
of ``relay_tasks/adapters/meta_schedule/seeds.py``, and what a tune does with them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import tvm

from relay_tasks import host_target
from relay_tasks.adapters import get_adapter
from relay_tasks.adapters.base import Runner
from relay_tasks.adapters.meta_schedule import seeds as shipped
from relay_tasks.adapters.meta_schedule import session
from relay_tasks.errors import ModelError, UsageError
from relay_tasks.tuning.seeds import seeds_of
from relay_tasks.tuning.tune import tasks_in

from tuned_models import raw_measurements


def _decisions(task: Any, trace: Any) -> Any:
    """The decisions of ``trace`` (a seed's, as JSON) replayed on ``task``."""
    schedule = tvm.tir.Schedule(task.native.dispatched[0])
    tvm.tir.schedule.Trace.apply_json_to_schedule(trace, schedule)
    return json.loads(json.dumps(schedule.trace.as_json()[1], default=int))


def _record_decisions(work: Path) -> list[Any]:
    """The decisions of each record of ``work``, in the order measured."""
    lines = (work / "database_tuning_record.json").read_text().splitlines()
    return [json.loads(line)[1][0][1] for line in lines]


@pytest.fixture
def made(tuned: dict[str, Path], tmp_path: Path) -> tuple[Path, tuple[shipped.Seed, ...]]:
    """The tiny model's seeds from its tuned work dir, written as a family file and read back."""
    work = tuned["meta_schedule"]
    path = tmp_path / "x86-test.jsonl.gz"
    seeds = seeds_of([work], shipped.family(tasks_in(work).target) or "none")
    shipped.write_seeds(path, "x86-test", "the tests' tiny model", seeds)
    return path, shipped.read_seeds(path, "x86-test")


def test_seeds_for_a_family_come_only_from_tunes_for_it(tuned) -> None:
    """A work dir tuned for this host's CPU gives no seeds for another family's file."""
    with pytest.raises(
        UsageError, match=r"\(CPU family x86-avx(2|512)\): seeds for aarch64 come from tunes for"
    ):
        seeds_of([tuned["meta_schedule"]], "aarch64")


def test_a_tuned_task_ships_the_schedules_of_its_fastest_records(tuned, made) -> None:
    """A seed is its task's two fastest valid records, fastest first, less postprocessing:
    replayed on the task, each makes that record's decisions; no time goes with it."""
    work = tuned["meta_schedule"]
    [task] = tasks_in(work).tasks
    _, [seed] = made
    assert (seed.key, seed.stem) == (task.key, "fused_nn_dense_nn_relu")
    assert seed.sizes == ([(1, 32), (16, 32), (1, 16)], 2.0 * 16 * 32 + 16)  # dense, then relu
    timed = [(s, d) for (_, s), d in zip(raw_measurements(work, "meta_schedule"),
                                        _record_decisions(work), strict=True) if s is not None]  # fmt: skip
    fastest = [d for _, d in sorted(timed, key=lambda pair: pair[0])[:2]]
    assert [_decisions(task, trace) for trace in seed.traces] == fastest
    assert all(inst[0] != "EnterPostproc" for trace in seed.traces for inst in trace[0])


def test_a_task_with_no_records_first_measures_its_seed(tuned, made, tmp_path, monkeypatch) -> None:
    """A tune of the same task in an empty work dir, this family's seeds being the tiny model's:
    its first measurement is the seed's schedule, measured here (a record of its own, with its
    own time). ``seeds=False`` never looks for them."""
    [task] = tasks_in(tuned["meta_schedule"]).tasks
    _, seeds = made
    monkeypatch.setattr(session, "shipped_for", lambda target: seeds)
    adapter, work = get_adapter("meta_schedule"), tmp_path / "work"
    adapter.tune([task], host_target(), 1, work, Runner())
    assert _record_decisions(work)[0] == _decisions(task, seeds[0].traces[0])
    assert raw_measurements(work, "meta_schedule")[0][1] is not None
    assert adapter.seeded([task], host_target()) == 1

    monkeypatch.setattr(session, "shipped_for", lambda target: pytest.fail("seeds looked for"))
    adapter.tune([task], host_target(), 1, tmp_path / "without", Runner(), seeds=False)


def test_a_seed_of_the_very_task_goes_before_a_similar_tasks(tuned, made) -> None:
    """Nearest first: the seed whose shapes are the task's, then one of another shape."""
    [task] = tasks_in(tuned["meta_schedule"]).tasks
    _, [seed] = made
    other = seed._replace(key="0" * 16, sizes=([(8, 32), (16, 32), (8, 16)], 8192.0),
                          traces=(seed.traces[1],))  # fmt: skip
    starts = session._starts([task], [], [other, seed])
    assert starts == {task.key: [*seed.traces, *other.traces]}
    assert session._starts([task], [], [other]) == {task.key: list(other.traces)}


def _lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().splitlines()


def _forged(path: Path, lines: list[str]) -> Path:
    forged = path.with_name("x86-test.jsonl.gz")
    forged.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return forged


ATTACKS = {
    "a key that is a path": lambda row: {**row, "key": "../../etc/passwd"},
    "another field": lambda row: {**row, "run_secs": [1e-9]},
    "a stem with a space": lambda row: {**row, "stem": "fused nn"},
    "an instruction no search writes": lambda row: {
        **row, "traces": [[[["ExecuteCode", [], ["import os"], []]], []]]},
    "an index map that is another node": lambda row: {**row, "traces": [[[
        ["TransformLayout", [], [json.dumps({"root": 1, "nodes": [
            {"type_key": ""}, {"type_key": "runtime.Module", "attrs": {}}]})], []],
    ], []]]},
    "a negative extent": lambda row: {**row, "shapes": [[1, -32]]},
    "an extent that is true": lambda row: {**row, "shapes": [[True, 32]]},
    "a NaN FLOP count": lambda row: {**row, "flops": float("nan")},
    "three traces": lambda row: {**row, "traces": row["traces"] * 2},
}  # fmt: skip


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_seed_file_is_read_through_an_allowlist(made, attack) -> None:
    """Attack: each seed line forged one way, the rest as written; the file is refused, naming
    its line, before any trace of it reaches TVM."""
    path, _ = made
    header, line = _lines(path)
    row = ATTACKS[attack](json.loads(line))
    with pytest.raises(ModelError, match=r":2: "):
        shipped.read_seeds(_forged(path, [header, json.dumps(row)]), "x86-test")


def test_a_seed_file_of_another_family_or_past_its_size_is_refused(made, monkeypatch) -> None:
    """A file whose header names another family is not this one's; one that unpacks past
    ``MAX_BYTES`` is not read on (a gzip bomb in its place)."""
    path, _ = made
    with pytest.raises(ModelError, match=r":1: not a relay-tasks/seeds/1 file for x86-avx2"):
        shipped.read_seeds(path, "x86-avx2")
    monkeypatch.setattr(shipped, "MAX_BYTES", 100)
    with pytest.raises(ModelError, match="unpacks to more than 100 bytes"):
        shipped.read_seeds(path, "x86-test")


def test_a_damaged_shipped_file_says_how_to_tune_without_it(made, tmp_path, monkeypatch) -> None:
    """Bad luck: the family's file cut short (a broken install) is one error naming the file and
    the way on, not a traceback from gzip."""
    path, _ = made
    (tmp_path / "shipped").mkdir()
    (tmp_path / "shipped" / "x86-avx512.jsonl.gz").write_bytes(path.read_bytes()[:-20])
    monkeypatch.setattr(shipped, "SHIPPED", tmp_path / "shipped")
    shipped._shipped.cache_clear()
    target = tvm.target.Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512")
    try:
        with pytest.raises(ModelError, match=r"x86-avx512\.jsonl\.gz.*tune with --no-seeds"):
            shipped.shipped_for(target)
    finally:
        shipped._shipped.cache_clear()


@pytest.mark.parametrize(
    ("target", "family"),
    [
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512", "x86-avx512"),
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4", "x86-avx512"),
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell", "x86-avx2"),
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=znver3", "x86-avx2"),
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=core2", None),
        ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon", "aarch64"),
        ("llvm -mtriple=riscv64-unknown-linux-gnu", None),
        ("cuda -arch=sm_80", None),
    ],
)
def test_a_target_takes_the_seeds_of_its_cpu_family(target: str, family: str | None) -> None:
    assert shipped.family(tvm.target.Target(target)) == family


def test_every_shipped_seed_file_passes_the_allowlist() -> None:
    """The files in the package are read as any other: each whole, each task once."""
    files = sorted(shipped.SHIPPED.glob("*.jsonl.gz"))
    assert [f.name for f in files] == ["x86-avx512.jsonl.gz"]
    for path in files:
        seeds = shipped.read_seeds(path, path.name.removesuffix(".jsonl.gz"))
        assert len(seeds) > 50 and len({s.key for s in seeds}) == len(seeds)


def test_tune_says_how_many_tasks_start_from_seeds_and_no_seeds_leaves_them_out(
    tiny, tmp_path, monkeypatch, capsys
) -> None:
    """The supervisor names the tasks its tuner would start from shipped seeds, and hands the
    worker whether it may; ``--no-seeds`` says nothing and hands it no."""
    import dataclasses
    import importlib

    from relay_tasks.cli import main

    tuning = importlib.import_module("relay_tasks.tuning.tune")

    from tuned_models import tune_argv

    handed: list[bool] = []
    monkeypatch.setattr(tuning, "_run_worker", lambda *args: handed.append(args[-1]))
    seeding = dataclasses.replace(get_adapter("meta_schedule"), seeded=lambda tasks, target: 1)
    monkeypatch.setattr(tuning, "get_adapter", lambda tuner: seeding)
    said = "1 of 1 task to tune starts from schedules relay-tasks ships for this CPU family"
    for flags, seeds in [([], True), (["--no-seeds"], False)]:
        main([*tune_argv(tiny, "meta_schedule", tmp_path / f"work{seeds}", 1), *flags])
        assert handed.pop() is seeds
        assert (said in capsys.readouterr().err) is seeds
