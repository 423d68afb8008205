import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
# Hugging Face models are built from configs; nothing may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).parent))

import relay_tasks  # noqa: F401  (sets up the environment before TVM is imported)


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--fuzz-examples",
        type=int,
        default=None,
        help="random graphs per tuner in test_fuzz.py (default: a small fixed set; "
        "also RELAY_TASKS_FUZZ_EXAMPLES)",
    )


def pytest_configure(config) -> None:
    # test_fuzz.py reads the budget at import; xdist workers inherit the variable.
    if config.getoption("--fuzz-examples") is not None:
        os.environ["RELAY_TASKS_FUZZ_EXAMPLES"] = str(config.getoption("--fuzz-examples"))
    if not hasattr(config, "workerinput"):  # the run's first process: xdist's workers inherit
        _session_tmpdir(config)


def _session_tmpdir(config) -> None:
    """Every temporary file of the run (pytest's own folders, TVM's ``tmpXXXX`` build folders
    of the tunes run in a test's process, the CLI's children) in one folder, removed at the
    end: a run left about 14 of TVM's folders in the machine's /tmp."""
    folder = tempfile.mkdtemp(prefix="relay-tasks-tests-")
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
