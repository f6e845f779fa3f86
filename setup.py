"""Packaging hook for the optional accelerated build; the metadata lives in pyproject.toml.

By default this builds the plain pure-Python package, so ``pip install sluicemq`` needs no
compiler. With ``SLUICEMQ_MYPYC=1`` (and mypy plus a C compiler and Python's headers at hand)
the modules in ``ACCELERATED`` are compiled with mypyc and their ``.py`` files stay beside them
as documentation; Python imports the compiled module first. Why these: the broker is CPU-bound
in Python at full speed, and parsing and encoding frames (with the MESSAGE head) is the largest
share of a message's cost that lives in a few small, fully typed leaf modules (README,
Benchmarks #15). A module joins only if the whole suite passes over it: compiled, a class
checks its attributes' declared types at run time and cannot be subclassed by Python code.
``make accel`` builds them in place for development and ``make test-accel`` runs the suite.
"""

from __future__ import annotations

import os

from setuptools import setup

ACCELERATED = (
    "src/sluicemq/protocol/codec.py",
    "src/sluicemq/protocol/encoder.py",
    "src/sluicemq/protocol/frames.py",
    "src/sluicemq/protocol/headers.py",
    "src/sluicemq/core/sessions/heads.py",
)

if __name__ == "__main__":
    if os.environ.get("SLUICEMQ_MYPYC") == "1":
        from mypyc.build import mypycify

        setup(ext_modules=mypycify(list(ACCELERATED), group_name="sluicemq_accel"))
    else:
        setup()
