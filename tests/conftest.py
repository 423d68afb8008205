import os
import sys
from pathlib import Path

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
sys.path.insert(0, str(Path(__file__).parent))

import relay_tasks  # noqa: F401  (sets up the environment before TVM is imported)
