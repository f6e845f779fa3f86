"""Staged publishing (docs/replay-protocol.md, sections 3 and 5): what both clients share, and
the blocking client's part.

``stage`` parks a part, ``publish_stage`` makes a batch's parts visible once, ``abort_stage``
drops them. `PartState` and the frame builders and answer readers below are sans-IO: the
blocking `StagedPart` here and the asyncio one (client/aio_staging.py) only carry their
frames. The header names are the wire contract, repeated here so the client does not depend
on the broker's packages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from sluicemq.client.machine import ClientMachine, Outgoing
from sluicemq.client.scope import CommitScope
from sluicemq.errors import ClientError
from sluicemq.protocol.columns import COLUMNS

if TYPE_CHECKING:
    from sluicemq.client.sync_conn import Connection

STAGE = "sluice-stage"
STAGE_COMMIT = "sluice-stage-commit"
STAGE_PARTS = "sluice-stage-parts"
STAGE_ABORT = "sluice-stage-abort"
RESULT = "sluice-stage-result"
MESSAGES = "sluice-stage-messages"
DISCARDED = "sluice-stage-discarded"
FORMAT = "sluice-format"
TOKEN = "sluice-stage-token"

Build = Callable[[ClientMachine], Outgoing]


class PublishResult(tuple[str, int]):
    """``(result, messages)`` of a publication, plus ``token``: for ``"published"`` the token
    sent with it, for ``"duplicate"`` the one the batch was first published with (None when
    that publisher gave none). Compare it with your own to tell your retry from someone
    else's batch."""

    token: str | None

    def __new__(cls, result: str, messages: int, token: str | None) -> PublishResult:
        self = super().__new__(cls, (result, messages))
        self.token = token
        return self

    @property
    def result(self) -> str:
        return self[0]

    @property
    def messages(self) -> int:
        return self[1]


class PartState:
    """One part of a batch as both clients see it: its frames and what its COMMIT answered.

    ``result`` is ``"staged"``, or ``"duplicate"`` when the batch was published already
    (nothing was stored); ``messages`` how many the broker stored.
    """

    def __init__(self, sink: str, batch: str | int, part: str | int) -> None:
        self.name = f"{sink}/{batch}/{part}"
        self.id = ""
        self.sent = 0
        self.finished = False
        self.result: str | None = None
        self.messages: int | None = None

    def begin_frame(self, m: ClientMachine) -> Outgoing:
        """The BEGIN that opens the part (with a receipt: the part exists once it comes)."""
        out = m.begin(headers={STAGE: self.name})
        assert out.ident is not None
        self.id = out.ident
        return out

    def send_frame(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None,
                   persistent: bool) -> Build:
        """A SEND into the part (no receipt: the COMMIT's covers it; never numbered for
        duplicate detection: publication is idempotent by itself)."""
        self._check_open()
        return lambda m: m.send(destination, body, headers, persistent=persistent,
                                receipt=False, transaction=self.id)

    def batch_frame(self, destination: str, batch: bytes,
                    headers: Mapping[str, str] | None) -> Build:
        """One SEND of a column batch (``protocol/columns.py``; its seq and timestamp columns
        are ignored); ``headers`` apply to every row, under each row's own."""
        self._check_open()
        h = {**(headers or {}), FORMAT: COLUMNS}
        return lambda m: m.send(destination, batch, h, persistent=True, receipt=False,
                                transaction=self.id)

    def commit_frame(self) -> Build:
        self._finish()
        return lambda m: m.commit(self.id)

    def abort_frame(self) -> Build:
        self._finish()
        return lambda m: m.abort(self.id)

    def committed(self, headers: Mapping[str, str]) -> tuple[str, int]:
        """Read the COMMIT's RECEIPT; raises ClientError when the broker stored fewer messages
        than were sent (it refused some with an ERROR): the part must be staged again."""
        if RESULT not in headers:
            raise ClientError("the broker does not support staged publishing")
        self.result, self.messages = headers[RESULT], int(headers.get(MESSAGES, "0"))
        if self.result == "staged" and self.messages != self.sent:
            raise ClientError(f"staged part {self.name}: the broker stored {self.messages} of "
                              f"{self.sent} messages (it refused some); stage the part again")
        return self.result, self.messages

    def _check_open(self) -> None:
        if not self.id:
            raise ClientError(f"staged part {self.name} was never begun")
        if self.finished:
            raise ClientError(f"staged part {self.name} is already finished")

    def _finish(self) -> None:
        self._check_open()
        self.finished = True


def publish_frame(sink: str, batch: str | int, parts: Iterable[str | int],
                  token: str | None = None) -> Build:
    """The COMMIT that publishes exactly ``parts`` of the batch."""
    headers = {STAGE_COMMIT: f"{sink}/{batch}", STAGE_PARTS: ",".join(str(p) for p in parts)}
    if token is not None:
        headers[TOKEN] = token
    return lambda m: m.commit("publish", headers=headers)


def published(answer: Mapping[str, str]) -> PublishResult:
    """("published" | "duplicate", messages) with ``.token``, from the publication's RECEIPT."""
    if RESULT not in answer:
        raise ClientError("the broker does not support staged publishing")
    return PublishResult(answer[RESULT], int(answer.get(MESSAGES, "0")), answer.get(TOKEN))


def abort_frame(sink: str, batch: str | int) -> Build:
    """The ABORT that discards a batch's parked parts."""
    return lambda m: m.abort("abort", headers={STAGE_ABORT: f"{sink}/{batch}"})


def discarded(answer: Mapping[str, str]) -> int:
    """How many parts an abort discarded, from its RECEIPT."""
    return int(answer.get(DISCARDED, "0"))


class StagedPart(PartState, CommitScope):
    """One part of a batch for the blocking client: SENDs parked invisibly until the batch is
    published. Begun on creation; use as a context manager: a clean exit commits (and waits
    for the RECEIPT: the part is then durable), an exception aborts."""

    def __init__(self, client: Connection, sink: str, batch: str | int, part: str | int) -> None:
        super().__init__(sink, batch, part)
        self.client = client
        client._call(self.begin_frame)

    def send(self, destination: str, body: bytes | str = b"",
             headers: Mapping[str, str] | None = None, *, persistent: bool = True) -> None:
        """Add a message to the part."""
        self.client._submit(self.send_frame(destination, body, headers, persistent))
        self.sent += 1

    def send_batch(self, destination: str, batch: bytes, count: int,
                   headers: Mapping[str, str] | None = None) -> None:
        """Add ``count`` messages packed as one column batch: one frame for many rows."""
        self.client._submit(self.batch_frame(destination, batch, headers))
        self.sent += count

    def commit(self) -> tuple[str, int]:
        """Park the part; returns (result, messages) (see `PartState.committed`)."""
        _, receipt = self.client._submit(self.commit_frame())
        return self.committed(receipt.result())

    def abort(self) -> None:
        self.client._call(self.abort_frame())


def publish_stage(client: Connection, sink: str, batch: str | int, parts: Iterable[str | int],
                  token: str | None = None) -> PublishResult:
    """Publish exactly ``parts`` of the batch; ("published" | "duplicate", messages), with
    ``.token`` (see `PublishResult`)."""
    _, receipt = client._submit(publish_frame(sink, batch, parts, token))
    return published(receipt.result())


def abort_stage(client: Connection, sink: str, batch: str | int) -> int:
    """Discard the batch's parked parts; returns how many there were."""
    _, receipt = client._submit(abort_frame(sink, batch))
    return discarded(receipt.result())
