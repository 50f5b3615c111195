"""Streamed answers fed by a worker thread: the worker decodes and stores, the event loop only writes.

A streamed route hands `stream_work` a `work(feed)` to run on the generation pool. The worker puts
items (`kind`, payload) into the feed as it goes and never waits on the client; the response drains
the feed through `render`, one chunk of text per item. The first item decides the answer: an error
before any output is raised, so the client gets a normal JSON error instead of a broken stream. A
client that leaves sets `feed.client_gone`, and the worker stops at its next block (a cancelled run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from service.deps import Services
from service.errors import public_error

Item = tuple[str, Any]  # (kind, payload); kind "error" carries the exception
Render = Callable[[Item], tuple[str, bool]]  # an item → (text to send, whether it is the last)


class Feed:
    """The worker's side of the queue: thread-safe `put`, and whether the client is gone."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop, self._queue = loop, asyncio.Queue()
        self.client_gone = threading.Event()

    def put(self, kind: str, payload: Any = None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed (shutdown); the run is still recorded
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, payload))

    async def get(self) -> Item:
        return await self._queue.get()


async def stream_work(
    services: Services,
    work: Callable[[Feed], None],
    render: Render,
    media_type: str,
    not_started: Callable[[], None] = lambda: None,
) -> StreamingResponse:
    """Run `work(feed)` on the generation pool and stream `render` of each item it puts, until an item
    renders as the last. `not_started` runs if the worker could not even be submitted (e.g. to give
    back an admission slot the worker would have released)."""
    feed = Feed(asyncio.get_running_loop())
    try:
        services.decode_pool.submit(work, feed)
    except BaseException:
        not_started()
        raise
    first = await feed.get()
    if first[0] == "error":
        raise first[1]  # nothing was produced (e.g. the database failed): a plain JSON error
    return StreamingResponse(_drain(first, feed, render), media_type=media_type)


async def _drain(first: Item, feed: Feed, render: Render) -> AsyncIterator[str]:
    item = first
    try:
        while True:
            text, last = render(item)
            yield text
            if last:
                return
            item = await feed.get()
    finally:
        feed.client_gone.set()  # no-op after a finished run; otherwise the worker stops at its next block


def ndjson_line(data: dict) -> str:
    """One NDJSON line: the object's JSON (non-ASCII kept as is) and a newline."""
    return json.dumps(data, ensure_ascii=False) + "\n"


def error_line(err: BaseException) -> str:
    """The NDJSON line that ends a stream whose worker failed (the store, or the run itself)."""
    return ndjson_line({"event": "error", "status": "failed", "error": public_error(err)})
