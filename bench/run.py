"""`make bench`: the ActiveMQ/SluiceMQ comparison (arguments go to compare.py, e.g. --quick)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import main

if __name__ == "__main__":
    sys.exit(main())
