"""A work dir's MetaSchedule database: written here in MetaSchedule's format, read back onto the
modules derived here, with index maps checked."""

from __future__ import annotations

import json

import pytest
import tvm
from tvm import meta_schedule as ms
from tvm import te, tir

from relay_tasks.adapters.meta_schedule import measurements
from relay_tasks.adapters.meta_schedule.database import WorkDatabase, workload_key
from relay_tasks.adapters.records import trace_problem

from zoo import HOST


def _module(scale: float) -> tvm.IRModule:
    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda i, j: a[i, j] * scale, name="B")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def _layouts(mod: tvm.IRModule) -> tir.Schedule:
    """A schedule with both instructions that carry index maps (tensorization writes them)."""
    sch = tir.Schedule(mod)
    block = sch.get_block("B")
    sch.transform_layout(block, ("write", 0), lambda i, j: (i // 4, j, i % 4))
    sch.transform_block_layout(block, lambda i, j: (j, i))
    return sch


def test_a_record_written_here_reads_back_here_and_in_metaschedule(tmp_path) -> None:
    mod, other = _module(2.0), _module(3.0)
    sch = _layouts(mod)
    database = WorkDatabase(tmp_path, [mod])
    workload = database.memory.commit_workload(mod)
    seconds = [tvm.tir.FloatImm("float32", 1e-3)]
    target = tvm.target.Target(HOST)
    database.commit(ms.database.TuningRecord(sch.trace, workload, seconds, target, None))

    line = json.loads((tmp_path / "database_tuning_record.json").read_text())
    assert line[0] == 0 and trace_problem(line[1][0]) is None  # the index maps pass the check
    [again] = WorkDatabase(tmp_path, [mod]).memory.get_all_tuning_records()
    replayed = tir.Schedule(mod)
    again.trace.apply_to_schedule(replayed, remove_postproc=False)
    assert tvm.ir.structural_equal(replayed.mod, sch.mod)
    theirs = ms.database.JSONDatabase(work_dir=str(tmp_path))  # MetaSchedule's reader
    assert len(theirs) == 1 and tvm.ir.structural_equal(
        theirs.query_ir_module(mod, target, "main"), sch.mod
    )
    assert len(WorkDatabase(tmp_path, [other]).memory.get_all_tuning_records()) == 0
    first = (tmp_path / "database_workload.json").read_text().split(",")[0]
    assert first == f'["{int(workload_key(mod), 16)}"'


def test_two_tunes_sharing_the_files_number_each_others_workloads(tmp_path) -> None:
    """Two databases open on one work dir (two tunes of different models, two tasks each),
    committing in turns: each record points at its own workload's line, whoever filed it."""
    mods = [_module(scale) for scale in (2.0, 3.0, 4.0, 5.0)]
    target = tvm.target.Target(HOST)
    seconds = [tvm.tir.FloatImm("float32", 1e-3)]
    mine, theirs = WorkDatabase(tmp_path, mods[:2]), WorkDatabase(tmp_path, mods[2:])
    order = [(theirs, mods[2]), (mine, mods[0]), (mine, mods[0]), (theirs, mods[3]),
             (mine, mods[1]), (theirs, mods[2]), (mine, mods[1]), (theirs, mods[3])]  # fmt: skip
    for database, module in order:
        workload = database.memory.commit_workload(module)
        trace = tir.Schedule(module).trace
        database.commit(ms.database.TuningRecord(trace, workload, seconds, target, None))
    assert [m.key for m in measurements(tmp_path)] == [workload_key(m) for _, m in order]
    assert len((tmp_path / "database_workload.json").read_text().splitlines()) == 4
    for module in mods:  # and each reads back only its own, replayed on its module
        assert len(WorkDatabase(tmp_path, [module]).memory.get_all_tuning_records()) == 2


def test_only_the_fastest_valid_records_of_each_task_are_replayed(tmp_path) -> None:
    """Replaying a record costs milliseconds: a database opened on a long history holds the
    ``keep`` fastest valid records of each task, never a failure, whatever else the files hold."""
    mod = _module(2.0)
    target = tvm.target.Target(HOST)
    writer = WorkDatabase(tmp_path, [mod])
    workload = writer.memory.commit_workload(mod)
    times = [5e-3, 1e10, 2e-3, 4e-3, 1e-3, 3e-3]  # 1e10: MetaSchedule's mark of a failure
    for seconds in times:
        run = [tvm.tir.FloatImm("float32", seconds)]
        writer.commit(
            ms.database.TuningRecord(tir.Schedule(mod).trace, workload, run, target, None)
        )
    kept = WorkDatabase(tmp_path, [mod], keep=2).memory.get_all_tuning_records()
    assert sorted(float(r.run_secs[0]) for r in kept) == pytest.approx([1e-3, 2e-3])
    every = WorkDatabase(tmp_path, [mod]).memory.get_all_tuning_records()
    assert len(every) == len(times) - 1
