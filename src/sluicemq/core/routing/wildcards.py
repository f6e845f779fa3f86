"""Wildcard subscriptions (ActiveMQ syntax): ``.`` separates segments, ``*`` matches
one segment, ``>`` whatever follows (as ActiveMQ's prefix filter, also nothing: ``prices.>``
matches ``prices``, the same rule as ``[[policy]]`` patterns).

Why a trie of segments: publish cost must not grow with the number of wildcard subscriptions.
A topic name is matched by walking its segments once, following the literal child, the ``*``
child and any ``>`` child at each step, so the cost is the depth of the name times the few
branches that actually match, not one pattern test per subscription. Which subscriber may
read which concrete topic is decided per message (``may_read``), so a pattern never reaches
a topic its user may not read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from sluicemq.config import match_destination

if TYPE_CHECKING:
    from sluicemq.core.routing.message import Message
    from sluicemq.core.selectors import Selector

MayRead = Callable[[str], bool]


class Subscriber(Protocol):
    """What the index reads of a subscriber queue: its selector (the broker's are ``Queue``)."""

    @property
    def selector(self) -> Selector | None: ...


S = TypeVar("S", bound=Subscriber)


def is_pattern(name: str) -> bool:
    """Does a topic name use wildcards (a whole ``*`` or ``>`` segment)?"""
    return any(seg in ("*", ">") for seg in name.split("."))


def valid_pattern(name: str) -> bool:
    """``>`` only last; every segment non-empty."""
    segs = name.split(".")
    return all(segs) and ">" not in segs[:-1]


@dataclass(slots=True)
class _Node(Generic[S]):
    children: dict[str, _Node[S]] = field(default_factory=dict)
    here: dict[str, tuple[S, MayRead]] = field(default_factory=dict)  # pattern ends here


class WildcardIndex(Generic[S]):
    """Every live wildcard subscription, by pattern segments; keyed by subscriber queue key."""

    def __init__(self) -> None:
        self._root: _Node[S] = _Node()
        self._patterns: dict[str, str] = {}  # queue key -> pattern

    def __len__(self) -> int:
        return len(self._patterns)

    def add(self, pattern: str, key: str, queue: S, may_read: MayRead) -> None:
        node = self._root
        for seg in pattern.split("."):
            node = node.children.setdefault(seg, _Node())
        node.here[key] = (queue, may_read)
        self._patterns[key] = pattern

    def remove(self, key: str) -> None:
        pattern = self._patterns.pop(key, None)
        if pattern is None:
            return
        segs = pattern.split(".")
        nodes = [self._root]
        for seg in segs:
            nodes.append(nodes[-1].children[seg])
        nodes[-1].here.pop(key, None)
        for depth in range(len(segs), 0, -1):  # prune branches nothing ends in any more
            if nodes[depth].here or nodes[depth].children:
                break
            del nodes[depth - 1].children[segs[depth - 1]]

    def targets(self, topic: str, msg: Message) -> list[S]:
        """Subscriber queues whose pattern matches ``topic``, whose selector accepts ``msg``
        and whose user may read ``topic``."""
        found: dict[str, tuple[S, MayRead]] = {}
        segs = topic.split(".")
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            rest = node.children.get(">")
            if rest is not None:
                found.update(rest.here)
            if i == len(segs):
                found.update(node.here)
                continue
            for child in (node.children.get(segs[i]), node.children.get("*")):
                if child is not None:
                    stack.append((child, i + 1))
        return [q for q, may_read in found.values()
                if (q.selector is None or q.selector.matches(msg.headers)) and may_read(topic)]


class QueueWatch:
    """Wildcard queue subscriptions (``/queue/orders.>``) waiting for queues to appear: each
    is told the name of every queue created after it that its pattern matches. Queues come
    into being far less often than messages are published, so a scan of the few watchers
    per new queue is enough."""

    def __init__(self) -> None:
        self._watchers: dict[str, tuple[str, Callable[[str], None]]] = {}

    def __bool__(self) -> bool:
        return bool(self._watchers)

    def add(self, key: str, pattern: str, created: Callable[[str], None]) -> None:
        self._watchers[key] = (pattern, created)

    def remove(self, key: str) -> None:
        self._watchers.pop(key, None)

    def created(self, name: str) -> None:
        """Queue ``name`` was just created."""
        for pattern, created in list(self._watchers.values()):
            if match_destination(pattern, name):
                created(name)
