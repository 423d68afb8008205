"""The index beside a work dir's records: the same tally as a full read, kept up to date by
reading only the lines appended since, rebuilt when stale, never trusted for a record."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from relay_tasks.adapters.base import Line, Measurement, RecordFiles, TunerTask
from relay_tasks.adapters.index import KEEP, history, records_at, records_of, tally, tally_of
from relay_tasks.errors import ModelError

FILES = RecordFiles("log", "causes")


class Reader:
    """A tuner's reader over lines ``{"k": key, "s": seconds or null, "e": name}``, counting
    the lines it was handed: what a command's cost grows with."""

    def __init__(self) -> None:
        self.read = 0

    def __call__(self, work_dir: Path, lines: Iterable[Line]) -> Iterator[Measurement]:
        for line in lines:
            self.read += 1
            if "k" not in line.value:
                raise ModelError(f"line {line.number}: not a record")
            yield Measurement(line.value["k"], line.value["s"], line.value.get("e", ""))


def _append(folder: Path, rows: list[tuple[str, float | None]]) -> None:
    with (folder / "log").open("a") as log, (folder / "causes").open("a") as causes:
        for key, seconds in rows:
            log.write(json.dumps({"k": key, "s": seconds, "e": "" if seconds else "RUN"}) + "\n")
            if seconds is None:
                causes.write(json.dumps({"error": f"cause of {key}"}) + "\n")


def _same(got, want) -> None:
    """Two tallies hold the same counts, causes and fastest records."""
    assert set(got.tasks) == set(want.tasks)
    for key, mine in got.tasks.items():
        theirs = want.tasks[key]
        assert (mine.valid, mine.failed, mine.first_error, mine.causes) == (
            theirs.valid, theirs.failed, theirs.first_error, theirs.causes)  # fmt: skip
        assert [(s, n) for s, n, _ in mine.best] == [(s, n) for s, n, _ in theirs.best]


ROWS = [("a", 3e-3), ("b", 1e-3), ("a", None), ("a", 1e-3), ("c", 1e-4), ("a", 2e-3), ("a", 1e-3)]


def test_the_index_reads_only_what_was_appended_since_and_agrees_with_a_full_read(
    tmp_path,
) -> None:
    """A work dir's second look reads no record line; after an append it reads the new lines
    only; each time the tally equals the one a full read of every record gives."""
    _append(tmp_path, ROWS)
    reader = Reader()
    first = tally(reader, tmp_path, FILES)
    assert reader.read == len(ROWS) and (tmp_path / "log.index").exists()
    _same(first, tally_of(history(Reader(), tmp_path, FILES)))
    assert first.of("a").causes == {"RUN: cause of a": 1} and first.last == "a"

    reader = Reader()
    _same(tally(reader, tmp_path, FILES), first)
    assert reader.read == 0

    _append(tmp_path, [("b", None), ("b", 5e-4)])
    reader = Reader()
    grown = tally(reader, tmp_path, FILES)
    assert reader.read == 2
    _same(grown, tally_of(history(Reader(), tmp_path, FILES)))
    assert grown.of("b").best[0][0] == 5e-4 and grown.of("b").first_error == "RUN: cause of b"


def test_a_task_keeps_its_fastest_records_by_offset(tmp_path) -> None:
    """Of more than ``KEEP`` valid records, a task's tally keeps the fastest ``KEEP``, each
    at the byte its line starts."""
    _append(tmp_path, [("a", (KEEP + 10 - i) * 1e-6) for i in range(KEEP + 10)])
    summed = tally(Reader(), tmp_path, FILES)
    assert summed.of("a").valid == KEEP + 10 and len(summed.of("a").best) == KEEP
    data = (tmp_path / "log").read_bytes()
    for seconds, number, offset in summed.of("a").best[:3]:
        line = data[offset : data.index(b"\n", offset)]
        assert json.loads(line)["s"] == seconds and data[:offset].count(b"\n") == number - 1


def test_records_of_hold_each_tasks_fastest_valid_records_in_the_logs_order(tmp_path) -> None:
    """What a build decodes again (AutoTVM and Ansor parse every line they are given): per
    task of the build, its ``keep`` fastest valid records, in the log's order; no failure, no
    record of another model's task."""
    _append(tmp_path, ROWS)
    tasks = [TunerTask(name, 1, "op", name, None) for name in ("a", "b")]
    with records_of(Reader(), FILES, tasks, tmp_path, keep=2) as log:
        kept = [json.loads(line) for line in log.read_text().splitlines()]
    lines = (tmp_path / "log").read_text().splitlines()
    assert kept == [json.loads(lines[i]) for i in (1, 3, 6)]  # a's two at 1 ms, b's one


def _edited(log: Path) -> None:
    log.write_text(log.read_text().replace("0.003", "0.004"))


def _shrunk(log: Path) -> None:
    log.write_text("".join(log.read_text().splitlines(True)[2:]))


@pytest.mark.parametrize("change", [_edited, _shrunk])
def test_a_stale_index_is_built_again_from_the_records(change, tmp_path) -> None:
    """Records rewritten under the index (a prune, an edit, another work dir copied over):
    the index no longer matches its digest of them, and the tally is read anew."""
    _append(tmp_path, ROWS)
    tally(Reader(), tmp_path, FILES)
    change(tmp_path / "log")
    reader = Reader()
    _same(tally(reader, tmp_path, FILES), tally_of(history(Reader(), tmp_path, FILES)))
    assert reader.read == len((tmp_path / "log").read_text().splitlines())


def test_a_forged_index_is_never_trusted_for_a_record(tmp_path) -> None:
    """An index is data from the work dir: one pointing a task's best into the middle of a
    line is found out when the record is read (no line starts there); the records are then
    read in full and the index dropped. One of another shape is rebuilt."""
    _append(tmp_path, ROWS)
    tally(Reader(), tmp_path, FILES)
    index = tmp_path / "log.index"
    document = json.loads(index.read_text())
    number, offset = document["tasks"]["b"][4][0][1:]
    document["tasks"]["b"][4][0][2] = offset + 3
    index.write_text(json.dumps(document))
    spots = tally(Reader(), tmp_path, FILES).fastest(["b"], 1)
    assert spots == [(number, offset + 3)]
    read = records_at(Reader(), tmp_path, FILES, spots)
    assert [(line.number, m.key, m.seconds) for line, m in read] == [(number, "b", 1e-3)]
    assert not index.exists()

    index.write_text(json.dumps({"format": 1, "tasks": "everything"}))
    reader = Reader()
    _same(tally(reader, tmp_path, FILES), tally_of(history(Reader(), tmp_path, FILES)))
    assert reader.read == len(ROWS)


def test_a_work_dir_that_cannot_be_written_is_tallied_without_an_index(
    tmp_path, monkeypatch
) -> None:
    """Records shipped to another machine on a read-only mount: the tally is read, nothing is
    written there (the index's temporary file cannot be made)."""
    from relay_tasks.adapters import index

    def read_only(**_: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(index.tempfile, "mkstemp", read_only)
    _append(tmp_path, ROWS)
    _same(tally(Reader(), tmp_path, FILES), tally_of(history(Reader(), tmp_path, FILES)))
    assert not (tmp_path / "log.index").exists()


def test_a_cut_last_line_is_left_for_later(tmp_path) -> None:
    """A line being written (or cut by a crash) is not indexed: once whole, it is read."""
    _append(tmp_path, ROWS)
    with (tmp_path / "log").open("a") as log:
        log.write('{"k": "c", "s": 5e-5')
    assert tally(Reader(), tmp_path, FILES).of("c").valid == 1
    with (tmp_path / "log").open("a") as log:
        log.write(', "e": ""}\n')
    assert tally(Reader(), tmp_path, FILES).of("c").best[0][0] == 5e-5
