"""The decode scheduler: one thread owns the Engine's decoding and steps every admitted generation
together, block by block (sd2.batching: ragged forwards, each request exactly as it would be alone).

A route's worker thread `submit`s its prepared request and waits on the returned Ticket. The scheduler
thread takes waiting requests into the batch between rounds, up to `max_batch` rows (SD2_MAX_BATCH; 1 is
the serial path: one generation at a time), and runs one round at a time under the model lock, so a
training job's optimiser steps still interleave. After each round it hands every row its Blocks (the
route's `on_block`, called under the lock: it may use the tokenizer), ends a row whose client left
(`should_stop`: RunCancelled) or whose time budget is spent (finish_reason "time"), and completes the
Tickets of the rows that finished.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from sd2.batching import Batch
from sd2.engine import Engine, GenerationResult, PreparedRequest
from sd2.trace import Block
from service.metrics import GenerationProbe, ServiceMetrics
from service.settings import DEFAULT_MAX_BATCH

log = logging.getLogger(__name__)


class RunCancelled(Exception):
    """The client went away mid-run; the run stopped at its next block."""


@dataclass
class Ticket:
    """One submitted generation: its result (or RunCancelled, or the error that ended it) arrives in
    `future`; `probe` feeds its metrics once it joined the batch."""

    prepared: PreparedRequest
    on_block: Callable[[Block], None] | None
    should_stop: Callable[[], bool]
    submitted: float = field(default_factory=time.perf_counter)
    future: Future = field(default_factory=Future)
    probe: GenerationProbe | None = None
    blocks: list[Block] = field(default_factory=list)
    started: float = 0.0

    def wait(self) -> GenerationResult:
        return self.future.result()


class DecodeScheduler:
    """Steps the admitted generations of one Engine together (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        lock: threading.Lock,
        metrics: ServiceMetrics,
        max_batch: int = DEFAULT_MAX_BATCH,
        time_budget_s: float | None = None,
    ):
        if max_batch < 1:
            raise ValueError(f"the batch must hold at least 1 generation, got {max_batch}")
        self.engine, self.lock, self.metrics = engine, lock, metrics
        self.max_batch, self.time_budget_s = max_batch, time_budget_s
        self._waiting: deque[Ticket] = deque()
        self._running: dict[int, Ticket] = {}
        self._batch = Batch()
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="sd2-scheduler", daemon=True)
        self._thread.start()

    @property
    def running(self) -> int:
        """Generations decoding now (rows of the batch)."""
        return len(self._running)

    def submit(
        self,
        prepared: PreparedRequest,
        on_block: Callable[[Block], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Ticket:
        """Queue a prepared request; it joins the batch at the next round with room."""
        ticket = Ticket(prepared, on_block, should_stop)
        with self._wake:
            if self._closed:
                raise RuntimeError("the decode scheduler is closed")
            self._waiting.append(ticket)
            self._wake.notify()
        return ticket

    def close(self) -> None:
        """Stop after the current round; waiting and running generations fail."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._waiting and not self._running:
                    self._wake.wait()
                if self._closed:
                    break
            try:
                with self.lock:
                    self._round()
            except Exception as error:  # a model call failed: every row of the round fails with it
                log.exception("a decode round failed")
                for key in list(self._running):
                    self._end(key, error=error)
        for key in list(self._running):
            self._end(key, error=RuntimeError("the server is shutting down"))
        with self._wake:
            waiting, self._waiting = list(self._waiting), deque()
        for ticket in waiting:
            ticket.future.set_exception(RuntimeError("the server is shutting down"))

    def _round(self) -> None:
        self._admit()
        report = self._batch.step()
        if report.verify_rows:
            for rows in report.verify_rows:
                self.metrics.batch_rows.observe(rows)
        elif report.blocks:
            self.metrics.batch_rows.observe(1)  # every forward of the round ran alone
        for key, error in report.failed.items():
            self._end(key, error=error)
        for key, block in report.blocks:
            self._deliver(key, block)
        for key in report.finished:
            if key in self._running:
                self._end(key)

    def _admit(self) -> None:
        """Move waiting requests into the batch while it has room."""
        while len(self._running) < self.max_batch:
            with self._wake:
                if not self._waiting:
                    return
                ticket = self._waiting.popleft()
            if ticket.should_stop():  # left while it waited: never decoded
                ticket.future.set_exception(RunCancelled())
                continue
            key = next(self._ids)
            wait_s = time.perf_counter() - ticket.submitted
            ticket.probe = self.metrics.generation(ticket.prepared.request.method, wait_s)
            ticket.started = time.perf_counter()
            try:
                program = self.engine.program(ticket.prepared)
            except Exception as error:
                ticket.future.set_exception(error)
                continue
            self._running[key] = ticket
            self._batch.add(key, program)

    def _deliver(self, key: int, block: Block) -> None:
        """A row's Block: to its metrics, then its route, unless its client left or its budget ran out."""
        ticket = self._running.get(key)
        if ticket is None:
            return
        self.engine.fill_text(block)
        ticket.blocks.append(block)
        ticket.probe.block(block)  # a block decoded counts, even if the run is cancelled at it
        if ticket.should_stop():
            self._batch.cancel(key)
            self._end(key, error=RunCancelled())
            return
        try:
            if ticket.on_block is not None:
                ticket.on_block(block)
        except Exception as error:
            self._batch.cancel(key)
            self._end(key, error=error)
            return
        budget = self.time_budget_s
        if budget is not None and time.perf_counter() - ticket.started > budget:
            self._batch.cancel(key)
            self._end(key, out_of_time=True)

    def _end(self, key: int, error: BaseException | None = None, out_of_time: bool = False) -> None:
        ticket = self._running.pop(key, None)
        if ticket is None:
            return
        self._batch.cancel(key)
        if error is not None:
            ticket.future.set_exception(error)
            return
        wall_ms = (time.perf_counter() - ticket.started) * 1e3
        try:
            ticket.future.set_result(self.engine.finish(ticket.prepared, ticket.blocks, wall_ms, out_of_time))
        except Exception as failure:
            ticket.future.set_exception(failure)
