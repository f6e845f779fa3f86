"""What a blocking transaction and a staged part share: `with` commits on a clean exit and
aborts on an exception, without masking that exception."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Self

from sluicemq.errors import ClientError


class CommitScope:
    """Mixin: needs ``finished``, ``commit()`` and ``abort()``."""

    finished: bool

    def commit(self) -> object:
        raise NotImplementedError

    def abort(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.finished:
            return
        if exc_type is None:
            self.commit()
        else:
            with contextlib.suppress(ClientError):  # never mask the error that got us here
                self.abort()
