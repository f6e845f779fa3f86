"""Who may connect and what they may touch: hashed users, ActiveMQ-style ACLs, login throttling.

Passwords are stored only as argon2id hashes (salted, memory-hard), so a leaked config file does
not leak passwords. Verifying one costs tens of milliseconds, which is the point, so it runs in
a worker thread and the event loop never waits for it. A failed login is answered late to make
online guessing slow, and failures are counted per (address, login name): a name that keeps
failing from an address is refused there without checking, while other users from the same
address - and that user from elsewhere - still get in. Checks in progress count as failures
until they finish, so a burst of concurrent guesses gets no more hashes computed than the limit;
unknown names are refused after a wait as long as a check, with no hash at all; logins with the
very same credentials share one check (a reconnect storm is not a burst of failures); and at
most ``HASH_WORKERS`` hashes run at once, from a queue bounded at ``MAX_PENDING_CHECKS``.

Authorization follows ActiveMQ's authorization map: every rule whose destination pattern matches
contributes its principals (union); once any rule exists, an action no rule grants is refused.
Principals are user names, group names, or "*" for any authenticated user; the anonymous user
(when anonymous access is on) belongs to the group "anonymous".
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import VerificationError, VerifyMismatchError

from sluicemq.config import AclEntry, BrokerConfig, SecuritySettings, match_destination

log = logging.getLogger("sluicemq.security")

READ, WRITE, ADMIN = "read", "write", "admin"
BROWSE = "browse"  # reading without consuming: needs `read`
ACTIONS = frozenset({READ, WRITE, ADMIN, BROWSE})
ANONYMOUS_GROUP = "anonymous"
FAILURE_WINDOW = 60.0  # seconds over which failed logins per (address, name) are counted
MAX_PENDING_CHECKS = 64  # hash verifications queued at once; beyond it logins fail fast
HASH_WORKERS = 2  # hash verifications running at once (each takes a core for tens of ms)

_hasher = PasswordHasher()  # argon2id with the library's current recommended parameters


def hash_password(password: str) -> str:
    """A salted argon2id hash in PHC string form, for `[[security.users]] password`."""
    return _hasher.hash(password)


def verify_password(stored_hash: str, password: str) -> bool:
    """True only if `password` matches; a malformed hash is a mismatch, never an exception."""
    try:
        return _hasher.verify(stored_hash, password)
    except (VerifyMismatchError, VerificationError, ValueError):  # InvalidHashError, non-ASCII
        return False


@dataclass(frozen=True, slots=True)
class User:
    """An authenticated principal: a name and the groups the ACL rules refer to."""

    name: str
    groups: frozenset[str] = frozenset()

    @property
    def principals(self) -> frozenset[str]:
        return self.groups | {self.name, "*"}


ANONYMOUS = User("anonymous", frozenset({ANONYMOUS_GROUP}))


def _split_pattern(pattern: str) -> tuple[str | None, str]:
    for kind in ("queue", "topic"):
        prefix = f"/{kind}/"
        if pattern.startswith(prefix):
            return kind, pattern[len(prefix):]
    return None, pattern


class Acl:
    """Per-destination rules; `allows` answers for one user, action and destination.

    A dead-letter queue (``/queue/<prefix><origin>``, one of ``dlq_prefixes``) also grants what
    its origin grants (``/queue/<origin>`` or ``/topic/<origin>``): whoever may read orders may
    read the orders that died there, without a rule per DLQ. Rules naming the DLQ add to that.
    """

    def __init__(self, entries: tuple[AclEntry, ...], dlq_prefixes: tuple[str, ...] = ()) -> None:
        self.entries = entries
        self.dlq_prefixes = tuple(p for p in dlq_prefixes if p)
        self._rules = [(*_split_pattern(e.destination), e) for e in entries]

    def allows(self, user: User, action: str, destination: str | None) -> bool:
        """`destination` is "/queue/x" or "/topic/x"; None asks for broker-wide rights.

        Broker-wide rights (console, connections, overview) come only from rules whose pattern
        covers every destination of both kinds: ">" or "*"-free catch-alls.
        """
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        if not self._rules:
            return True
        field_name = READ if action == BROWSE else action
        principals = user.principals
        if destination is None:
            candidates = [e for kind, pattern, e in self._rules if kind is None and pattern == ">"]
        else:
            kind, name = _split_pattern(destination)
            if kind is None:
                return False
            candidates = [e for k, pattern, e in self._rules
                          if (k is None or k == kind) and match_destination(pattern, name)]
        if any(principals.intersection(getattr(e, field_name)) for e in candidates):
            return True
        if destination is None or kind != "queue":
            return False
        return any(self.allows(user, action, f"/{origin_kind}/{name[len(prefix):]}")
                   for prefix in self.dlq_prefixes
                   if name.startswith(prefix) and len(name) > len(prefix)
                   for origin_kind in ("queue", "topic"))


ThrottleKey = Hashable  # (address, login name); any hashable in unit tests


class LoginThrottle:
    """Failed logins per key over a sliding window, checks in progress counted as failures;
    sans-IO, the caller passes the time."""

    def __init__(self, max_failures: int, window: float = FAILURE_WINDOW) -> None:
        self.max_failures = max_failures
        self.window = window
        self._failures: dict[ThrottleKey, deque[float]] = {}
        self._checking: dict[ThrottleKey, int] = {}

    def _recent(self, address: ThrottleKey, now: float) -> deque[float]:
        times = self._failures.get(address)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[address]
        return times

    def blocked(self, address: ThrottleKey, now: float) -> bool:
        return (len(self._recent(address, now)) + self._checking.get(address, 0)
                >= self.max_failures)

    def checking(self, address: ThrottleKey, delta: int) -> None:
        """A check for ``address`` started (+1) or finished (-1)."""
        left = self._checking.get(address, 0) + delta
        if left > 0:
            self._checking[address] = left
        else:
            self._checking.pop(address, None)

    def failed(self, address: ThrottleKey, now: float) -> None:
        self._recent(address, now)
        self._failures.setdefault(address, deque()).append(now)
        if len(self._failures) > 100_000:  # bound memory under a spray of source addresses
            oldest = min(self._failures, key=lambda a: self._failures[a][-1])
            del self._failures[oldest]

    def succeeded(self, address: ThrottleKey) -> None:
        self._failures.pop(address, None)


LoginDone = Callable[[User | None, str], None]


class Security:
    """The broker's one gate: authenticate logins (STOMP, HTTP basic) and authorize actions."""

    def __init__(self, settings: SecuritySettings, clock: Callable[[], float] = time.monotonic,
                 dlq_prefixes: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.users = {u.name: u for u in settings.users}
        self.acl = Acl(settings.acl, dlq_prefixes if settings.dlq_follows_origin else ())
        self.throttle = LoginThrottle(settings.max_login_failures)
        self._clock = clock
        self._pending = 0
        self._hashing: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._check_seconds = 0.05  # how long a hash check takes lately (unknown names wait it)
        # Verified (user, password) pairs, keyed by an HMAC under a per-process secret, so a
        # reconnect storm costs one argon2 check per user, not one per connection.
        self._secret = os.urandom(32)
        self._verified: dict[str, bytes] = {}
        self._checks: dict[bytes, asyncio.Future[User | None]] = {}  # token -> check running
        self.durables: DurableOwners | None = None

    @property
    def enabled(self) -> bool:
        """False for an open broker: credentials are then ignored, as ActiveMQ does."""
        return bool(self.users) or not self.anonymous_allowed

    @property
    def anonymous_allowed(self) -> bool:
        if self.settings.anonymous is not None:
            return self.settings.anonymous
        return not self.users

    def user(self, name: str) -> User | None:
        entry = self.users.get(name)
        return User(entry.name, frozenset(entry.groups)) if entry else None

    def owner(self, user: User | None) -> str | None:
        """Whom a connection's staged batches and streams belong to: its user's name with
        security on (anonymous included), nobody (None) on an open broker."""
        if not self.enabled:
            return None
        return (user or ANONYMOUS).name

    def authorize(self, user: User | None, action: str, destination: str | None) -> bool:
        """May `user` (None: anonymous) do `action` on `destination` (None: broker-wide)?"""
        return self.acl.allows(user or ANONYMOUS, action, destination)

    def durable_reader(self, key: str) -> Callable[[str], bool]:
        """Which topics durable subscription ``key`` may collect: what the user who created
        it may read (anonymous when nobody owns it), asked while its client is away too."""
        name = self.durables.owner(key) if self.durables is not None else None
        user = self.user(name) if name is not None else None
        return lambda topic: self.authorize(user, READ, f"/topic/{topic}")

    # -- authentication ----------------------------------------------------------------------
    def _token(self, login: str, passcode: str) -> bytes:
        return hmac.new(self._secret, f"{login}\0{passcode}".encode(), hashlib.sha256).digest()

    def _cached(self, login: str, passcode: str) -> bool:
        """Was this very (login, passcode) verified before?  Cheap: no hash."""
        known = self._verified.get(login)
        return known is not None and hmac.compare_digest(known, self._token(login, passcode))

    def _check(self, login: str, passcode: str) -> User | None:
        """Blocking: verify one password (in a worker thread)."""
        entry = self.users[login]
        started = time.monotonic()
        ok = verify_password(entry.password, passcode)
        self._check_seconds = 0.8 * self._check_seconds + 0.2 * (time.monotonic() - started)
        if not ok:
            return None
        self._verified[login] = self._token(login, passcode)
        return self.user(login)

    async def _verify(self, login: str, passcode: str) -> User | None:
        """Check a password of a configured user: at most HASH_WORKERS hashes at once, and
        logins with the very same credentials meanwhile wait for this answer (``_checks``)."""
        if self._cached(login, passcode):
            return self.user(login)
        loop = asyncio.get_running_loop()
        if self._hashing is None or self._hashing[0] is not loop:
            self._hashing = (loop, asyncio.Semaphore(HASH_WORKERS))
        token = self._token(login, passcode)
        shared: asyncio.Future[User | None] = loop.create_future()
        self._checks[token] = shared
        try:
            async with self._hashing[1]:
                user = await loop.run_in_executor(None, self._check, login, passcode)
        except BaseException:
            shared.set_result(None)
            raise
        finally:
            del self._checks[token]
        shared.set_result(user)
        return user

    async def authenticate(self, login: str | None, passcode: str | None, peer: str,
                           cert_user: str | None = None) -> tuple[User | None, str]:
        """Who is this?  (user, "") on success, (None, reason) on refusal; never raises.

        A verified client-certificate CN naming a configured user logs in without a passcode.
        Failures are counted per (address, login name) - the host part of `peer` - and logged.
        """
        address = peer.rpartition(":")[0] or peer
        now = self._clock()
        if login is None and cert_user is not None and cert_user in self.users:
            return self.user(cert_user), ""
        if login is None:
            if self.anonymous_allowed:
                return None, ""
            return self._fail((address, None), peer, "-", "authentication required")
        if cert_user is not None and login == cert_user and login in self.users:
            return self.user(login), ""
        key = (address, login)
        if self.throttle.blocked(key, now):
            return self._fail(key, peer, login, "too many failed logins; try again later",
                              count=False)
        shared = self._checks.get(self._token(login, passcode or ""))
        if shared is not None:  # a reconnect storm: one check answers every copy
            return self._outcome(key, peer, login, await asyncio.shield(shared))
        if self._pending >= MAX_PENDING_CHECKS:
            return self._fail(key, peer, login, "login service busy; try again later",
                              count=False)
        self._pending += 1
        self.throttle.checking(key, +1)
        try:
            if login in self.users:
                user = await self._verify(login, passcode or "")
            else:  # as slow as a real check, so that the answer does not tell which names exist
                await asyncio.sleep(self._check_seconds)
                user = None
        finally:
            self._pending -= 1
            self.throttle.checking(key, -1)
        return self._outcome(key, peer, login, user)

    def _outcome(self, key: ThrottleKey, peer: str, login: str,
                 user: User | None) -> tuple[User | None, str]:
        if user is None:
            return self._fail(key, peer, login, "invalid login or passcode")
        self.throttle.succeeded(key)
        log.info("login %r from %s", login, peer)
        return user, ""

    def _fail(self, key: ThrottleKey, peer: str, login: str, reason: str,
              count: bool = True) -> tuple[None, str]:
        if count:
            self.throttle.failed(key, self._clock())
        log.warning("login refused for %r from %s: %s", login, peer, reason)
        return None, reason

    def begin_login(self, login: str | None, passcode: str | None, peer: str,
                    cert_user: str | None, done: LoginDone) -> None:
        """Callback form for sans-IO sessions; a refusal is reported after the failure delay."""
        loop = asyncio.get_running_loop()

        async def run() -> None:
            user, reason = await self.authenticate(login, passcode, peer, cert_user)
            if reason:
                await asyncio.sleep(self.settings.login_failure_delay)
            done(user, reason)

        task = loop.create_task(run())
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    async def authenticate_basic(self, header: str | None, peer: str) -> tuple[User | None, str]:
        """HTTP `Authorization: Basic …` against the same users (for the admin API)."""
        if not header or not header.lower().startswith("basic "):
            return await self.authenticate(None, None, peer)
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return self._fail((peer.rpartition(":")[0] or peer, None), peer, "?",
                              "malformed credentials")
        login, sep, passcode = decoded.partition(":")
        if not sep:
            return self._fail((peer.rpartition(":")[0] or peer, login), peer, login,
                              "malformed credentials")
        return await self.authenticate(login, passcode, peer)


_tasks: set[asyncio.Task[Any]] = set()
def build_security(config: BrokerConfig) -> Security:
    """The broker's one Security, from its config (built by the composition root)."""
    prefixes = {config.policy.dlq_prefix} | {
        str(e.overrides["dlq_prefix"]) for e in config.policies if "dlq_prefix" in e.overrides}
    security = Security(config.security, dlq_prefixes=tuple(sorted(prefixes)))
    security.durables = DurableOwners(Path(config.data_dir) / "durable-owners.json")
    return security


class DurableOwners:
    """Which user created each durable subscription, so another user cannot take it over.

    Kept in a small JSON file beside the journal (rewritten atomically: write, fsync, rename);
    only subscriptions made by an authenticated user are owned.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._owners: dict[str, str] = json.loads(path.read_text())
        except FileNotFoundError:
            self._owners = {}
        except (OSError, ValueError) as exc:
            log.warning("durable owners file %s unreadable (%s): starting empty", path, exc)
            self._owners = {}

    def owner(self, key: str) -> str | None:
        return self._owners.get(key)

    def claim(self, key: str, user: User | None) -> bool:
        """May `user` use durable `key`?  The first authenticated user to use it owns it."""
        owner = self._owners.get(key)
        if owner is not None:
            return user is not None and user.name == owner
        if user is not None:
            self._owners[key] = user.name
            self._save()
        return True

    def release(self, key: str) -> None:
        if self._owners.pop(key, None) is not None:
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(self._owners, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
