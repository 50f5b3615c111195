"""One stored generation, as every single-run route does it (POST /generate, POST /v1/completions, POST
/v1/chat/completions): the server's limits, a generation slot, the Engine's checks, decoding (answered
at the end, or streamed block by block), storing.

`admitted` takes a slot that the decoding step gives back: call `decode_stored` or `stream_stored` on
what it returns, with nothing in between that could raise.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from sd2.engine import PreparedRequest
from sd2.trace import Block
from service import repository
from service.deps import Services
from service.generation import admit, decode, prepare
from service.repository import RunRecord
from service.schemas import DecodeSettings
from service.streaming import Feed, Render, stream_work


async def admitted(services: Services, body: DecodeSettings, method: str) -> PreparedRequest:
    """Check `body` against the server's limits, take a generation slot (Busy: 429, nothing stored) and
    let the Engine check the request (a refusal: FieldError, the slot given back)."""
    request = prepare(body, method, services.settings)
    await services.find_method(method)
    services.admission.acquire()
    try:
        return await services.in_decode_pool(admit, services.host, request)
    except BaseException:
        services.admission.release()
        raise


async def decode_stored(
    services: Services, prepared: PreparedRequest, prompt_set: str | None, http: Request
) -> tuple[int, RunRecord]:
    """Decode an admitted request to the end, give its slot back and store the run; a client that hangs
    up cancels it at the next block instead of decoding on for nobody. Returns (run id, record)."""
    gone = threading.Event()
    watcher = asyncio.create_task(_watch_disconnect(http, gone))
    try:
        record = await services.in_decode_pool(decode, services.host, prepared, prompt_set, None, gone.is_set)
    finally:
        watcher.cancel()
        services.admission.release()
    run_id = await services.in_thread(repository.record_run, services.db, record)
    return run_id, record


async def stream_stored(
    services: Services,
    prepared: PreparedRequest,
    prompt_set: str | None,
    block_item: Callable[[Block], Any],
    render: Render,
    media_type: str,
) -> StreamingResponse:
    """Decode an admitted request on the generation pool, streaming as it goes (service.streaming).

    The worker puts ("block", block_item(block)) per block — `block_item` runs under the model lock, so
    it may use the tokenizer — then ("done", (run id, record)) once the run is stored, or ("error",
    exception). It gives the slot back when decoding ends; a client that leaves makes the run stop at the
    next block and store a cancelled run."""

    def work(feed: Feed) -> None:
        def on_block(block: Block) -> None:
            feed.put("block", block_item(block))

        try:
            record = decode(services.host, prepared, prompt_set, on_block, feed.client_gone.is_set)
        except BaseException as err:
            feed.put("error", err)
            return
        finally:
            services.admission.release()  # storing needs no model
        try:
            feed.put("done", (repository.record_run(services.db, record), record))
        except BaseException as err:
            feed.put("error", err)

    return await stream_work(services, work, render, media_type, services.admission.release)


async def _watch_disconnect(http: Request, gone: threading.Event, interval_s: float = 0.2) -> None:
    """Set `gone` once the client of a plain (non-streamed) request has disconnected."""
    while not await http.is_disconnected():
        await asyncio.sleep(interval_s)
    gone.set()
