"""Several processes appending to one work dir: every line whole, none lost, and a record's
failure cause in the same order in its file as the record in the log."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from relay_tasks.adapters.journal import LOCK_FILE, append, set_aside_cut_line
from relay_tasks.errors import DamagedRecordWarning, TuningError

WRITERS, BATCHES = 4, 150


def _write(work_dir: str, writer: int) -> None:
    """A tuner's batches: a few records (one failed, with a long cause), its cause beside."""
    for batch in range(BATCHES):
        ids = [f"{writer}-{batch}-{k}" for k in range(3)]
        records = [json.dumps({"id": i, "pad": "x" * 3000}) for i in ids]
        causes = [json.dumps({"error": ids[1], "pad": "y" * 5000})]
        append(Path(work_dir), [("log", records), ("errors", causes)])


def test_concurrent_writers_keep_every_record_and_its_cause_in_order(tmp_path) -> None:
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write, args=(str(tmp_path), w)) for w in range(WRITERS)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
        assert process.exitcode == 0
    log = [json.loads(line)["id"] for line in (tmp_path / "log").read_text().splitlines()]
    errors = [json.loads(line)["error"] for line in (tmp_path / "errors").read_text().splitlines()]
    assert len(log) == len(set(log)) == WRITERS * BATCHES * 3  # none lost, none twice
    assert errors == [i for i in log if i.endswith("-1")]  # each failure's cause, in its order


def test_a_line_a_dead_writer_cut_is_set_aside_before_the_next_append(tmp_path) -> None:
    log = tmp_path / "log"
    log.write_text('{"id": 1}\n{"id": 2, "cu')
    with pytest.warns(DamagedRecordWarning, match=r"log, line 2: cut short"):
        append(tmp_path, [("log", ['{"id": 3}'])])
    assert log.read_text() == '{"id": 1}\n{"id": 3}\n'
    assert (tmp_path / "log.damaged").read_text() == '{"id": 2, "cu\n'


def test_a_whole_record_missing_only_its_newline_is_kept(tmp_path) -> None:
    log = tmp_path / "log"
    log.write_text('{"id": 1}\n{"id": 2}')
    set_aside_cut_line(log)
    assert log.read_text() == '{"id": 1}\n{"id": 2}\n'
    assert not (tmp_path / "log.damaged").exists()


def test_the_lock_is_never_followed_out_of_the_work_dir(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep")
    work = tmp_path / "work"
    work.mkdir()
    (work / LOCK_FILE).symlink_to(elsewhere)
    with pytest.raises(TuningError, match="is a symbolic link; remove it"):
        append(work, [("log", ["{}"])])
    assert elsewhere.read_text() == "keep" and not (work / "log").exists()
