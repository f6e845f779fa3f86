"""Staged publishing for the blocking client (docs/replay-protocol.md, sections 3 and 5).

``Client.stage`` parks a part, ``Client.publish_stage`` makes a batch's parts visible once,
``Client.abort_stage`` drops them. The header names are the wire contract, repeated here so the
client does not depend on the broker's packages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

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


class StagedPart(CommitScope):
    """One part of a batch: SENDs parked invisibly until the batch is published.

    Use as a context manager: a clean exit commits (and waits for the RECEIPT: the part is then
    durable), an exception aborts. ``result`` is ``"staged"``, or ``"duplicate"`` when the batch
    was published already (nothing was stored); ``messages`` how many the broker stored.
    """

    def __init__(self, client: Connection, sink: str, batch: str | int, part: str | int) -> None:
        self.client = client
        self.name = f"{sink}/{batch}/{part}"
        out = client._call(lambda m: m.begin(headers={STAGE: self.name}))
        assert out.ident is not None
        self.id = out.ident
        self.sent = 0
        self.finished = False
        self.result: str | None = None
        self.messages: int | None = None

    def send(self, destination: str, body: bytes | str = b"",
             headers: Mapping[str, str] | None = None, *, persistent: bool = True) -> None:
        """Add a message to the part (no receipt: the COMMIT's covers it; never numbered for
        duplicate detection: publication is idempotent by itself)."""
        if self.finished:
            raise ClientError(f"staged part {self.name} is already finished")
        self.client._submit(lambda m: m.send(destination, body, headers, persistent=persistent,
                                             receipt=False, transaction=self.id))
        self.sent += 1

    def send_batch(self, destination: str, batch: bytes, count: int,
                   headers: Mapping[str, str] | None = None) -> None:
        """Add ``count`` messages packed as one column batch (``protocol/columns.py``; its
        seq and timestamp columns are ignored): one frame for many rows. ``headers`` apply to
        every message of the batch, under each message's own."""
        if self.finished:
            raise ClientError(f"staged part {self.name} is already finished")
        h = {**(headers or {}), FORMAT: COLUMNS}
        self.client._submit(lambda m: m.send(destination, batch, h, persistent=True,
                                             receipt=False, transaction=self.id))
        self.sent += count

    def commit(self) -> tuple[str, int]:
        """Park the part; returns (result, messages). Raises ClientError when the broker
        stored fewer messages than were sent (it refused some with an ERROR): the part must
        be staged again."""
        self._finish()
        _, receipt = self.client._submit(lambda m: m.commit(self.id))
        headers = receipt.result()
        if RESULT not in headers:
            raise ClientError("the broker does not support staged publishing")
        self.result, self.messages = headers[RESULT], int(headers.get(MESSAGES, "0"))
        if self.result == "staged" and self.messages != self.sent:
            raise ClientError(f"staged part {self.name}: the broker stored {self.messages} of "
                              f"{self.sent} messages (it refused some); stage the part again")
        return self.result, self.messages

    def abort(self) -> None:
        self._finish()
        self.client._call(lambda m: m.abort(self.id))

    def _finish(self) -> None:
        if self.finished:
            raise ClientError(f"staged part {self.name} is already finished")
        self.finished = True


def publish_stage(client: Connection, sink: str, batch: str | int, parts: Iterable[str | int],
                  token: str | None = None) -> PublishResult:
    """Publish exactly ``parts`` of the batch; ("published" | "duplicate", messages), with
    ``.token`` (see `PublishResult`)."""
    headers = {STAGE_COMMIT: f"{sink}/{batch}", STAGE_PARTS: ",".join(str(p) for p in parts)}
    if token is not None:
        headers[TOKEN] = token
    _, receipt = client._submit(lambda m: m.commit("publish", headers=headers))
    answer = receipt.result()
    if RESULT not in answer:
        raise ClientError("the broker does not support staged publishing")
    return PublishResult(answer[RESULT], int(answer.get(MESSAGES, "0")), answer.get(TOKEN))


def abort_stage(client: Connection, sink: str, batch: str | int) -> int:
    """Discard the batch's parked parts; returns how many there were."""
    _, receipt = client._submit(lambda m: m.abort("abort",
                                                  headers={STAGE_ABORT: f"{sink}/{batch}"}))
    return int(receipt.result().get(DISCARDED, "0"))
