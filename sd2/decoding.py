"""The decoding engine: verifier-only decoding (the baseline) and chain speculative decoding with
optional SD² steering, both KV-cached, batch size 1, yielding one trace `Block` per verifier forward.

One speculative block (docs/math.md#the-speculative-decoding-block), with committed tokens x_1..x_m of
which x_m is not yet in either KV cache:
    1. draft   k tokens from the drafter, steered by the vector of the previous block
    2. verify  [x_m, d_1..d_k] in one verifier forward → k+1 target distributions
    3. accept  Leviathan's rule (or argmax match at T = 0) → n accepted + one extra token
    4. roll back both caches to the committed prefix
    5. steer   g from the verifier state that produced the extra token (the last accepted position)
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from transformers import DynamicCache

from sd2.config import DecodeConfig
from sd2.counterfactual import UnsteeredTwin
from sd2.draft_length import DraftLength
from sd2.draft_step import DraftStep
from sd2.explainer import explain_block
from sd2.invariant import MAX_ROWS
from sd2.kv_cache import cached_forward, rollback_cache
from sd2.proposer import Proposer
from sd2.sampling import (
    Picker,
    Verdict,
    acceptance_survival,
    greedy_verdict,
    overlap,
    rejection_sample,
    residual,
    warp_probs,
)
from sd2.steering import SteeringHead, captured_states, stack_features
from sd2.trace import Block, BlockKind, BlockTimings, DraftStop, TokenEvent, TokenStatus


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """The single source of randomness of a run."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


@dataclass(frozen=True)
class DraftCall:
    """A program's request for one drafter step: feed `inputs` (1 or 2 tokens) to `step` under
    `biases` (drafter layer → [2, F] rows, the last T lining up with the T inputs; empty: unsteered).
    Its result: the next token's logits [V], or [N] over a reduced draft vocabulary."""

    step: DraftStep
    inputs: list[int]
    biases: Mapping[int, torch.Tensor]


def prefill_batchable(prompt_ids: Sequence[int]) -> bool:
    """Whether a prompt's prefill may share a batched forward: alone, a prompt of at most MAX_ROWS tokens
    runs on the batch-invariant kernels too (sd2.invariant), so its rows in a ragged forward equal its
    solo forward's; a longer one runs on the stock kernels, and stays alone."""
    return len(prompt_ids) <= MAX_ROWS


@dataclass(frozen=True)
class VerifyCall:
    """A program's request for one verifier forward of `inputs` on `cache`. Its result: (logits [T, V],
    or [1, V] when `last_only`; the input states of the `capture` layers stacked, [T, n·D_v], or None).
    A call that is not `batchable` runs alone, as in a solo run: a prefill longer than MAX_ROWS tokens
    (`prefill_batchable`)."""

    verifier: nn.Module
    cache: DynamicCache
    inputs: list[int]
    last_only: bool
    capture: tuple[int, ...] = ()
    batchable: bool = True


@dataclass(frozen=True)
class SteerCall:
    """A program's request for its steering head's next biases from one anchor state `features`
    [n·D_v]. Its result: (steering vector [D_v], biases [L_s, F]) — `SteeringHead.steer_rows`, whose rows
    do not depend on what else shares the call."""

    head: SteeringHead
    features: torch.Tensor


Call = DraftCall | VerifyCall | SteerCall
# A decoding program: yields each model call it needs (and is sent its result) and each finished Block
# (and is sent None). `run_solo` executes the calls one by one; sd2.batching runs many programs together.
Program = Generator[Call | Block, object, None]


def execute_solo(call: Call):
    """Run one call on its own: what a single request's decode does."""
    if isinstance(call, DraftCall):
        with call.step.steering(call.biases):
            return call.step.logits(call.inputs)
    if isinstance(call, SteerCall):
        vectors, biases = call.head.steer_rows(call.features[None])
        return vectors[0], biases[0]
    capture = captured_states(call.verifier, call.capture) if call.capture else nullcontext({})
    with capture as states:
        logits = cached_forward(call.verifier, call.inputs, call.cache, call.last_only)
    return logits, stack_features(states, call.capture)[0] if call.capture else None


@torch.inference_mode()
def run_solo(program: Program) -> Iterator[Block]:
    """Drive one program to its end, executing each of its calls alone; yields its Blocks."""
    result = None
    try:
        while True:
            item = program.send(result)
            if isinstance(item, Block):
                result = None
                yield item
            else:
                result = execute_solo(item)
    except StopIteration:
        return
    finally:
        program.close()


def _stop_index(tokens: Sequence[int], stop_ids: frozenset[int]) -> int | None:
    return next((i for i, t in enumerate(tokens) if t in stop_ids), None)


class Decoder(Protocol):
    """One decoding method for one request: `run` yields a trace Block per verifier forward; `program`
    is the same decode as a Program, for a driver that batches the model calls of several requests."""

    def run(self, prompt_ids: Sequence[int]) -> Iterator[Block]: ...

    def program(self, prompt_ids: Sequence[int]) -> Program: ...


@dataclass(frozen=True)
class VerifierDecoder:
    """The baseline as a Decoder: plain autoregressive decoding of the verifier (`verifier_decode`)."""

    verifier: nn.Module
    config: DecodeConfig
    stop_ids: frozenset[int]

    def run(self, prompt_ids: Sequence[int]) -> Iterator[Block]:
        return verifier_decode(self.verifier, prompt_ids, self.config, self.stop_ids)

    def program(self, prompt_ids: Sequence[int]) -> Program:
        return verifier_program(self.verifier, prompt_ids, self.config, self.stop_ids)


def verifier_decode(
    verifier: nn.Module, prompt_ids: Sequence[int], config: DecodeConfig, stop_ids: frozenset[int]
) -> Iterator[Block]:
    """Plain autoregressive decoding of the verifier with its KV cache (the baseline, τ = 1)."""
    return run_solo(verifier_program(verifier, prompt_ids, config, stop_ids))


def verifier_program(
    verifier: nn.Module, prompt_ids: Sequence[int], config: DecodeConfig, stop_ids: frozenset[int]
) -> Program:
    """`verifier_decode` as a Program."""
    device = verifier.get_input_embeddings().weight.device
    picker = Picker(config.warp, make_generator(config.seed, device))
    cache = rollback_cache(verifier)
    inputs, kind = list(prompt_ids), BlockKind.PREFILL
    for index in range(config.max_new_tokens):
        start = time.perf_counter()
        batchable = kind is not BlockKind.PREFILL or prefill_batchable(inputs)
        call = VerifyCall(verifier, cache, inputs, last_only=True, batchable=batchable)
        logits = (yield call)[0][-1]  # [V]
        token, probs = picker.pick(logits)
        p = float(picker.trace_probs(logits, probs)[token])
        verify_ms = _ms(start)
        extra = TokenEvent(token, TokenStatus.BONUS, draft_prob=None, target_prob=p)
        timings = BlockTimings(verify_ms=verify_ms, total_ms=verify_ms)
        yield Block(index, kind, [], extra, k=0, n_accepted=0, complete=True, timings=timings)
        if token in stop_ids:
            return
        inputs, kind = [token], BlockKind.VERIFIER


class SpeculativeDecoder:
    """Chain speculative decoding of one prompt; `run` yields a Block per verifier forward.

    Cache invariant between blocks: both caches hold exactly the committed tokens except the last
    one; tokens the drafter has not seen yet wait in `pending` with the bias rows that steer them.
    """

    def __init__(
        self,
        verifier: nn.Module,
        proposer: Proposer,
        config: DecodeConfig,
        stop_ids: frozenset[int],
        length: DraftLength | None = None,
        counterfactual: bool = False,
    ):
        """`proposer`: the drafter side (sd2.proposer: model, steering head, reduced draft head, step).
        `length`: the request's draft-length policy (sd2.draft_length); None builds the config's,
        measuring the pair's cost profile here when k = auto (seconds; the Engine keeps one per pair).
        `counterfactual`: record each block's unsteered counterfactual (sd2.counterfactual) when the
        drafter is steered; it never changes the output."""
        self.verifier, self.proposer = verifier, proposer
        self.drafter, self.head, self.draft_head = proposer.model, proposer.head, proposer.draft_head
        self.draft_step = proposer.new_step()
        if length is None:
            costs = proposer.measure_costs(verifier, config.max_k) if config.auto_k else None
            length = DraftLength.of(config, costs)
        self.length = length
        self.config, self.stop_ids = config, stop_ids
        device = verifier.get_input_embeddings().weight.device
        self.picker = Picker(config.warp, make_generator(config.seed, device))
        self.verifier_cache = rollback_cache(verifier)
        self.tokens: list[int] = []  # committed ids, prompt included
        self.biases: dict[int, torch.Tensor] = {}  # drafter layer → [2, F]: rows (previous, current) anchor
        self.steering_norm: float | None = None
        self.twin = (
            UnsteeredTwin(verifier, self.drafter, self.draft_head, config.warp)
            if counterfactual and proposer.steered
            else None
        )

    def run(self, prompt_ids: Sequence[int]) -> Iterator[Block]:
        return run_solo(self.program(prompt_ids))

    def program(self, prompt_ids: Sequence[int]) -> Program:
        """The decode as a Program (module docstring's steps 1–5 per block)."""
        first = yield from self._prefill(prompt_ids)
        yield first
        emitted, done = 1, first.extra.token_id in self.stop_ids
        index = 1
        while not done and emitted < self.config.max_new_tokens:
            k, stop = self.length.next(room=self.config.max_new_tokens - emitted - 1)
            block = yield from self._block(index, k, stop)
            self.length.update(block.n_accepted, block.k)
            yield block
            emitted += len(block.emitted)
            done = any(t.token_id in self.stop_ids for t in block.emitted)
            index += 1

    def _prefill(self, prompt_ids: Sequence[int]) -> Generator[Call, object, Block]:
        """Verifier prefill samples the first token x_m and gives the first steering anchor.

        The anchor is the last prompt position, the state that produced x_m, so the first block drafts
        at offsets 1..k like every other block (the official code re-feeds a token and starts at 0).
        """
        start = time.perf_counter()
        prompt = list(prompt_ids)
        call = VerifyCall(
            self.verifier, self.verifier_cache, prompt, True, self._capture_layers, prefill_batchable(prompt)
        )
        logits, features = yield call  # [1, V], [T, n·D_v] or None
        logits = logits[-1]  # [V]
        token, probs = self.picker.pick(logits)
        verify_ms = _ms(start)
        start = time.perf_counter()
        if self.head is not None:
            yield from self._steer(features[len(prompt_ids) - 1])
        steer_ms = _ms(start)
        room = self.config.max_new_tokens + self.length.longest + 1
        self.draft_step.start(prompt_ids, room)  # the prompt is never steered
        counterfactual_ms = 0.0
        if self.twin is not None:  # its prompt forward is the counterfactual's, timed apart
            twin_start = time.perf_counter()
            self.twin.start(prompt_ids, room)
            counterfactual_ms = _ms(twin_start)
        self.tokens = [*prompt_ids, token]
        p = float(self.picker.trace_probs(logits, probs)[token])
        extra = TokenEvent(token, TokenStatus.BONUS, draft_prob=None, target_prob=p)
        total_ms = _ms(start) + verify_ms - counterfactual_ms
        timings = BlockTimings(
            verify_ms=verify_ms, steer_ms=steer_ms, total_ms=total_ms, counterfactual_ms=counterfactual_ms
        )
        return Block(0, BlockKind.PREFILL, [], extra, 0, 0, complete=False, timings=timings)

    @property
    def _capture_layers(self) -> tuple[int, ...]:
        """The verifier layers whose input states the steering head reads (none without a head)."""
        return tuple(self.head.config.verifier_layers) if self.head is not None else ()

    def _block(self, index: int, k: int, stop: DraftStop) -> Generator[Call, object, Block]:
        start = time.perf_counter()
        steering_norm = self.steering_norm
        layer_norms = [float(b[-1].norm()) for b in self.biases.values()]
        n_pending = len(self.tokens) - self.draft_step.length
        generator_state = self.picker.generator.get_state() if self.twin is not None else None
        # 1. draft (up to k tokens: the confidence threshold may stop it earlier)
        draft_tokens, draft_logits, draft_probs = yield from self._draft(k)  # [K], [K, V], [K, V]
        if draft_tokens.shape[0] < k:
            stop = DraftStop.CONFIDENCE
        draft_ms = _ms(start)
        # (the counterfactual, timed apart: before the verify, while the verifier cache holds the prefix)
        twin_draft, counterfactual_ms = None, 0.0
        if self.twin is not None and draft_tokens.shape[0] > 0:
            counterfactual_start = time.perf_counter()
            twin_draft = self.twin.propose(
                self.tokens, n_pending, draft_tokens.shape[0], generator_state, self.verifier_cache
            )
            counterfactual_ms = _ms(counterfactual_start)
        # 2. verify
        verify_start = time.perf_counter()
        inputs = [self.tokens[-1], *draft_tokens.tolist()]
        target_logits, states = yield VerifyCall(
            self.verifier, self.verifier_cache, inputs, False, self._capture_layers
        )  # [K+1, V], [K+1, n·D_v] or None
        target_probs = warp_probs(target_logits, self.config.warp)  # [K+1, V]
        # 3. accept
        verdict = self._judge(draft_tokens, draft_probs, target_logits, target_probs)
        verify_ms = _ms(verify_start)
        # 4. roll back caches
        self._commit(draft_tokens, verdict)
        # 5. steer next block
        steer_start = time.perf_counter()
        if self.head is not None:
            anchor = states[verdict.n_accepted]  # [n·D_v]: the state that produced the extra token
            yield from self._steer(anchor)
        steer_ms = _ms(steer_start)
        total_ms = _ms(start) - counterfactual_ms
        block = self._record(
            index, draft_tokens, draft_logits, draft_probs, target_logits, target_probs, verdict, stop
        )
        if twin_draft is not None:
            record_start = time.perf_counter()
            survival = acceptance_survival(draft_tokens, draft_probs, target_probs)  # [K]
            block.counterfactual = twin_draft.record(survival, self.config.warp.greedy)
            counterfactual_ms += _ms(record_start)
        timings = BlockTimings(draft_ms, verify_ms, steer_ms, total_ms, counterfactual_ms)
        block.steering_norm, block.layer_bias_norms, block.timings = steering_norm, layer_norms, timings
        return block

    def _draft(self, k: int) -> Generator[Call, object, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Propose up to k tokens autoregressively, stopping after a draft whose drafter probability is
        ≤ the confidence threshold. Returns ids [K], drafter logits [K, V], rule probs [K, V]."""
        tokens, logit_rows, prob_rows = [], [], []
        inputs = self.tokens[self.draft_step.length :]  # pending: 1 or 2 tokens
        threshold = self.length.threshold
        for step in range(k):
            logits = yield DraftCall(self.draft_step, inputs, self.biases)  # [V], or [N] (reduced vocabulary)
            token, probs = self.picker.pick(logits)
            confident = threshold == 0 or float(self.picker.trace_probs(logits, probs)[token]) > threshold
            if self.draft_head is not None:  # back to a vocabulary id (the rows: after the loop)
                token = self.draft_head.vocabulary_id(token)
            tokens.append(token)
            logit_rows.append(logits)
            prob_rows.append(probs)
            inputs = [token]
            if not confident and step < k - 1:
                break
        if not tokens:  # a k = 0 block at the length limit: empty rows on the models' device
            device = self.verifier.get_input_embeddings().weight.device
            empty = torch.empty(0, self.verifier.config.vocab_size, device=device)
            return torch.empty(0, dtype=torch.long), empty, empty
        logits, probs = torch.stack(logit_rows), torch.stack(prob_rows)  # [K, V], or [K, N]
        if self.draft_head is not None:  # q = 0 for pruned tokens
            logits, probs = self.draft_head.to_vocabulary(logits, probs)
        return torch.tensor(tokens), logits, probs

    def _judge(self, draft_tokens, draft_probs, target_logits, target_probs) -> Verdict:
        if self.config.warp.greedy:  # one-hot rows: their argmax is the logits' (and cheaper than bf16's)
            return greedy_verdict(draft_tokens, target_probs.argmax(-1).cpu())
        return rejection_sample(
            draft_tokens.to(target_probs.device), draft_probs, target_probs, self.picker.generator
        )

    def _commit(self, draft_tokens: torch.Tensor, verdict: Verdict) -> None:
        """Append the emitted tokens and crop both caches back to the committed prefix (minus its last)."""
        committed = len(self.tokens) + verdict.n_accepted  # cache length once x_m and n drafts are kept
        self.tokens += [*draft_tokens[: verdict.n_accepted].tolist(), verdict.extra_token]
        surplus = self.verifier_cache.get_seq_length() - committed
        # crop also at 0: sliding-window layers trim back to their window
        self.verifier_cache.crop(-max(surplus, 0))
        self.draft_step.crop_to(committed)  # the drafter may be short of it: tokens pending

    def _steer(self, anchor_features: torch.Tensor) -> Generator[Call, object, None]:
        """Bias rows for the next block: (previous anchor, new anchor) per steered drafter layer.

        Draft step j feeds input position anchor + j and is steered by the new anchor (offset δ = j,
        the range training samples). When all k drafts were accepted, d_k is first fed at the start
        of the next block; it keeps the previous block's vector (offset k + 1, the staleness it would
        have had in its own block) rather than the new anchor, which is its own position (offset 0)
        and would show it the verifier state that predicted the token after it.
        """
        head = self.head
        vector, new = yield SteerCall(head, anchor_features)  # [D_v], [L_s, F]
        self.steering_norm = float(vector.norm())
        old = [self.biases[layer][-1] for layer in head.config.drafter_layers] if self.biases else new
        self.biases = {
            layer: torch.stack([old[i], new[i]]) for i, layer in enumerate(head.config.drafter_layers)
        }

    def _record(
        self, index, draft_tokens, draft_logits, draft_probs, target_logits, target_probs, verdict, stop
    ) -> Block:
        """Turn one judged block into its trace record, cutting it at a stop token."""
        k, n = draft_tokens.shape[0], verdict.n_accepted
        q_shown = self.picker.trace_probs(draft_logits, draft_probs)  # [K, V]
        p_shown = self.picker.trace_probs(target_logits, target_probs)  # [K+1, V]
        ids = draft_tokens.tolist()
        drafts = []
        for i, token in enumerate(ids):
            status = (
                TokenStatus.ACCEPTED if i < n else TokenStatus.REJECTED if i == n else TokenStatus.DISCARDED
            )
            p = float(p_shown[i, token]) if i <= n else None
            drafts.append(TokenEvent(token, status, float(q_shown[i, token]), p))
        extra_status = TokenStatus.BONUS if n == k else TokenStatus.RESAMPLED
        extra = TokenEvent(verdict.extra_token, extra_status, None, float(p_shown[n, verdict.extra_token]))
        judged = min(n + 1, k)
        # what the rejection explainer shows of the judged drafts and the extra token; a resampled one
        # was drawn from norm(max(0, p − q)) at the rejected position
        law = residual(target_probs[n], draft_probs[n].to(target_probs.device)) if n < k else None
        explain_block(drafts[:judged], extra, p_shown[: n + 1], q_shown[:judged], law)
        overlaps = overlap(target_probs[:judged], draft_probs[:judged].to(target_probs.device)).tolist()
        # A block shortened by the length limit is not a sample of the rule's τ; one the rule ended is.
        block = Block(
            index,
            BlockKind.SPECULATIVE,
            drafts,
            extra,
            k,
            n,
            complete=stop is not DraftStop.LENGTH,
            overlaps=overlaps,
            draft_stop=stop,
        )
        _cut_at_stop(block, self.stop_ids)
        return block


def _cut_at_stop(block: Block, stop_ids: frozenset[int]) -> None:
    """Drop everything emitted after the first stop token; the block then no longer counts for τ."""
    emitted = block.emitted
    stop = _stop_index([t.token_id for t in emitted], stop_ids)
    if stop is None or stop == len(emitted) - 1:
        return
    for token in emitted[stop + 1 :]:
        if token is block.extra:
            block.extra = None
        else:
            token.status = TokenStatus.DISCARDED
    block.complete = False
