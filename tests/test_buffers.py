"""Spec: a BufferPool hands a kept buffer out again only once nothing views it, keeps at most
``keep`` of them, each sized to the requests that made it, and declines what is too large;
a large SEND body is read into bytes of its own, which are what it was filled with."""

from __future__ import annotations

import threading

import pytest

from sluicemq.buffers import BufferPool, InputBuffers, exported, fresh_bytes


def test_a_buffer_is_handed_out_again_only_once_no_view_of_it_is_alive() -> None:
    pool = BufferPool(keep=2, largest=8 << 20)
    first = pool.take(3 << 20)
    assert first is not None and len(first) == 3 << 20  # rounded up to a MiB
    kept = first.obj
    part = first[:10]
    del first
    second = pool.take(1000)
    assert second is not None and second.obj is not kept  # `part` still views the first
    del part
    again = pool.take(2 << 20)
    assert again is not None and again.obj is kept  # nothing views it, and it is large enough


def test_at_most_keep_buffers_are_kept_and_a_too_small_free_one_is_replaced() -> None:
    pool = BufferPool(keep=1, largest=8 << 20, round_to=1024)
    small = pool.take(100)
    assert small is not None and len(small) == 1024
    assert pool.take(100) is None  # the one kept buffer is in use: the caller allocates
    small_buffer = small.obj
    small.release()
    bigger = pool.take(5000)
    assert bigger is not None and len(bigger) == 5120 and bigger.obj is not small_buffer
    kept = bigger.obj
    bigger.release()
    again = pool.take(5000)
    assert again is not None and again.obj is kept


def test_threads_sharing_a_pool_never_get_the_same_buffer_at_once() -> None:
    """Successive connections of one process may share a pool from their reader threads."""
    pool = BufferPool(keep=4, largest=1 << 20, round_to=1024)
    held: list[memoryview] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def taker() -> None:
        start.wait()
        view = pool.take(1000)
        if view is not None:
            with lock:
                held.append(view)

    threads = [threading.Thread(target=taker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    buffers = [id(v.obj) for v in held]
    assert len(buffers) == 4 and len(set(buffers)) == 4  # four kept, each handed out once


def test_a_request_above_largest_is_declined() -> None:
    pool = BufferPool(keep=4, largest=1 << 20)
    assert pool.take((1 << 20) + 1) is None


def test_exported_tells_whether_a_view_is_alive_and_leaves_the_buffer_as_it_was() -> None:
    buf = bytearray(b"abc")
    assert not exported(buf) and buf == b"abc"
    with memoryview(buf):
        assert exported(buf)
    assert not exported(buf) and buf == b"abc"


def test_fresh_bytes_are_what_their_view_was_filled_with_and_behave_as_any_bytes() -> None:
    data, view = fresh_bytes(3 << 20)
    payload = bytes(range(256)) * (3 << 12)
    view[:1000] = payload[:1000]  # in pieces, as reads come
    view[1000:] = payload[1000:]
    del view
    assert type(data) is bytes and data == payload and hash(data) == hash(payload)
    assert data[5:9] == payload[5:9] and data + b"!" == payload + b"!"
    with pytest.raises(ValueError):
        fresh_bytes(1)  # the interpreter's shared short bytes are never handed out


def test_input_bodies_are_fresh_bytes_each_time_and_large_ones_are_declined() -> None:
    inputs = InputBuffers(largest=4 << 20)
    first = inputs.body(1 << 20)
    second = inputs.body(1 << 20)
    assert isinstance(first, tuple) and isinstance(second, tuple)
    assert first[0] is not second[0] and len(first[0]) == len(first[1]) == 1 << 20
    assert inputs.body((4 << 20) + 1) is None
