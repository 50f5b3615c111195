"""Running generations against the one loaded Engine: validate, decode under the model lock, record.

The Engine is not thread-safe (its steering hooks and KV caches assume one run at a time), so every
use of its models — decoding and training alike — holds `ModelHost.lock`. Decoding runs in worker
threads so the event loop keeps serving while a run waits for, or holds, the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from sd2.config import DecodeConfig
from sd2.engine import Engine, GenerateRequest, PreparedRequest
from sd2.errors import InvalidValue
from sd2.trace import Block
from service.errors import FieldError, from_invalid
from service.metrics import GenerationProbe, ServiceMetrics
from service.repository import RunRecord
from service.schemas import DecodeSettings
from service.settings import Settings

log = logging.getLogger(__name__)


class RunCancelled(Exception):
    """The client went away mid-stream; the run stops at the next block boundary."""


@dataclass
class ModelHost:
    """The loaded Engine, the lock that serialises every use of its models, how long one generation may
    hold them (`time_budget_s`, None: unbounded; Settings.generation_time_budget_s), and the instruments
    every generation feeds (`metrics`, the app's; a host built alone gets a registry of its own)."""

    engine: Engine
    lock: threading.Lock
    time_budget_s: float | None = None
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)


def prepare(body: DecodeSettings, method: str, settings: Settings) -> GenerateRequest:
    """Check a request against the server's limits and build its decode settings; FieldError names the
    bad field. The method and the prompt itself are the Engine's to check (`Engine.prepare`, in `decode`)."""
    if body.prompt is not None and len(body.prompt) > settings.max_prompt_chars:
        raise FieldError("prompt", f"prompt is longer than {settings.max_prompt_chars} characters")
    messages = [m.model_dump() for m in body.messages] if body.messages is not None else None
    if messages is not None and sum(len(m["content"]) for m in messages) > settings.max_prompt_chars:
        raise FieldError("messages", f"messages hold more than {settings.max_prompt_chars} characters in all")
    if body.max_new_tokens > settings.max_new_tokens:
        raise FieldError(
            "max_new_tokens", f"max_new_tokens must be ≤ {settings.max_new_tokens} on this server"
        )
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
    except InvalidValue as err:
        raise from_invalid(err) from err
    return GenerateRequest(
        prompt=body.prompt,
        messages=tuple(messages) if messages is not None else None,
        method=method,
        decode=decode,
        steering=body.steering,
        counterfactual=body.counterfactual,
        chat=body.chat,
    )


def admit(host: ModelHost, request: GenerateRequest) -> PreparedRequest:
    """The Engine's checks of a request (its method is loaded, its prompt encodes and fits the
    verifier), under the model lock since the tokenizer too is used by one thread at a time; a refusal
    is the caller's error (FieldError), and nothing is decoded or stored."""
    with host.lock:
        try:
            return host.engine.prepare(request)
        except InvalidValue as err:
            raise from_invalid(err) from err


def decode(
    host: ModelHost,
    prepared: PreparedRequest,
    prompt_set: str | None = None,
    on_block: Callable[[Block], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> RunRecord:
    """Run one generation under the model lock and describe its outcome (nothing is written here).
    The host's time budget counts from when the lock is taken (a run past it ends with "time"), and so
    do its metrics' time to first token and duration (the wait is `sd2_model_lock_wait_seconds`).

    Any exception becomes a record with status failed (or cancelled when `should_stop` said so).
    """
    engine = host.engine
    record = _record(prepared, engine.precision, prompt_set)
    waiting_since = time.perf_counter()
    with host.lock:
        probe = host.metrics.generation(prepared.request.method, time.perf_counter() - waiting_since)
        try:
            record.result = _run(engine, prepared, host.time_budget_s, on_block, should_stop, probe)
        except RunCancelled:
            record.status, record.error = "cancelled", "the client disconnected before the run finished"
        except Exception as err:  # recorded as a failed run; the server keeps serving
            log.exception("generation failed (method %s)", prepared.request.method)
            record.status, record.error = "failed", f"{type(err).__name__}: {err}"
        probe.finished(record.status, record.result.finish_reason if record.result is not None else None)
    return record


def _record(prepared: PreparedRequest, precision: str, prompt_set: str | None) -> RunRecord:
    request = prepared.request
    return RunRecord(
        method=request.method,
        drafter=request.method if prepared.drafter is not None else None,
        steering=prepared.steered,
        config=asdict(request.decode),
        prompt=request.prompt,
        messages=list(request.messages) if request.messages is not None else None,
        prompt_set=prompt_set,
        precision=precision,
    )


def _run(
    engine: Engine,
    prepared: PreparedRequest,
    time_budget_s: float | None,
    on_block,
    should_stop,
    probe: GenerationProbe,
):
    stream = engine.stream(prepared, time_budget_s)
    try:
        for item in stream:
            if not isinstance(item, Block):
                return item  # the final GenerationResult
            probe.block(item)  # a block decoded counts, even if the run is cancelled at it
            if should_stop():
                raise RunCancelled
            if on_block is not None:
                on_block(item)
    finally:
        stream.close()
    raise RuntimeError("the engine's stream ended without a result")
