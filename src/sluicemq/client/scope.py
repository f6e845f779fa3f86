"""What transactions and staged parts share, in both clients: `with` (`async with`) commits on
a clean exit and aborts on an exception, without masking that exception."""

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


class AsyncCommitScope:
    """Mixin for the asyncio client: `async with` begins (``begin()``, which returns the
    scope), then commits or aborts as `CommitScope` does."""

    finished: bool

    async def begin(self) -> Self:
        raise NotImplementedError

    async def commit(self) -> object:
        raise NotImplementedError

    async def abort(self) -> object:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return await self.begin()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.finished:
            return
        if exc_type is None:
            await self.commit()
        else:
            with contextlib.suppress(ClientError):  # never mask the error that got us here
                await self.abort()
