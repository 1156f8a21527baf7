"""Signed usage rows stored by group commit: one transaction per batch, on one thread of its own.

Every finished stream's usage row is durable before that stream ends (its caller awaits the commit);
rows that finish while a commit is running are written together in the next one, and the writes
never queue in the default executor that key look-ups and other work share.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor

from api.store.models import UsageRow
from api.store.repo import Store


class UsageWriter:
    def __init__(self, store: Store, max_batch: int = 512) -> None:
        self.store, self.max_batch = store, max_batch
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="usage-writer")
        self._pending: list[tuple[UsageRow, asyncio.Future[bool]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def record(self, row: UsageRow) -> bool:
        """Store `row`; returns once it is committed: False if a row of that worker and request was
        already stored (and this one is not). A caller cancelled meanwhile does not cancel the write."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume)
        self._pending.append((row, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            try:
                stored = await loop.run_in_executor(self._executor, self.store.record_usage_batch,
                                                    [r for r, _ in batch])
            except Exception as exc:  # each waiting stream sees the failure, as with a single write
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            else:
                for (_, future), fresh in zip(batch, stored, strict=True):
                    if not future.done():
                        future.set_result(fresh)

    async def close(self) -> None:
        """Commit what is pending, then stop the thread."""
        if self._drainer is not None:
            with contextlib.suppress(Exception):
                await self._drainer
        self._executor.shutdown(wait=True)


def _consume(future: asyncio.Future[bool]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a waiter that was cancelled leaves no "never retrieved" warning
