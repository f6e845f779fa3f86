"""Typed broker settings and TOML loading; every default is documented here, in one place."""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 61613
DEFAULT_URL = f"stomp://{DEFAULT_HOST}:{DEFAULT_PORT}"
DEFAULT_CONSOLE_PORT = 8161  # web console, admin API, /metrics (ActiveMQ's console port)
DEFAULT_WS_PORT = 61614  # STOMP over WebSocket (ActiveMQ's ws port)
DEFAULT_TLS_PORT = 61612  # STOMP over TLS (ActiveMQ's stomp+ssl port)


@dataclass(frozen=True, slots=True)
class Limits:
    """Protocol limits that bound what one peer can make the broker hold."""

    max_frame_bytes: int = 64 << 20  # whole frame, headers + body
    max_headers: int = 1000  # header lines per frame
    max_header_line: int = 8192  # bytes per header line (and per command line)
    max_header_bytes: int = 1 << 20  # a frame's whole header section
    # The shortest heart-beat interval the broker sends at or expects: within it, a client
    # gets the beats it asks for (1 s asked, 1 s given) and is held to the ones it promised.
    heartbeat_ms: int = 500
    max_connections: int = 10_000  # STOMP connections broker-wide (TCP, TLS and WebSocket)
    max_connections_per_address: int = 1000  # from one client IP address; 0: no cap
    connect_timeout: float = 10.0  # seconds from accept to a complete CONNECT; then closed
    max_subscriptions: int = 1000  # per connection
    max_unacked: int = 10_000  # per subscription: caps activemq.prefetchSize
    max_transactions: int = 100  # open at once per connection
    max_transaction_bytes: int | str = "256 MiB"  # all open transactions of one connection
    max_destinations: int = 10_000  # queues + topics broker-wide (idle empty ones reclaimed)
    max_destinations_per_user: int = 2000  # created by one user (anonymous: one address)
    idle_destination_seconds: float = 60.0  # an empty queue/topic nobody uses is dropped after
    max_durable_subscriptions: int = 1000  # per client id
    max_consumer_waits: int = 100  # sluice-stream-wait-consumer SENDs waiting per connection
    max_consumer_wait_seconds: float = 300.0  # the longest a wait-consumer SEND may wait
    slow_reader_seconds: float = 30.0  # output backed up this long with no drain: disconnect
    # Bytes written to peers but not yet taken by their sockets, all connections together:
    # each connection may back up this / connections (at least 32 KiB, at most 4 MiB).
    output_buffer_bytes: int | str = "64 MiB"
    # Input work (parsing + handling frames) of all connections per event-loop turn; past it,
    # connections that used more than a light share wait a turn (core/limits/turns.py).
    turn_budget_ms: float = 4.0
    # Memory and flow control (0: derived from the machine, see core/paging/flow.py and the README).
    # Sizes are bytes or strings such as "512 MiB".
    memory_limit: int | str = 0  # messages held in RAM, all destinations together
    store_limit: int | str = 0  # journal disk space; persistent producers wait beyond it
    # Body bytes of persistent messages one login may have stored, all destinations together
    # (a size, or a share of store_limit such as "25%"); 0: no per-user share
    user_store_limit: int | str = 0
    temp_limit: int | str = 0  # temp files of non-persistent overflow; producers wait beyond it
    max_message_bytes: int | str = 0  # one message's body; 0: max_frame_bytes
    # Persistent messages accepted but not yet written to disk, broker-wide: beyond it
    # persistent SENDs wait for the journal (their records are held in RAM until written).
    journal_backlog: int | str = "64 MiB"
    # Exactly-once pipelines (docs/replay-protocol.md), in seconds.
    stage_timeout: float = 900.0  # a staged part nobody publishes is discarded after this
    stage_memory: float = 7 * 86400.0  # published (sink, batch) ids are remembered this long
    stage_memory_batches: int = 10_000  # and at most this many per sink (oldest forgotten)
    dedup_window: float = 3600.0  # a producer id is forgotten after this without sends


@dataclass(frozen=True, slots=True)
class UserEntry:
    """A `[[security.users]]` table; `password` is an argon2 hash made by `sluice passwd`."""

    name: str
    password: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AclEntry:
    """A `[[security.acl]]` table: who (user or group names, "*" anyone) may do what where."""

    destination: str  # "/queue/orders.>", "/topic/*", or a bare pattern for both kinds
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """`[security]`: authentication and authorization; an empty section leaves the broker open."""

    users: tuple[UserEntry, ...] = ()
    acl: tuple[AclEntry, ...] = ()
    anonymous: bool | None = None  # None: allowed only while no user is configured
    login_failure_delay: float = 1.0  # seconds before a failed login hears its ERROR
    max_login_failures: int = 10  # per address per minute; beyond it logins are refused unchecked
    # Browser origins (scheme://host[:port]) besides the listener's own that may open STOMP
    # over WebSocket; "*": any. Upgrades without an Origin header (not a browser) are allowed.
    websocket_origins: tuple[str, ...] = ()
    dlq_follows_origin: bool = True  # DLQ.<name> grants what <name> grants (besides its rules)


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """`[tls]` or --tls-*: STOMP over TLS, listening only when a certificate and key are given."""

    port: int = DEFAULT_TLS_PORT
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None  # when set, client certificates are asked for and verified (CN → user)


@dataclass(frozen=True, slots=True)
class Policy:
    """Per-destination behaviour; `[[policy]]` entries in TOML override it by pattern."""

    max_redeliveries: int = 6  # deliveries beyond this move the message to DLQ.<name>
    # ActiveMQ's redeliveryPolicy (broker side, through the scheduler): a queue message that
    # is NACKed or given back by a departing consumer waits this long (ms) before it is
    # delivered again: the first time initial_redelivery_delay, then redelivery_delay - or,
    # with use_exponential_backoff, the previous wait times backoff_multiplier - never more
    # than maximum_redelivery_delay (0: no cap). All 0: redelivered at once, in place.
    initial_redelivery_delay: int = 0
    redelivery_delay: int = 0
    use_exponential_backoff: bool = False
    backoff_multiplier: float = 5.0
    maximum_redelivery_delay: int = 0
    dlq_prefix: str = "DLQ."
    default_prefetch: int = 1000
    stream_redelivery: str = "resume"  # resume | restart | discard, when a stream's consumer dies
    stream_dispatch: str = "progressive"  # progressive | complete (hold chunks until the final)
    stream_timeout: float = 60.0  # seconds without a chunk before an open stream is abandoned
    cursor: str = "store"  # store: page persistent backlog from the journal | vm: all in RAM
    cursor_window: int = 2000  # messages a store cursor keeps in RAM for its consumers
    memory_limit: int | str = 0  # RAM this destination may hold; 0: only the broker-wide limit
    fail_if_no_space: bool = False  # a full destination answers SEND with ERROR, not a wait
    # Body bytes of ready messages (and of persistent ones the scheduler holds for it) this
    # destination may hold before persistent SENDs to it wait (ActiveMQ's
    # storeUsageHighWaterMark, RabbitMQ's max-length-bytes): a size, or a
    # share of [limits] store_limit ("25%"); 0: only the broker-wide limit.
    store_limit: int | str = 0
    max_message_bytes: int | str = 0  # 0: the broker-wide [limits] max_message_bytes
    max_consumers: int = 0  # subscriptions at once; 0: unlimited
    # ActiveMQ's processExpired: expired persistent messages go to the DLQ (reason "expired")
    # instead of being dropped.
    dead_letter_expired: bool = False
    # Producer pacing: body bytes a destination WITH consumers may hold undelivered before
    # non-persistent SENDs to it wait (0: no pacing); persistent ones too with pace_persistent.
    # 1 MiB: the lowest end-to-end latency at full speed without losing throughput (a sweep
    # of 4 MiB .. 128 KiB with bench/compare.py e2e; below 1 MiB the sockets' buffers dominate).
    max_consumer_lag: int | str = "1 MiB"
    pace_persistent: bool = False


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """A `[[policy]]` table: `queue = "orders.>"` or `topic = "*"` plus overridden fields."""

    kind: str  # "queue" | "topic"
    pattern: str
    overrides: dict[str, Any]

    def matches(self, kind: str, name: str) -> bool:
        return kind == self.kind and match_destination(self.pattern, name)


# The broker's own scheduler buckets (core/scheduling/calendar.py) are each read front to back
# once, shortly before their second: a small RAM window keeps a minute of buckets from holding
# cursor_window messages each. Applied before the TOML's [[policy]] entries.
BUILTIN_POLICIES = (PolicyEntry("queue", "sluice.scheduled.*", {"cursor_window": 64}),)


def match_destination(pattern: str, name: str) -> bool:
    """ActiveMQ wildcards on dot-separated names: `*` one segment, `>` the rest."""
    p_parts = pattern.split(".")
    n_parts = name.split(".")
    for i, p in enumerate(p_parts):
        if p == ">":
            return True
        if i >= len(n_parts):
            return False
        if p != "*" and not fnmatch.fnmatchcase(n_parts[i], p):
            return False
    return len(p_parts) == len(n_parts)


@dataclass(frozen=True, slots=True)
class JournalSettings:
    """How the journal lays out and syncs its segments."""

    segment_bytes: int = 64 << 20
    preallocate: bool = True  # zero-fill segments ahead so fdatasync has no metadata to flush
    # Reclaimed segment files kept (renamed) for reuse, at most: appending into blocks written
    # before syncs fastest (storage/recycle.py); 0: reclaimed segments are deleted. On by
    # default again since keyed checksums (storage/headerkey.py) let recovery resynchronise
    # past damage in reused files: a damaged record costs only itself there too.
    recycle_bytes: int = 1 << 30
    # Spares live within [limits] store_limit together with the live segments, and are given
    # back (deleted) while the journal's filesystem has less than this free; 0: 5 % of its size.
    recycle_min_free: int = 0
    sync: bool = True  # False only for throwaway benchmarks: receipts would lie
    spill_bytes: int = 64 << 10  # persistent bodies this large are read back from the journal
    snapshot_records: int = 50_000  # index snapshot after this many journal records; 0: never
    # A persistent message a ready consumer takes is written only if still unacknowledged this
    # long after it arrived (concurrent store and dispatch); 0: always write first.
    store_delay_ms: float = 5.0


@dataclass(frozen=True, slots=True)
class HaSettings:
    """`[ha]`: brokers sharing one data directory; the lock holder serves, the others wait."""

    lock_retry: float = 0.5  # seconds between a standby's attempts to take the lock
    standby_health: bool = False  # a standby answers /api/health on the console port
    lock: str = "kernel"  # kernel: fcntl lock on <data-dir>/lock | lease: <data-dir>/lease
    lease_seconds: float = 10.0  # a lease not renewed for this long may be taken over
    lease_renew: float = 2.0  # seconds between the master's renewals (< lease_seconds / 2)


@dataclass(frozen=True, slots=True)
class VirtualTopics:
    """`[virtual_topics]`: ActiveMQ's virtual topics. A SEND to ``/topic/<topic_prefix>X``
    also goes to every queue ``/queue/<consumer_prefix><group>.<topic_prefix>X``, so each
    consumer group load-balances its own copy of the topic."""

    enabled: bool = True
    topic_prefix: str = "VirtualTopic."
    consumer_prefix: str = "Consumer."


@dataclass(frozen=True, slots=True)
class AdvisorySettings:
    """`[advisories]`: ActiveMQ's advisory topics (core/routing/advisories.py)."""

    enabled: bool = True
    # A consumer that takes nothing (prefetch full or its connection not reading) while
    # messages wait this long is advised on ActiveMQ.Advisory.SlowConsumer.*; 0: never.
    slow_consumer_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """`[scheduler]`: ActiveMQ's scheduled delivery (core/scheduling/scheduler.py); off, the
    AMQ_SCHEDULED_* headers are ordinary headers and messages go at once (ActiveMQ's
    ``schedulerSupport="false"``)."""

    enabled: bool = True
    # Messages due within this many seconds wait in the queue of the second they are due in
    # (sluice.scheduled.<second>); later ones in sluice.scheduled, moved to their second's
    # queue half this long before they are due. At least 2.
    horizon_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything `sluice broker` needs; built from CLI flags over an optional TOML file."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    console_port: int | None = DEFAULT_CONSOLE_PORT  # 0: any free port; None: no console
    ws_port: int | None = DEFAULT_WS_PORT  # 0: any free port; None: no STOMP over WebSocket
    data_dir: Path = Path("sluice-data")
    limits: Limits = field(default_factory=Limits)
    journal: JournalSettings = field(default_factory=JournalSettings)
    policy: Policy = field(default_factory=Policy)
    policies: tuple[PolicyEntry, ...] = ()
    security: SecuritySettings = field(default_factory=SecuritySettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    ha: HaSettings = field(default_factory=HaSettings)
    virtual_topics: VirtualTopics = field(default_factory=VirtualTopics)
    advisories: AdvisorySettings = field(default_factory=AdvisorySettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)

    def policy_for(self, kind: str, name: str) -> Policy:
        """The default policy with every matching `[[policy]]` entry applied in file order."""
        result = self.policy
        for entry in (*BUILTIN_POLICIES, *self.policies):
            if entry.matches(kind, name):
                result = replace(result, **entry.overrides)
        return result

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> BrokerConfig:
        """Read a TOML file (if given) and apply non-None keyword overrides (CLI flags)."""
        data: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        cfg = _from_toml(data)
        clean = {k: v for k, v in overrides.items() if v is not None}
        if "data_dir" in clean:
            clean["data_dir"] = Path(clean["data_dir"])
        return replace(cfg, **clean)


def _section(kind: type, raw: dict[str, Any], where: str) -> Any:
    names = {f.name for f in fields(kind)}
    values = {k.replace("-", "_"): v for k, v in raw.items()}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"unknown setting(s) in [{where}]: {', '.join(sorted(unknown))}")
    return kind(**values)


def _from_toml(data: dict[str, Any]) -> BrokerConfig:
    broker = data.get("broker", {})
    kwargs: dict[str, Any] = {}
    for key in ("host", "port", "console_port", "ws_port"):
        for spelling in (key, key.replace("_", "-")):
            if spelling in broker:
                value = broker[spelling]
                if key in ("console_port", "ws_port"):  # 0/off: none; "auto": any free port
                    value = None if value in (False, 0, "off") else 0 if value == "auto" else value
                kwargs[key] = value
    if "data-dir" in broker or "data_dir" in broker:
        kwargs["data_dir"] = Path(broker.get("data-dir", broker.get("data_dir")))
    if "limits" in data:
        kwargs["limits"] = _section(Limits, data["limits"], "limits")
        _check_share(kwargs["limits"].user_store_limit, "[limits] user_store_limit")
    if "journal" in data:
        kwargs["journal"] = _section(JournalSettings, data["journal"], "journal")
    if "ha" in data:
        kwargs["ha"] = _section(HaSettings, data["ha"], "ha")
        ha = kwargs["ha"]
        if ha.lock_retry <= 0:
            raise ValueError("[ha] lock_retry must be > 0 seconds")
        if ha.lock not in ("kernel", "lease"):
            raise ValueError('[ha] lock must be "kernel" or "lease"')
        if not 0 < ha.lease_renew < ha.lease_seconds / 2:
            raise ValueError("[ha] lease_renew must be > 0 and < lease_seconds / 2")
    if "virtual_topics" in data or "virtual-topics" in data:
        raw = data.get("virtual_topics", data.get("virtual-topics", {}))
        kwargs["virtual_topics"] = _section(VirtualTopics, raw, "virtual_topics")
    if "advisories" in data:
        kwargs["advisories"] = _section(AdvisorySettings, data["advisories"], "advisories")
    if "scheduler" in data:
        kwargs["scheduler"] = _section(SchedulerSettings, data["scheduler"], "scheduler")
    if "defaults" in data:
        kwargs["policy"] = _section(Policy, data["defaults"], "defaults")
        _check_share(kwargs["policy"].store_limit, "[defaults] store_limit")
    entries = []
    policy_names = {f.name for f in fields(Policy)}
    for raw in data.get("policy", []):
        raw = {k.replace("-", "_"): v for k, v in raw.items()}
        kinds = [k for k in ("queue", "topic") if k in raw]
        if len(kinds) != 1:
            raise ValueError("each [[policy]] needs exactly one of queue = … or topic = …")
        kind = kinds[0]
        pattern = raw.pop(kind)
        unknown = set(raw) - policy_names
        if unknown:
            raise ValueError(f"unknown policy setting(s): {', '.join(sorted(unknown))}")
        _check_share(raw.get("store_limit", 0), f"[[policy]] {kind} = {pattern!r}: store_limit")
        entries.append(PolicyEntry(kind, pattern, raw))
    kwargs["policies"] = tuple(entries)
    if "security" in data:
        kwargs["security"] = _security(data["security"])
    if "tls" in data:
        raw_tls = {k: Path(v) if k in ("cert", "key", "ca") else v
                   for k, v in data["tls"].items()}
        kwargs["tls"] = _section(TlsSettings, raw_tls, "tls")
        for name in ("cert", "key", "ca"):  # as --tls-*, before anything starts: ssl names no file
            path = getattr(kwargs["tls"], name)
            if path is not None and not path.is_file():
                raise ValueError(f"[tls] {name} = {str(path)!r}: no such file")
    return BrokerConfig(**kwargs)


def percent(value: Any) -> float | None:
    """The percentage a size setting written as a share ("25%") gives; None for a size.
    Raises ValueError when the number before the "%" is not one."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return float(value.strip()[:-1])
    return None


def _check_share(value: Any, what: str) -> None:
    """A share such as "25%" must be a percentage of 0-100: past 100 the cap would never hold
    before the broker-wide one, and a typo would silently mean no cap."""
    try:
        share = percent(value)
    except ValueError:
        share = -1.0
    if share is not None and not 0 < share <= 100:
        raise ValueError(f"{what} = {value!r}: a share must be between 0 and 100%")


def _security(raw: dict[str, Any]) -> SecuritySettings:
    raw = dict(raw)
    users = tuple(_section(UserEntry, dict(u, groups=tuple(u.get("groups", ()))), "security.users")
                  for u in raw.pop("users", []))
    from argon2 import extract_parameters  # here: client commands read this module too

    for user in users:
        if not user.password.startswith("$argon2"):
            raise ValueError(f"user {user.name!r}: password must be a hash from `sluice passwd`")
        try:  # a placeholder or a hash cut short would refuse every login, silently
            extract_parameters(user.password)
        except ValueError:
            raise ValueError(f"user {user.name!r}: password is not a whole hash from "
                             "`sluice passwd`") from None
    acl = tuple(_section(AclEntry, {k: v if k == "destination" else tuple(v)
                                    for k, v in a.items()}, "security.acl")
                for a in raw.pop("acl", []))
    if "websocket-origins" in raw or "websocket_origins" in raw:
        origins = raw.pop("websocket-origins", raw.pop("websocket_origins", ()))
        raw["websocket_origins"] = tuple(str(o).rstrip("/") for o in origins)
    settings = _section(SecuritySettings, raw, "security")
    return replace(settings, users=users, acl=acl)
