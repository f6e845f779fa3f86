"""Spec of the source tree's shape: layers import downwards only, and no module imports one
that imports it back.

``tools/import_cycles.py`` counts cycles with type-only and function-local imports included:
where one side needs only a shape, it names a ``Protocol`` instead of the other's class.
"""

from __future__ import annotations

import ast
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


def test_every_package_has_a_folder_of_specs() -> None:
    """Tests mirror the source tree: ``src/sluicemq/core/paging`` is specified in
    ``tests/core/paging``, and so on for every package."""
    root = TOOL.parent.parent
    src = root / "src" / "sluicemq"
    packages = [p.parent.relative_to(src) for p in src.rglob("__init__.py")
                if p.parent != src and any(p.parent.glob("[!_]*.py"))]  # core: packages only
    missing = [str(p) for p in sorted(packages) if not any((root / "tests" / p).glob("test_*.py"))]
    assert missing == []


def test_every_package_says_what_it_owns() -> None:
    """Each package's docstring is a paragraph a newcomer reads first, not a one-liner."""
    src = TOOL.parent.parent / "src" / "sluicemq"
    thin = []
    for init in sorted(src.rglob("__init__.py")):
        module = ast.parse(init.read_text())
        doc = ast.get_docstring(module) or ""
        if len(doc.split()) < 25:
            thin.append(str(init.parent.relative_to(src)))
    assert thin == []
