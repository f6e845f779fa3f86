"""The data directory's lock: one holder at a time, named in the file, freed by the kernel
when the holder dies (kill -9 included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sluicemq.storage.lock import StoreLock

HOLD = ("import sys; from sluicemq.storage.lock import StoreLock\n"
        "lock = StoreLock(sys.argv[1]); assert lock.try_acquire(); print('held', flush=True)\n"
        "sys.stdin.read()")


def test_a_held_lock_is_refused_named_and_freed_by_kill_9(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        mine = StoreLock(tmp_path)
        assert not mine.try_acquire()
        named = mine.current_holder()
        assert named is not None and named.pid == holder.pid
        holder.kill()
        holder.wait(30)
        assert mine.try_acquire()  # the kernel dropped the dead holder's lock
        now = mine.current_holder()
        assert now is not None and now.pid == os.getpid()
        mine.release()
        assert not mine.held
    finally:
        holder.kill()
        holder.wait(30)


def test_release_lets_the_next_process_take_it(tmp_path: Path) -> None:
    first = StoreLock(tmp_path)
    assert first.try_acquire()
    first.release()
    taker = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path)], input="",
                           capture_output=True, text=True, timeout=60)
    assert taker.stdout == "held\n"
