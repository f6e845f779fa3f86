"""Spec of the source tree's shape: layers import downwards only, and no module imports one
that imports it back.

``tools/import_cycles.py`` counts cycles with type-only and function-local imports included:
where one side needs only a shape, it names a ``Protocol`` instead of the other's class.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "import_cycles.py"


def _tool():
    spec = importlib.util.spec_from_file_location("import_cycles", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_cycles"] = module
    spec.loader.exec_module(module)
    return module


def test_no_layer_imports_an_upper_one() -> None:
    tool = _tool()
    assert tool.layer_breaks(tool.graph()) == []


def test_no_import_cycle() -> None:
    tool = _tool()
    found = [sorted(m.removeprefix("sluicemq.") for m in comp)
             for comp in tool.cycles(tool.graph())]
    assert found == []
