"""Nothing placed in a work dir runs: the tuning processes import and unpickle nothing from it,
and write nothing outside it through a link or a task name."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from relay_tasks.cli import main

from tuned_models import TUNERS, tune_argv, valid_count

LOGS = {"meta_schedule": "database_tuning_record.json", "autotvm": "autotvm.log",
        "ansor": "ansor.json"}  # fmt: skip


class _Planted:
    """Unpickling this writes the marker: what a crafted pickle cache entry would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def _plant(work: Path, marker: Path) -> None:
    """A module named as the package and a pickle cache with a crafted winograd entry."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "relay_tasks.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    cache = work / ".pkl_memoize_py3"
    cache.mkdir()
    for key in ("topi.nn.winograd_matrices", "topi.nn.winograd_util"):
        (cache / f"{key}.pkl").write_bytes(pickle.dumps({"x": _Planted(marker)}))


@pytest.mark.parametrize("tuner", ["autotvm"])
def test_nothing_in_the_work_dir_is_imported_or_unpickled(tuner, tiny, tmp_path) -> None:
    """AutoTVM starts builders and an RPC server: none of them runs from the work dir."""
    work, marker = tmp_path / "work", tmp_path / "ran"
    _plant(work, marker)
    before = {p.name for p in (work / ".pkl_memoize_py3").iterdir()}
    assert main(tune_argv(tiny, tuner, work, 2)) == 0
    assert valid_count(work, tuner) == 2
    assert not marker.exists()
    assert {p.name for p in (work / ".pkl_memoize_py3").iterdir()} == before  # none written


@pytest.mark.parametrize("tuner", TUNERS)
def test_a_log_that_is_a_link_is_refused_not_followed(tuner, tiny, tuned, tmp_path, capsys):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere.txt"
    shutil.copytree(tuned[tuner], work)
    elsewhere.write_text("the user's file\n")
    log = work / LOGS[tuner]
    log.unlink()
    log.symlink_to(elsewhere)
    assert main(tune_argv(tiny, tuner, work, 5)) == 7
    err = capsys.readouterr().err
    assert f"{log} is a symbolic link; a work dir's records are written only inside it" in err
    assert elsewhere.read_text() == "the user's file\n"


def test_the_tune_log_is_not_followed_out_of_the_work_dir(tiny, tuned, tmp_path, capsys):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere.txt"
    shutil.copytree(tuned["ansor"], work)
    elsewhere.write_text("the user's file\n")
    (work / "tune.log").unlink()
    (work / "tune.log").symlink_to(elsewhere)
    assert main(tune_argv(tiny, "ansor", work, 5)) == 7
    assert "tune.log: it is a symbolic link" in capsys.readouterr().err
    assert elsewhere.read_text() == "the user's file\n"


def test_a_task_name_does_not_place_files_outside_the_work_dir(tmp_path) -> None:
    from relay_tasks.adapters.meta_schedule import _file_part

    assert _file_part("../../etc/x") == "______etc_x"
    assert _file_part("fused_nn_dense_add") == "fused_nn_dense_add"


def test_a_cut_line_is_not_set_aside_through_a_link(tiny, tuned, tmp_path, capsys) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere.txt"
    shutil.copytree(tuned["autotvm"], work)
    elsewhere.write_text("the user's file\n")
    log = work / LOGS["autotvm"]
    log.write_text(log.read_text()[:-20])  # a cut last line
    (work / f"{log.name}.damaged").symlink_to(elsewhere)
    assert main(tune_argv(tiny, "autotvm", work, 5)) == 7
    assert "cannot set aside the cut last line" in capsys.readouterr().err
    assert elsewhere.read_text() == "the user's file\n"
