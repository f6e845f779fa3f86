"""Destination names: `/queue/NAME` and `/topic/NAME`, validated once at the edge."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TypeVar

from sluicemq.errors import ProtocolError

QUEUE, TOPIC = "queue", "topic"
_PREFIXES = {"/queue/": QUEUE, "/topic/": TOPIC}
P = TypeVar("P", tuple[str, str], tuple[str, str, bool])  # a parsed composite part
_NAME_RE = re.compile(r"[A-Za-z0-9_\-.:@#$]{1,200}")


@functools.lru_cache(maxsize=10_000)
def parse_destination(destination: str | None) -> tuple[str, str]:
    """Split a STOMP destination into (kind, name) or raise a non-fatal ProtocolError.

    Names are 1-200 characters of letters, digits and ``_-.:@#$``: no wildcards, spaces or
    slashes, so they are safe as journal keys, file names and metric labels. Every SEND asks,
    for a handful of names: the answer is remembered (a refusal is not).
    """
    return _parse(destination)


def _parse(destination: str | None) -> tuple[str, str]:
    if not destination:
        raise ProtocolError("missing 'destination' header", fatal=False)
    for prefix, kind in _PREFIXES.items():
        if destination.startswith(prefix):
            name = destination[len(prefix):]
            if not _NAME_RE.fullmatch(name) or name.strip(".") != name or ".." in name:
                raise ProtocolError(
                    f"invalid destination name {destination!r}: use 1-200 of A-Z a-z 0-9 _-.:@#$",
                    fatal=False,
                )
            return kind, name
    raise ProtocolError(
        f"invalid destination {destination!r}: it must start with /queue/ or /topic/", fatal=False
    )


_SEGMENT_RE = re.compile(r"[A-Za-z0-9_\-:@#$]{1,200}|\*|>")


def parse_subscription(destination: str | None) -> tuple[str, str, bool]:
    """A SUBSCRIBE destination: (kind, name, is_pattern). Names may be ActiveMQ wildcard
    patterns (``/topic/prices.*``, ``/queue/orders.>``: ``*`` one segment, ``>`` the rest)."""
    for prefix, kind in _PREFIXES.items():
        if destination and destination.startswith(prefix):
            segs = destination[len(prefix):].split(".")
            if "*" in segs or ">" in segs:
                if (not all(_SEGMENT_RE.fullmatch(s) for s in segs) or ">" in segs[:-1]
                        or len(destination) > 220):
                    raise ProtocolError(f"invalid wildcard destination {destination!r}: "
                                        "segments of A-Z a-z 0-9 _-:@#$, '*', and '>' last",
                                        fatal=False)
                return kind, ".".join(segs), True
    kind, name = parse_destination(destination)
    return kind, name, False


MAX_COMPOSITE = 64  # destinations one composite SEND may name


def parse_composite(destination: str) -> list[tuple[str, str]]:
    """An ActiveMQ composite destination, ``/queue/a,/topic/b,c``: each part as (kind, name),
    in order, without repeats; a part without a prefix is of the kind of the part before it
    (``/queue/a,b`` is two queues), as ActiveMQ reads it."""
    return _composite(destination, parse_destination)


def parse_composite_subscription(destination: str) -> list[tuple[str, str, bool]]:
    """A composite SUBSCRIBE, ``/queue/a,/topic/b.>,c``: each part as ``parse_subscription``
    reads it (wildcards allowed), by the same rules as ``parse_composite``."""
    return _composite(destination, parse_subscription)


def _composite(destination: str, parse: Callable[[str], P]) -> list[P]:
    out: list[P] = []
    kind: str | None = None
    for raw in destination.split(","):
        part = raw.strip()
        if kind is not None and not part.startswith("/"):
            part = destination_of(kind, part)
        parsed = parse(part)
        if parsed not in out:
            out.append(parsed)
        kind = parsed[0]
        if len(out) > MAX_COMPOSITE:
            raise ProtocolError(f"a composite destination may name at most {MAX_COMPOSITE} "
                                "destinations", fatal=False)
    return out


def destination_of(kind: str, name: str) -> str:
    return f"/{kind}/{name}"
