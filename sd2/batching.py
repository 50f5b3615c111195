"""Batched decoding: several requests' Programs (sd2.decoding) stepped together, their model calls merged
into ragged forwards (sd2.ragged), each request's output exactly what it would be alone.

A round (`Batch.step`):
  1. every row runs its own code (picks, acceptance, cache rollback) up to its next call;
  2. drafter steps: the rows waiting on a step of the same drafter (and the same steered layers) share
     one ragged forward, each row steered by its own bias rows; repeated until no row is drafting (rows
     draft different k, so some finish drafting early and wait);
  3. verifier forwards: every row's [x_m, d_1..d_k] (or one token for verifier-only rows) in one ragged
     forward, in chunks of at most MAX_ROWS rows, a new row's prefill among them (one longer than MAX_ROWS
     tokens runs alone, as in its solo run: sd2.decoding.prefill_batchable);
  4. steering: the rows of one steering head get their next biases from one product of their anchor
     states (sd2.steering.SteeringHead.steer_rows), then finish their block.
A row's caches move into the batch's KV pool of their model (sd2.kv_pool) at its first shared forward,
so a ragged forward writes and reads every row's keys in one buffer; they leave it with the row.
Rows join between rounds (`add`) and leave as soon as they finish or are cancelled (`cancel`): the
iteration-level scheduling of Orca and vLLM.

Exactness: each row's code is the same as in a solo run, with its own generator, so it makes the same
picks and draws in the same order; a row's results from a ragged forward equal its solo forward's bit
for bit when both models run on batch-invariant kernels (`sd2.invariant.make_batch_invariant`, and a
reduced draft head's row-invariant product). Calls whose parts cannot batch (a compiled draft step, a
model `sd2.ragged.supports_ragged` refuses) run alone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from sd2.decoding import Call, DraftCall, Program, SteerCall, VerifyCall, execute_solo
from sd2.draft_step import EagerDraftStep
from sd2.invariant import MAX_ROWS, is_batch_invariant
from sd2.kv_pool import KVPool
from sd2.ragged import Segment, ragged_forward, supports_ragged
from sd2.steering import captured_states, stack_features, steered
from sd2.trace import Block


@dataclass
class _Row:
    key: Hashable
    program: Program
    call: Call | None = None  # the call it waits on; None: it has to be advanced
    result: object = None  # what to send it when advanced
    done: bool = False
    shared: int = 1  # requests in its latest forward; a Block follows a verify, so: its batch_size
    pooled: list = field(default_factory=list)  # (KVPool, cache) of each of its caches in a pool


@dataclass
class RoundReport:
    """What one round produced: (row key, Block) in order, the rows that finished, and the batch sizes
    of its forwards."""

    blocks: list[tuple[Hashable, Block]] = field(default_factory=list)
    finished: list[Hashable] = field(default_factory=list)
    failed: dict[Hashable, Exception] = field(default_factory=dict)  # rows whose own code raised: dropped
    draft_rows: list[int] = field(default_factory=list)  # rows of each batched drafter forward
    verify_rows: list[int] = field(default_factory=list)  # requests in each batched verifier forward


class Batch:
    """The rows decoding together. Not thread-safe: one owner steps it."""

    def __init__(self, max_rows: int = MAX_ROWS):
        self.max_rows = max_rows  # the most token rows one ragged forward holds
        self._rows: dict[Hashable, _Row] = {}
        self._batchable: dict[int, bool] = {}  # id(model) → `batchable(model)`, asked once a round
        self._pools: dict[int, KVPool] = {}  # id(model) → the pool of its rows' caches

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def keys(self) -> list[Hashable]:
        return list(self._rows)

    def add(self, key: Hashable, program: Program) -> None:
        """A new row, decoded from the next round on (its prefill joins that round's verifier forward)."""
        if key in self._rows:
            raise ValueError(f"a row {key!r} is already decoding")
        self._rows[key] = _Row(key, program)

    def cancel(self, key: Hashable) -> None:
        """Drop a row now (its program is closed); the others go on untouched."""
        row = self._rows.pop(key, None)
        if row is not None:
            row.program.close()
            self._release(row)

    @torch.inference_mode()
    def step(self) -> RoundReport:
        """One round: every row to its next verifier forward and through it (see the module doc). A row
        whose own code raises is dropped and reported in `failed`; a model call that raises fails the
        round (the exception propagates; its rows are left as they were, to be cancelled)."""
        report = RoundReport()
        self._batchable.clear()  # kernels may be switched between rounds (sd2.invariant.stock_kernels)
        self._advance(report, self._rows.values())
        while True:
            if steering := self._waiting(SteerCall):
                self._steer(steering)
                self._advance(report, steering)
            elif drafting := self._waiting(DraftCall):
                self._draft(drafting, report)
                self._advance(report, drafting)
            else:
                break
        verifying = self._waiting(VerifyCall)
        self._verify(verifying, report)
        self._advance(report, verifying)
        while steering := self._waiting(SteerCall):
            self._steer(steering)
            self._advance(report, steering)
        return report

    def _waiting(self, kind: type) -> list[_Row]:
        return [row for row in self._rows.values() if isinstance(row.call, kind)]

    def _advance(self, report: RoundReport, rows) -> None:
        """Run each row's own code until it waits on a call or ends; collect its Blocks."""
        for row in list(rows):
            if row.call is not None or row.done:
                continue
            try:
                while True:
                    item = row.program.send(row.result)
                    row.result = None
                    if isinstance(item, Block):
                        item.batch_size = row.shared
                        report.blocks.append((row.key, item))
                        continue
                    row.call = item
                    break
            except StopIteration:
                row.done = True
                self._rows.pop(row.key, None)
                self._release(row)
                report.finished.append(row.key)
            except Exception as error:  # this row's own code: the others go on
                row.done = True
                self._rows.pop(row.key, None)
                self._release(row)
                report.failed[row.key] = error

    def _pool(self, row: _Row, model, cache) -> None:
        """Move a row's cache of `model` into that model's pool (once; a cache that cannot join stays)."""
        pool = self._pools.setdefault(id(model), KVPool())
        if pool.slot(cache) is None and pool.adopt(cache):
            row.pooled.append((pool, cache))

    @staticmethod
    def _release(row: _Row) -> None:
        for pool, cache in row.pooled:
            pool.release(cache)
        row.pooled.clear()

    def _finish(self, row: _Row, result: object) -> None:
        row.call, row.result = None, result

    def _draft(self, rows: Sequence[_Row], report: RoundReport) -> None:
        groups: dict[tuple, list[_Row]] = {}
        for row in rows:
            call = row.call
            step = call.step
            if not (isinstance(step, EagerDraftStep) and self._runs_ragged(step.model)):
                self._finish(row, execute_solo(call))
                continue
            key = (id(step.model), id(step.draft_head), tuple(sorted(call.biases)))
            groups.setdefault(key, []).append(row)
        report.draft_rows += self._together(groups.values(), _draft_together, _draft_cache)

    def _steer(self, rows: Sequence[_Row]) -> None:
        groups: dict[int, list[_Row]] = {}
        for row in rows:
            groups.setdefault(id(row.call.head), []).append(row)
        for group in groups.values():
            for first in range(0, len(group), self.max_rows):
                chunk = group[first : first + self.max_rows]
                features = torch.stack([row.call.features for row in chunk])  # [R, n·D_v]
                vectors, biases = chunk[0].call.head.steer_rows(features)  # [R, D_v], [R, L_s, F]
                for i, row in enumerate(chunk):
                    self._finish(row, (vectors[i], biases[i]))

    def _verify(self, rows: Sequence[_Row], report: RoundReport) -> None:
        groups: dict[int, list[_Row]] = {}
        for row in rows:
            call = row.call
            row.shared = 1
            if not call.batchable or not self._runs_ragged(call.verifier):
                self._finish(row, execute_solo(call))
                continue
            groups.setdefault(id(call.verifier), []).append(row)
        report.verify_rows += self._together(groups.values(), _verify_together, _verify_cache)

    def _runs_ragged(self, model) -> bool:
        """`batchable(model)`, remembered for the round (every row of a round holds its models)."""
        known = self._batchable.get(id(model))
        if known is None:
            known = self._batchable[id(model)] = batchable(model)
        return known

    def _together(self, groups, run_together, cache_of) -> list[int]:
        """Each group's calls in chunks of at most max_rows token rows, a chunk's calls by `run_together`
        (one alone as in a solo run), their caches in the pool first (`cache_of(call)`: model, cache);
        each row learns how many shared its forward. Returns the sizes of the shared forwards."""
        shared = []
        for group in groups:
            for chunk in _chunks(group, self.max_rows):
                if len(chunk) > 1:
                    for row in chunk:
                        self._pool(row, *cache_of(row.call))
                results = _alone(chunk[0].call) if len(chunk) == 1 else run_together([r.call for r in chunk])
                for row, result in zip(chunk, results, strict=True):
                    row.shared = len(chunk)
                    self._finish(row, result)
                if len(chunk) > 1:
                    shared.append(len(chunk))
        return shared


def _alone(call: Call) -> list:
    return [execute_solo(call)]


def batchable(model) -> bool:
    """Whether a batch runs this model's calls of several requests as one ragged forward."""
    return is_batch_invariant(model) and supports_ragged(model)


def _chunks(rows: Sequence[_Row], max_rows: int) -> list[list[_Row]]:
    """Consecutive groups of rows whose calls hold at most max_rows token rows in all."""
    chunks, current, size = [], [], 0
    for row in rows:
        n = len(row.call.inputs)
        if current and size + n > max_rows:
            chunks.append(current)
            current, size = [], 0
        current.append(row)
        size += n
    if current:
        chunks.append(current)
    return chunks


def _draft_cache(call: DraftCall) -> tuple:
    return call.step.model, call.step.cache


def _verify_cache(call: VerifyCall) -> tuple:
    return call.verifier, call.cache


def _draft_together(calls: Sequence[DraftCall]) -> list[torch.Tensor]:
    """One drafter step of several rows of one drafter: a ragged forward, each row under its own bias
    rows (the last T_r of its [2, F] per layer, as its solo step adds them). Returns logits per row."""
    step = calls[0].step
    layers = sorted(calls[0].biases)
    biases = {
        layer: torch.cat([call.biases[layer][-len(call.inputs) :] for call in calls]) for layer in layers
    }  # [M, F] per steered layer
    segments = [Segment(call.inputs, call.step.cache, all_logits=False) for call in calls]
    with steered(step.model, biases) if biases else nullcontext():
        logits, _ = ragged_forward(step.model, segments, head=step.draft_head)
    return [rows[-1] for rows in logits]  # [V] or [N] each


def _verify_together(calls: Sequence[VerifyCall]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """One verifier forward of several rows: a ragged forward, each row's features from its own rows."""
    verifier = calls[0].verifier
    layers = sorted({layer for call in calls for layer in call.capture})
    segments = [Segment(call.inputs, call.cache, all_logits=not call.last_only) for call in calls]
    capture = captured_states(verifier, layers) if layers else nullcontext({})
    with capture as states:
        logits, _ = ragged_forward(verifier, segments)
    results, first = [], 0
    for call, rows in zip(calls, logits, strict=True):
        last = first + len(call.inputs)
        features = stack_features(states, call.capture)[0, first:last] if call.capture else None
        results.append((rows, features))
        first = last
    return results
