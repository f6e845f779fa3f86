"""Spec of the optional accelerated build (setup.py): which build a test run exercises.

The suite runs twice in CI, over the pure-Python modules (``make test``) and over the same
modules compiled with mypyc (``make test-accel``, which sets SLUICE_EXPECT_ACCELERATED=1). A
run must test the build it claims to: a failed or skipped compilation would otherwise pass
the pure code off as the accelerated build, and a stray compiled module left in the tree
would hide the pure code from ``make test``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPECT_ACCELERATED = os.environ.get("SLUICE_EXPECT_ACCELERATED") == "1"


def _accelerated_modules() -> list[str]:
    listed = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_spec")["ACCELERATED"]
    return [path.removeprefix("src/").removesuffix(".py").replace("/", ".") for path in listed]


def test_the_accelerated_list_names_modules_of_the_package() -> None:
    names = _accelerated_modules()
    assert names and all(name.startswith("sluicemq.") for name in names)
    assert all((ROOT / "src" / (name.replace(".", "/") + ".py")).is_file() for name in names)


@pytest.mark.parametrize("name", _accelerated_modules())
def test_each_listed_module_loads_from_the_build_this_run_expects(name: str) -> None:
    module = importlib.import_module(name)
    origin = str(module.__file__)
    compiled = origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    if EXPECT_ACCELERATED:
        assert compiled, f"{name} is not compiled ({origin}): run `make accel` first"
    else:
        assert not compiled, f"{name} is a compiled module ({origin}): `make pure` removes it"
