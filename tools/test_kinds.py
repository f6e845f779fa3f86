"""Count the specs that start a process (a broker, a Spark JVM, a CLI, openssl) and those that
run in the test process alone, per top-level folder of tests/ - the "in-process share" of
issue #14. Collection only: nothing is run.

    .venv/bin/python tools/test_kinds.py            # table per folder, then the total

A spec starts a process when its function, a fixture it uses (directly or through other
fixtures) or a helper function of its module that it calls (directly or through other
helpers) names one of MARKERS. Helpers imported from shared test modules count through the
names they are called by (``BrokerProcess``, ``Cluster``, ...).
"""

from __future__ import annotations

import ast
import collections
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("subprocess.", "Popen(", "BrokerProcess(", "Cluster(", "SparkSession",
           "start_driver(", "run_driver(", "make_ca(", "make_cert(", "spark_driver")


def _marked(source: str) -> bool:
    return any(m in source for m in MARKERS)


class _Kinds:
    def __init__(self) -> None:
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        self._helpers: dict[str, set[str]] = {}

    def _module_helpers(self, module: Any) -> set[str]:
        """Names of the module's own functions that start a process, directly or via another."""
        name = module.__name__
        if name in self._helpers:
            return self._helpers[name]
        try:
            tree = ast.parse(inspect.getsource(module))
        except (OSError, TypeError):
            self._helpers[name] = set()
            return set()
        funcs = {n.name: ast.get_source_segment(inspect.getsource(module), n) or ""
                 for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                 and not n.name.startswith("test_")}
        marked = {f for f, src in funcs.items() if _marked(src)}
        grew = True
        while grew:
            grew = False
            for f, src in funcs.items():
                if f not in marked and any(f"{m}(" in src for m in marked):
                    marked.add(f)
                    grew = True
        self._helpers[name] = marked
        return marked

    def _starts_process(self, item: pytest.Function) -> bool:
        helpers = self._module_helpers(item.module)
        sources = [inspect.getsource(item.function)]
        for defs in item._fixtureinfo.name2fixturedefs.values():
            for fdef in defs:
                func = fdef.func
                sources.append(inspect.getsource(func))
                owner = sys.modules.get(func.__module__)
                if owner is not None:
                    helpers = helpers | self._module_helpers(owner)
        return any(_marked(s) or any(f"{h}(" in s for h in helpers) for s in sources)

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            if not isinstance(item, pytest.Function):
                continue
            folder = Path(str(item.path)).relative_to(ROOT / "tests").parts[0]
            folder = folder if not folder.endswith(".py") else "(top)"
            kind = "process" if self._starts_process(item) else "in-process"
            self.counts[folder][kind] += 1


def main() -> int:
    kinds = _Kinds()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")],
                       plugins=[kinds])
    if code != 0:
        return int(code)
    total: collections.Counter[str] = collections.Counter()
    print(f"\n{'folder':<12} {'in-process':>10} {'process':>8}")
    for folder in sorted(kinds.counts):
        c = kinds.counts[folder]
        total.update(c)
        print(f"{folder:<12} {c['in-process']:>10} {c['process']:>8}")
    n = sum(total.values())
    print(f"{'total':<12} {total['in-process']:>10} {total['process']:>8}   "
          f"in-process {total['in-process'] / n:.0%} of {n} specs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
