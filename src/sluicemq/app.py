"""The composition root: the one place that builds the broker process from its parts.

config → journal → store → broker (its services passed in) → recovery → checkpointer →
transports (TCP, TLS, WebSocket) → console and metrics. Nothing below this module builds a
service for itself or finds one in a module-level registry; every layer gets what it uses
from here, so a reader finds the whole process on one page and a test can build any part of
it without the rest. ``run`` adds the master/standby wait (standby.py) and the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluicemq import protocol
from sluicemq.buffers import InputBuffers
from sluicemq.config import BrokerConfig
from sluicemq.core.dedup.recovery import ProducersPart
from sluicemq.core.limits.sharepart import SharesPart
from sluicemq.core.paging.trim import heap_free, malloc_trim
from sluicemq.core.persistence.capture import save_snapshot
from sluicemq.core.persistence.checkpoint import Checkpointer
from sluicemq.core.persistence.parts import check_parts
from sluicemq.core.persistence.recovery import replay
from sluicemq.core.replay.ranges import RangeService
from sluicemq.core.routing.broker import Broker
from sluicemq.core.scheduling.scheduler import NAME as SCHEDULED
from sluicemq.core.scheduling.scheduler import Scheduler
from sluicemq.core.security.policy import build_security
from sluicemq.core.sessions.services import Services
from sluicemq.core.staging.recovery import StagingPart
from sluicemq.standby import HaState, StandbyHealth, data_lock, wait_for_lock
from sluicemq.storage.journal import Journal
from sluicemq.storage.store import Store
from sluicemq.transport.deferred import DeferredListener
from sluicemq.transport.tcp import StompProtocol

if TYPE_CHECKING:
    from sluicemq.admin.console import AdminConsole
    from sluicemq.admin.context import AdminContext
    from sluicemq.transport.websocket import WebSocketServer

log = logging.getLogger("sluicemq.server")
# State beside the queues that rides in the journal and the index snapshot: the producer table
# (dedup) and staged publishing. Their order is the snapshot sections' order.
STATE_PARTS = check_parts((ProducersPart, StagingPart, SharesPart))
M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 8 << 20  # above a stream's chunk bodies (1 MiB by default), below snapshot arrays
TRIM_THRESHOLD = 32 << 20  # free heap top kept for reuse: a few windows of chunks in flight
# Looks at the free heap a second (core/paging/trim.py, HeapTrimmer.observe_heap). Why not once
# with the tick: a burst's freed heap was still resident when the next traffic began within the
# second - a 1 GiB stream started right after a 50k burst peaked at its 94 MiB, not its ~60.
HEAP_LOOKS_A_SECOND = 4


@dataclass(frozen=True, slots=True)
class Loop:
    """What the core needs of an event loop (asyncio's, or a test's hand-driven one)."""

    call_soon: Callable[[Callable[[], object]], Any]
    call_later: Callable[[float, Callable[[], None]], Any]
    call_soon_threadsafe: Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Core:
    """The sans-IO broker and what it stands on, recovered and started: all but the sockets."""

    journal: Journal
    store: Store
    broker: Broker
    scheduler: Scheduler
    services: Services
    counts: dict[str, Any]  # what recovery found (messages, durable subscriptions, records)
    waiting: int  # scheduled messages waiting after recovery


def build_core(config: BrokerConfig, loop: Loop, *, clock: Callable[[], float] = time.time,
               trim_heap: Callable[[], object] | None = None,
               free_heap: Callable[[], int] | None = None,
               fence: Callable[[], None] | None = None) -> Core:
    """config -> journal -> store -> broker (services passed in) -> recovery -> started store.

    The server builds its core here; in-process specs build theirs here too, with a
    hand-driven loop and clock, so they test the process as it is assembled."""
    data_dir = Path(config.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    js = config.journal
    journal = Journal(data_dir / "journal", segment_bytes=js.segment_bytes,
                      preallocate=js.preallocate, sync=js.sync, dir_lock=fence is None,
                      recycle_bytes=js.recycle_bytes)
    journal.fence = fence
    store = Store(journal, loop.call_soon)
    broker = Broker(config, store, loop.call_soon, clock=clock, trim_heap=trim_heap,
                    free_heap=free_heap, call_later=loop.call_later)
    scheduler = Scheduler(broker, loop.call_later, enabled=config.scheduler.enabled,
                          horizon_ms=int(config.scheduler.horizon_seconds * 1000))
    broker.redelivery = scheduler.redeliver
    security = build_security(config)
    broker.durable_reader = security.durable_reader
    services = Services(broker, security, RangeService(broker), scheduler, InputBuffers())
    counts = replay(broker, STATE_PARTS)
    waiting = scheduler.recover()
    counts["user_shares"], counts["user_shares_read"] = broker.count_shares()
    counts["shared_records"] = broker.count_holders()
    broker.flow.trimmer.after_recovery()
    store.start(loop.call_soon_threadsafe)
    return Core(journal, store, broker, scheduler, services, counts, waiting)


class BrokerServer:
    """Wires storage, core and transport together on one event loop."""

    def __init__(self, config: BrokerConfig, ha: HaState | None = None,
                 stopped: asyncio.Event | None = None) -> None:
        self.config = config
        self.ha = ha  # master/standby role shown by /api/health
        self.connections: set[StompProtocol] = set()
        self.broker: Broker | None = None
        self.services: Services | None = None
        self.store: Store | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self.console: AdminConsole | None = None  # built by the console port's first client
        self.websocket: WebSocketServer | None = None  # by the WebSocket port's first client
        self.admin: AdminContext | None = None
        self._console_listener: DeferredListener | None = None
        self._ws_listener: DeferredListener | None = None
        self._stopped = stopped if stopped is not None else asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None
        self.checkpointer: Checkpointer | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        data_dir = Path(self.config.data_dir)
        fence = getattr(self.ha.lock, "check", None) if self.ha is not None else None
        t0 = time.monotonic()
        core = build_core(self.config, Loop(loop.call_soon, loop.call_later,
                                            loop.call_soon_threadsafe),
                          trim_heap=malloc_trim(), free_heap=heap_free(), fence=fence)
        self.store, self.broker, self.services = core.store, core.broker, core.services
        services, counts, js = core.services, core.counts, self.config.journal
        if core.waiting:
            log.info("%d scheduled messages wait in /queue/%s", core.waiting, SCHEDULED)
        report = getattr(core.journal, "report", None)
        dropped = getattr(report, "dropped", None) or []
        for segment, offset, nbytes, reason in dropped:
            log.warning("journal: dropped %d bytes at segment %d offset %d (%s)",
                        nbytes, segment, offset, reason)
        log.info("recovered %d messages, %d durable subscriptions from %d records in %.3fs",
                 counts["messages"], counts["durable_subscriptions"], counts["records"],
                 time.monotonic() - t0)
        if self.broker.shares is not None:
            log.info("user shares: %d stored messages counted, %d senders read from their "
                     "records", counts["user_shares"], counts["user_shares_read"])
        self.checkpointer = Checkpointer(self.broker, js.snapshot_records,
                                         loop.call_soon_threadsafe, parts=STATE_PARTS,
                                         replayed=counts["records"],
                                         backlog=counts["messages"],
                                         anchor=counts.get("anchor"))
        self.store.reclaim_watchers.append(self.checkpointer.after_reclaim)
        await self._start_operations()
        self._ticker = loop.create_task(self._tick())
        await self._start_tls()
        server = await loop.create_server(
            lambda: StompProtocol(services, self.connections),
            self.config.host, self.config.port, reuse_address=True, backlog=1024)
        self._servers.append(server)
        host, port = server.sockets[0].getsockname()[:2]
        for sig in (signal.SIGTERM, signal.SIGINT):  # before anyone is told we listen
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, self._stopped.set)
        build = "; codec compiled with mypyc" if protocol.compiled() else ""
        print(f"sluice: listening on stomp://{host}:{port} (data in {data_dir}{build})",
              flush=True)

    async def _start_tls(self) -> None:
        """STOMP over TLS beside plain STOMP, when a certificate and key are configured.

        Announced before the plain listener so that, once `listening on stomp://` is printed,
        every listener is up.
        """
        from sluicemq.tls import server_context

        tls, services = self.config.tls, self.services
        if tls.cert is None or tls.key is None or services is None:
            return
        ctx = server_context(tls.cert, tls.key, tls.ca)
        server = await asyncio.get_running_loop().create_server(
            lambda: StompProtocol(services, self.connections),
            self.config.host, tls.port, ssl=ctx, reuse_address=True, backlog=1024,
            ssl_handshake_timeout=10.0)
        self._servers.append(server)
        host, port = server.sockets[0].getsockname()[:2]
        print(f"sluice: listening on stomps://{host}:{port}", flush=True)

    async def _tick(self) -> None:
        """The broker's once-a-second housekeeping (stream timeouts, consumer waits)."""
        broker, checkpointer = self.broker, self.checkpointer
        assert broker is not None and checkpointer is not None  # started after both exist
        trimmer = broker.flow.trimmer
        while True:
            for _ in range(HEAP_LOOKS_A_SECOND):
                await asyncio.sleep(1.0 / HEAP_LOOKS_A_SECOND)
                try:
                    trimmer.observe_heap()
                except Exception:
                    log.exception("heap look failed")
            try:
                broker.tick()
                checkpointer.tick()
                if self.admin is not None:
                    self.admin.tick()  # the console's rates and histograms
            except Exception:
                log.exception("broker tick failed")

    async def _start_operations(self) -> None:
        """Web console (+ API, /metrics) and STOMP over WebSocket, each unless turned off.

        Both ports are bound now; their aiohttp servers are imported and built by the first
        connection to each (``transport/deferred.py``: ~13 MiB a broker nobody browses need
        not map). The console's samples are taken from the start, so its first page has them.
        """
        from sluicemq.admin.context import AdminContext

        services = self.services
        assert self.broker is not None and services is not None
        host = self.config.host
        if self.config.ws_port is not None:
            self._ws_listener = DeferredListener(functools.partial(self._serve_websocket, host),
                                                 ("sluicemq.transport.websocket",))
            ws_host, ws_port = self._ws_listener.bind(host, self.config.ws_port)
            print(f"sluice: websocket on ws://{ws_host}:{ws_port}", flush=True)
        if self.config.console_port is not None:
            ctx = AdminContext(self.broker, self.store, lambda: [
                *self.connections, *(self.websocket.connections if self.websocket else ())],
                services.security)
            ctx.ha = self.ha
            ctx.tick()  # the rates' baseline: what arrives from now on is counted
            self.admin = ctx
            self._console_listener = DeferredListener(functools.partial(self._serve_console,
                                                                        host),
                                                      ("sluicemq.admin.console",))
            c_host, c_port = self._console_listener.bind(host, self.config.console_port)
            print(f"sluice: console on http://{c_host}:{c_port}", flush=True)

    async def _serve_websocket(self, host: str, sockets: list[socket.socket]) -> None:
        from sluicemq.transport.websocket import WebSocketServer

        assert self.services is not None
        websocket = WebSocketServer(self.services)
        await websocket.serve(host, sockets)
        self.websocket = websocket

    async def _serve_console(self, host: str, sockets: list[socket.socket]) -> None:
        from sluicemq.admin.console import AdminConsole

        assert self.admin is not None
        console = AdminConsole(self.admin)
        await console.serve(host, sockets)
        self.console = console

    async def serve_until_stopped(self) -> None:
        await self._stopped.wait()
        await self.stop()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self) -> None:
        """Stop accepting, close connections, make every appended record durable, close files."""
        if self._ticker is not None:
            self._ticker.cancel()
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.stop()  # ack:auto messages whose frames it still holds go back first
        for listener in (self._console_listener, self._ws_listener):
            if listener is not None:
                await listener.stop()
        if self.console is not None:
            await self.console.stop()
        if self.websocket is not None:
            await self.websocket.stop()
        await asyncio.sleep(0)
        if self.checkpointer is not None:
            await self.checkpointer.finish_compaction()
            self.checkpointer.close()
        if self.broker is not None and self.broker.later.deferred:
            later = self.broker.later
            log.info("concurrent store and dispatch: %d messages deferred, %d acknowledged "
                     "before their write (never written), %d written", later.deferred,
                     later.skipped, later.stored)
        if self.broker is not None:
            self.broker.later.release_all()  # removals held back for unwritten bytes
        if self.store is not None:
            broker = self.broker
            # The index snapshot lets the next start skip the journal scan.
            pins = self.checkpointer.pins if self.checkpointer is not None else []
            self.store.close(on_closed=(lambda: save_snapshot(broker, STATE_PARTS, pins))
                             if broker else None)
        print("sluice: stopped", flush=True)


async def _become_master(config: BrokerConfig, ha: HaState, stopped: asyncio.Event) -> bool:
    """Stand by until the data directory's lock is ours; False if stopped first.

    A standby imports what a takeover would (the console and WebSocket modules pull in
    aiohttp, ~0.3 s) before waiting, so that time is not part of the takeover; a broker that
    takes the lock at once leaves them to their ports' first clients (``_start_operations``).
    """
    if ha.lock.try_acquire():
        return await wait_for_lock(ha, config.ha.lock_retry, stopped)
    import sluicemq.admin.console
    import sluicemq.tls
    import sluicemq.transport.websocket  # noqa: F401
    health: StandbyHealth | None = None
    if config.ha.standby_health and config.console_port is not None:
        health = StandbyHealth(ha)
        c_host, c_port = await health.start(config.host, config.console_port)
        print(f"sluice: standby health on http://{c_host}:{c_port}/api/health", flush=True)
    try:
        return await wait_for_lock(ha, config.ha.lock_retry, stopped)
    finally:
        if health is not None:
            await health.stop()


def return_large_frees_to_the_os() -> None:
    """Fix glibc's malloc thresholds: blocks from 8 MiB up are mapped (and unmapped when
    freed), the heap's free top is given back beyond 32 MiB.

    Why: an index snapshot of a deep backlog is tens of MiB of arrays, freed once written;
    glibc raises its mmap threshold after the first such free, so later ones would come from
    the heap and stay resident (~60 MiB more RSS with a million queued messages). But a
    threshold at 1 MiB mapped every stream chunk body (1 MiB + a few bytes) afresh, twice a
    chunk (body, journal record): 1 GiB without a consumer took ~600k page faults, 1.5 of the
    broker's 2.3 CPU seconds. Once a threshold is fixed glibc trims the heap top from 128 KiB
    free, which would fault those bodies in again chunk after chunk; the HeapTrimmer
    (``core/paging/trim.py``) still trims after a burst drains.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def hand_the_gil_over_sooner() -> None:
    """Let a thread waiting for the GIL have it after 1 ms of another's bytecode, not 5.

    Why: the journal writer takes the GIL back after each ``pwritev``, ``fdatasync`` and
    checksum, and the loop thread kept it for the whole default 5 ms switch interval. A 1 GiB
    stream without a consumer (1 MiB chunks, 8 in flight) went 729-756 -> 1,037-1,079 MB/s
    and the writer's system time 0.64-0.69 -> 0.22-0.23 s (fewer timed GIL waits).
    """
    sys.setswitchinterval(0.001)


def quiet_gc() -> None:
    """Collect cycles rarely, and never scan what start-up built (``gc.freeze``).

    Why: the broker makes millions of short-lived, acyclic objects (frames, views, tuples);
    CPython's default runs a young collection every 700 net allocations and, every few of
    those, an older one that walks everything recovered at start. Measured on a column-batch
    range read of 200,000 x 1 KiB: 105-161k msgs/s before, 165-200k after (2 vCPU). Cyclic
    garbage still goes within 20,000 allocations.
    """
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


def run(config: BrokerConfig) -> None:
    """Run the broker until SIGTERM/SIGINT (uvloop when installed)."""
    return_large_frees_to_the_os()
    hand_the_gil_over_sooner()
    run_loop: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a default dependency on Linux
        pass
    else:
        run_loop = uvloop.run

    async def main() -> None:
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # a standby stops cleanly too
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stopped.set)
        ha = data_lock(Path(config.data_dir), config.ha)
        if not await _become_master(config, ha, stopped):
            print("sluice: stopped (standby)", flush=True)
            return
        try:
            server = BrokerServer(config, ha, stopped)
            await server.start()
            quiet_gc()
            await server.serve_until_stopped()
        finally:
            ha.lock.release()  # after the journal closed: a standby takes over at once

    run_loop(main())
