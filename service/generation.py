"""Running generations against the one loaded Engine: validate, decode under the model lock, record.

The Engine is not thread-safe (its steering hooks and KV caches assume one run at a time), so every
use of its models — decoding and training alike — holds `ModelHost.lock`. Decoding runs in worker
threads so the event loop keeps serving while a run waits for, or holds, the lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

from sd2.config import DecodeConfig
from sd2.engine import Engine, GenerateRequest
from sd2.errors import InvalidValue
from sd2.prompts import validate_messages
from sd2.trace import Block
from service.errors import FieldError, from_invalid
from service.repository import RunRecord
from service.schemas import DecodeSettings
from service.settings import Settings

log = logging.getLogger(__name__)


class RunCancelled(Exception):
    """The client went away mid-stream; the run stops at the next block boundary."""


@dataclass
class ModelHost:
    """The loaded Engine and the lock that serialises every use of its models."""

    engine: Engine
    lock: threading.Lock


def prepare(body: DecodeSettings, method: str, engine: Engine, settings: Settings) -> GenerateRequest:
    """Check a request against the server's limits and loaded methods; FieldError names the bad field."""
    if body.prompt is not None and len(body.prompt) > settings.max_prompt_chars:
        raise FieldError("prompt", f"prompt is longer than {settings.max_prompt_chars} characters")
    messages = [m.model_dump() for m in body.messages] if body.messages is not None else None
    if messages is not None and sum(len(m["content"]) for m in messages) > settings.max_prompt_chars:
        raise FieldError("messages", f"messages hold more than {settings.max_prompt_chars} characters in all")
    if body.max_new_tokens > settings.max_new_tokens:
        raise FieldError(
            "max_new_tokens", f"max_new_tokens must be ≤ {settings.max_new_tokens} on this server"
        )
    if method not in engine.methods():
        raise FieldError("method", f"unknown method {method!r}; available: {', '.join(engine.methods())}")
    try:
        decode = DecodeConfig(
            k=body.k,
            temperature=body.temperature,
            top_k=body.top_k,
            top_p=body.top_p,
            max_new_tokens=body.max_new_tokens,
            seed=body.seed,
            draft_threshold=body.draft_threshold,
        )
        if messages is not None:
            validate_messages(messages)
    except InvalidValue as err:
        raise from_invalid(err) from err
    return GenerateRequest(
        prompt=body.prompt,
        messages=tuple(messages) if messages is not None else None,
        method=method,
        decode=decode,
        steering=body.steering,
        chat=body.chat,
    )


def decode(
    host: ModelHost,
    request: GenerateRequest,
    prompt_set: str | None = None,
    on_block: Callable[[Block], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> RunRecord:
    """Run one generation under the model lock and describe its outcome (nothing is written here).

    Raises FieldError when the prompt does not fit the verifier (before any decoding); any later
    exception becomes a record with status failed (or cancelled when `should_stop` said so).
    """
    engine = host.engine
    drafter = engine.drafters.get(request.method)
    record = RunRecord(
        method=request.method,
        drafter=request.method if drafter is not None else None,
        steering=bool(request.steering and drafter is not None and drafter.head is not None),
        config=asdict(request.decode),
        prompt=request.prompt,
        messages=list(request.messages) if request.messages is not None else None,
        prompt_set=prompt_set,
        precision=engine.precision,
    )
    with host.lock:
        try:
            engine.encode(request)  # tokenizer only: a too-long prompt is the caller's error, not a failure
        except InvalidValue as err:
            raise from_invalid(err) from err
        except ValueError as err:  # the tokenizer's own refusal of the text
            raise FieldError("prompt" if request.messages is None else "messages", str(err)) from err
        try:
            record.result = _run(engine, request, on_block, should_stop)
        except RunCancelled:
            record.status, record.error = "cancelled", "the client disconnected before the run finished"
        except Exception as err:  # recorded as a failed run; the server keeps serving
            log.exception("generation failed (method %s)", request.method)
            record.status, record.error = "failed", f"{type(err).__name__}: {err}"
    return record


def _run(engine: Engine, request: GenerateRequest, on_block, should_stop):
    stream = engine.stream(request)
    try:
        for item in stream:
            if not isinstance(item, Block):
                return item  # the final GenerationResult
            if should_stop():
                raise RunCancelled
            if on_block is not None:
                on_block(item)
    finally:
        stream.close()
    raise RuntimeError("the engine's stream ended without a result")
