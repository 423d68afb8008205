import os
import sys
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
