"""Admission control for generations: at most `limit` are admitted at once (decoding, or waiting for the
model lock); one more is refused with 429 and a Retry-After header instead of queueing without bound.

Admitted generations run on their own thread pool (`Services.decode_pool`), so however many wait for
the model lock, database reads, /health and /ready keep their own threads (`Services.executor`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

RETRY_AFTER_S = 1  # a short generation on the embedded pair takes about a second


class Busy(Exception):
    """Every generation slot is taken; the client should retry after `retry_after_s` seconds."""

    def __init__(self, limit: int, retry_after_s: int = RETRY_AFTER_S):
        super().__init__(f"the server is busy: {limit} generations are running or waiting; retry shortly")
        self.retry_after_s = retry_after_s

    def detail(self) -> list[dict]:
        return [{"loc": ["server", "generation_queue"], "msg": str(self), "type": "busy"}]


class Admission:
    """A counter of admitted generations with a hard limit (thread-safe)."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"the generation queue must admit at least 1 request, got {limit}")
        self.limit, self._admitted, self._lock = limit, 0, threading.Lock()

    @property
    def admitted(self) -> int:
        """Generations running or waiting for the model lock now."""
        return self._admitted

    def acquire(self) -> None:
        """Take a slot, or raise Busy at once."""
        with self._lock:
            if self._admitted >= self.limit:
                raise Busy(self.limit)
            self._admitted += 1

    def release(self) -> None:
        with self._lock:
            self._admitted -= 1

    @contextmanager
    def slot(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()
