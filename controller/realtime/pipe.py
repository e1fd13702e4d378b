"""`Pipe`: a bounded FIFO between two tasks of a session relay, with a final message that
never waits.

`put` waits while the pipe holds `capacity` items, so a reader that falls behind slows the
writer (and, through HTTP/2 flow control, whoever feeds the writer) instead of growing memory.
`finish` appends a last item at once, even over capacity (a failure, the worker lost): the
reader gets everything before it, then it, then nothing more.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Pipe(Generic[T]):
    """Bounded queue with a final, non-blocking last item (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[T] = deque()
        self._changed = asyncio.Condition()
        self.finished = False

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: T) -> bool:
        """Append `item` once there is room; False (nothing added) once the pipe is finished."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.finished or len(self._items) < self.capacity)
            if self.finished:
                return False
            self._items.append(item)
            self._changed.notify_all()
            return True

    def finish(self, last: T | None = None) -> None:
        """No more items after `last` (when given); wakes every waiter. Idempotent."""
        if self.finished:
            return
        self.finished = True
        if last is not None:
            self._items.append(last)
        asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def get(self) -> T | None:
        """The next item; None once the pipe is finished and empty."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.finished or bool(self._items))
            if self._items:
                item = self._items.popleft()
                self._changed.notify_all()
                return item
            return None
