"""A listening socket whose server is built when its first connection arrives.

Why: the web console and STOMP over WebSocket are aiohttp servers, and importing aiohttp with the
console's modules maps ~13 MiB more into a broker (a fifth of an idle one) and takes ~0.3 s,
whether or not anyone ever browses the console or connects over WebSocket. Binding the port
at start and importing the server on the first connection keeps the port's behaviour (bound,
printed, refused when taken) and makes the broker pay only for what is used. The first
connection waits in the kernel's accept queue while the server is built; nothing is lost.
The server's modules (``imports``) are imported in a worker thread first: imported on the loop,
they stopped every STOMP connection for 124-145 ms at the first console request
(``bench/fairness.py`` with a loop-lag probe, session 21); in a thread the loop takes the GIL
back at each switch interval (5 ms) while the import runs.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import socket
from collections.abc import Awaitable, Callable

log = logging.getLogger("sluicemq.server")

BACKLOG = 100  # asyncio's default for create_server
Serve = Callable[[list[socket.socket]], Awaitable[None]]


class DeferredListener:
    """Listens now; calls ``serve(sockets)`` once, when a first connection is waiting, after
    importing ``imports`` (module names) off the loop."""

    def __init__(self, serve: Serve, imports: tuple[str, ...] = ()) -> None:
        self._serve = serve
        self._imports = imports
        self._sockets: list[socket.socket] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        return self._task is not None

    def bind(self, host: str, port: int) -> tuple[str, int]:
        """Listen on every address ``host`` names, port ``port`` (0: a free one, the same for
        each address); returns the first address bound. Errors read as asyncio's."""
        self._loop = asyncio.get_running_loop()
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        seen: set[tuple[int, str]] = set()
        try:
            for family, kind, proto, _name, address in infos:
                key = (int(family), str(address[0]))
                if key in seen:
                    continue
                seen.add(key)
                sock = socket.socket(family, kind, proto)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                at = (address[0], port, *address[2:])
                try:
                    sock.bind(at)
                except OSError as err:
                    raise OSError(err.errno, f"error while attempting to bind on address "
                                             f"{at!r}: {str(err.strerror).lower()}") from None
                port = sock.getsockname()[1]
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except BaseException:
            self._close()
            raise
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._first)
        bound = self._sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    def _first(self) -> None:
        self._unwatch()
        assert self._loop is not None
        if self._task is None:
            self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            for name in self._imports:
                await asyncio.to_thread(importlib.import_module, name)
            await self._serve(self._sockets)
        except Exception:
            log.exception("could not start the server on %s", self._sockets[0].getsockname())
            self._close()

    def _unwatch(self) -> None:
        if self._loop is not None:
            for sock in self._sockets:
                if sock.fileno() >= 0:
                    self._loop.remove_reader(sock.fileno())

    def _close(self) -> None:
        self._unwatch()
        for sock in self._sockets:
            sock.close()

    async def stop(self) -> None:
        """Stop listening; a server already built is its owner's to stop (after this)."""
        if self._task is None:
            self._close()
            return
        await self._task
