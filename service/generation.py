"""Running generations against the one loaded Engine: validate, decode through the scheduler, record.

The Engine is not thread-safe (its steering hooks and KV caches assume one user at a time), so every
use of its models — decoding rounds and training steps alike — holds `ModelHost.lock`. One scheduler
thread decodes every admitted generation together (service/scheduler.py); a route's worker thread waits
for its own, so the event loop keeps serving meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from sd2.config import DecodeConfig
from sd2.engine import Engine, GenerateRequest, PreparedRequest
from sd2.errors import InvalidValue
from sd2.trace import Block
from service.errors import FieldError, from_invalid
from service.metrics import ServiceMetrics
from service.repository import RunRecord
from service.scheduler import DecodeScheduler, RunCancelled, Ticket
from service.schemas import DecodeSettings
from service.settings import DEFAULT_MAX_BATCH, Settings

log = logging.getLogger(__name__)


@dataclass
class ModelHost:
    """The loaded Engine, the lock that serialises every use of its models, how long one generation may
    decode (`time_budget_s`, None: unbounded; Settings.generation_time_budget_s), the instruments every
    generation feeds (`metrics`, the app's; a host built alone gets a registry of its own) and how many
    generations decode together (`max_batch`, Settings.max_batch). Its scheduler thread starts on the
    first generation."""

    engine: Engine
    lock: threading.Lock
    time_budget_s: float | None = None
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    max_batch: int = DEFAULT_MAX_BATCH
    _scheduler: DecodeScheduler | None = field(default=None, init=False, repr=False)
    _starting: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def scheduler(self) -> DecodeScheduler:
        with self._starting:
            if self._scheduler is None:
                self._scheduler = DecodeScheduler(
                    self.engine, self.lock, self.metrics, self.max_batch, self.time_budget_s
                )
            return self._scheduler

    def close(self) -> None:
        """Stop the scheduler (if it started): generations still waiting or decoding fail."""
        with self._starting:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.close()


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
    """Run one generation through the host's decode scheduler (it decodes beside the others admitted)
    and describe its outcome (nothing is written here). The host's time budget counts from when it
    joins the batch (a run past it ends with "time"), and so do its metrics' time to first token and
    duration (the wait before is `sd2_queue_wait_seconds`).

    Any exception becomes a record with status failed (or cancelled when `should_stop` said so).
    """
    record = _record(prepared, host.engine.precision, prompt_set)
    return _outcome(record, host.scheduler.submit(prepared, on_block, should_stop))


def decode_together(
    host: ModelHost,
    prepared: Sequence[PreparedRequest],
    prompt_set: str | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[RunRecord]:
    """`decode` several requests submitted at once, so they decode side by side (e.g. a comparison's
    methods); their records, in order."""
    records = [_record(p, host.engine.precision, prompt_set) for p in prepared]
    tickets = [host.scheduler.submit(p, None, should_stop) for p in prepared]
    return [_outcome(record, ticket) for record, ticket in zip(records, tickets, strict=True)]


def _outcome(record: RunRecord, ticket: Ticket) -> RunRecord:
    """Wait for a submitted generation and describe how it ended."""
    try:
        record.result = ticket.wait()
    except RunCancelled:
        record.status, record.error = "cancelled", "the client disconnected before the run finished"
    except Exception as err:  # recorded as a failed run; the server keeps serving
        log.error("generation failed (method %s)", record.method, exc_info=err)
        record.status, record.error = "failed", f"{type(err).__name__}: {err}"
    if ticket.probe is not None:  # it joined the batch
        reason = record.result.finish_reason if record.result is not None else None
        ticket.probe.finished(record.status, reason)
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
