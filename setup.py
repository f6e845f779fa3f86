"""Packaging hook for the optional accelerated build; the metadata lives in pyproject.toml.

By default this builds the plain pure-Python package, so ``pip install sluicemq`` needs no
compiler. With ``SLUICEMQ_MYPYC=1`` (and mypy plus a C compiler and Python's headers at hand)
the modules in ``ACCELERATED`` are compiled with mypyc and their ``.py`` files stay beside them
as documentation; Python imports the compiled module first. Why these: the broker is CPU-bound
in Python at full speed, and parsing and encoding frames (with the MESSAGE head) is the largest
share of a message's cost that lives in a few small, fully typed leaf modules (README,
Benchmarks #15); the message object, its queue and consumer, the queue's cursor
(``PendingList``, with ``paging/lanes.py`` under it) and the dispatch pass are on every
message too, and compiled together they reach each other's attributes natively (cursor and
dispatch alone saved nothing). A
persistent SEND to a queue without a ready consumer (a backlog, the 8 x 8 benchmark) is also
encoded as a journal record (``storage/records.py``) and paged out as a slot of the cursor's
spill (``paging/pager.py``, ``spill.py``, ``chain.py``, ``blocks.py``): compiled, -8 % of
its instructions with ``bench/message_cost.py --persistent`` (README, Benchmarks). A module
joins only if the whole suite passes over it: compiled, a class checks its attributes'
declared types at run time and cannot be subclassed by Python code (so
``sessions/context.py``, whose ``SessionContext`` ``Session`` extends, stays interpreted, and
so does ``paging/flow.py``, whose ``Pacing`` and ``TooLarge`` subclass ``str``), and a
default value is evaluated even in a Protocol's stub (``...`` is not a ``str``).
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
    "src/sluicemq/core/paging/cursor.py",
    "src/sluicemq/core/paging/lanes.py",
    "src/sluicemq/core/routing/dispatch.py",
    "src/sluicemq/core/routing/message.py",
    "src/sluicemq/core/routing/queue.py",
    "src/sluicemq/storage/records.py",
    "src/sluicemq/core/paging/pager.py",
    "src/sluicemq/core/paging/spill.py",
    "src/sluicemq/core/paging/chain.py",
    "src/sluicemq/core/paging/blocks.py",
)

if __name__ == "__main__":
    if os.environ.get("SLUICEMQ_MYPYC") == "1":
        from mypyc.build import mypycify

        setup(ext_modules=mypycify(list(ACCELERATED), group_name="sluicemq_accel"))
    else:
        setup()
