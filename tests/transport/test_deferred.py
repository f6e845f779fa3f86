"""A port whose server is built by its first connection (``transport/deferred.py``): bound and
refusing others at once, served from the first connection on, and what the broker leaves
unimported until then (the console's and WebSocket's aiohttp)."""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.request
from pathlib import Path

import pytest

from sluice_testing import BrokerProcess
from sluicemq.transport.deferred import DeferredListener

SECONDS = 10.0


def test_the_port_is_bound_at_once_and_the_server_is_built_by_the_first_connection() -> None:
    async def main() -> None:
        built: list[list[socket.socket]] = []

        async def serve(sockets: list[socket.socket]) -> None:
            built.append(sockets)
            server = await asyncio.get_running_loop().create_server(
                asyncio.Protocol, sock=sockets[0])
            served.append(server)

        served: list[asyncio.AbstractServer] = []
        listener = DeferredListener(serve)
        host, port = listener.bind("127.0.0.1", 0)
        assert host == "127.0.0.1" and port > 0 and not listener.started
        await asyncio.sleep(0)  # a loop turn with nobody connecting builds nothing
        assert built == []
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), SECONDS)
        await asyncio.wait_for(_until(lambda: bool(served)), SECONDS)
        assert listener.started and len(built) == 1
        assert built[0][0].getsockname()[1] == port
        writer.close()
        await listener.stop()
        served[0].close()
        await served[0].wait_closed()

    asyncio.run(main())


def test_the_server_s_modules_are_imported_off_the_loop_s_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported on the loop, aiohttp and the console stopped every connection for ~0.13 s."""
    (tmp_path / "deferred_probe_module.py").write_text(
        "import threading\nIMPORTED_IN = threading.get_ident()\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    async def main() -> int:
        found: list[int] = []

        async def serve(sockets: list[socket.socket]) -> None:
            import deferred_probe_module  # (imported already: only looked up)
            found.append(deferred_probe_module.IMPORTED_IN)
            for sock in sockets:
                sock.close()

        listener = DeferredListener(serve, ("deferred_probe_module",))
        host, port = listener.bind("127.0.0.1", 0)
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), SECONDS)
        await asyncio.wait_for(_until(lambda: bool(found)), SECONDS)
        writer.close()
        await listener.stop()
        return found[0]

    assert asyncio.run(main()) != threading.get_ident()  # not the loop's (this) thread


def test_a_taken_port_is_refused_as_asyncio_words_it_and_an_unused_one_is_freed_by_stop(
        ) -> None:
    async def main() -> None:
        async def serve(sockets: list[socket.socket]) -> None:
            raise AssertionError("nobody connected")

        first = DeferredListener(serve)
        _host, port = first.bind("127.0.0.1", 0)
        with pytest.raises(OSError, match="address already in use"):
            DeferredListener(serve).bind("127.0.0.1", port)
        await first.stop()
        again = DeferredListener(serve)
        assert again.bind("127.0.0.1", port)[1] == port  # stop() let it go
        await again.stop()

    asyncio.run(main())


async def _until(check: object) -> None:
    assert callable(check)
    while not check():
        await asyncio.sleep(0.01)  # paces the re-check; the listener's task decides


def _maps(pid: int, name: str) -> bool:
    return f"site-packages/{name}/" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_a_broker_maps_aiohttp_only_once_its_console_or_websocket_port_is_used(
        tmp_path: Path) -> None:
    """A broker nobody browses or reaches over WebSocket does not import aiohttp (~13 MiB of
    RSS with the console's modules), nor numpy (~15 MiB) before a path needs it; the ports are
    listening from the start and the first request is answered."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        assert broker.console_url is not None
        assert not _maps(broker.pid, "aiohttp") and not _maps(broker.pid, "numpy")
        with urllib.request.urlopen(broker.console_url + "/api/overview",
                                    timeout=SECONDS) as reply:
            assert reply.status == 200
        assert _maps(broker.pid, "aiohttp")
    finally:
        assert broker.stop() == 0
