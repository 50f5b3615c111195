"""The facade the CLI, the service and the benchmarks call: load a model pair once, then generate."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from torch import nn
from transformers import PreTrainedTokenizerBase

from sd2.batching import Batch
from sd2.config import AUTO_MAX_K, DecodeConfig
from sd2.decoding import Decoder, Program, SpeculativeDecoder, VerifierDecoder
from sd2.devices import Placement, default_placement
from sd2.draft_length import CostProfile, DraftLength, VerifyCosts, measure_verify_costs
from sd2.draft_step import CompiledDraftStep, resolve_draft_step
from sd2.errors import InvalidValue
from sd2.int8_weights import int8_available, resolve_draft_weights, use_int8_weights
from sd2.invariant import (
    MAX_ROWS,
    is_batch_invariant,
    make_batch_invariant,
    resolve_packed_weights,
    uses_packed_weights,
)
from sd2.metrics import GenerationMetrics, summarize
from sd2.models import (
    Drafter,
    context_length,
    load_causal_lm,
    load_drafter,
    load_tokenizer,
    resolve_model_path,
    stop_token_ids,
)
from sd2.prompts import encode_prompt
from sd2.proposer import Proposer
from sd2.shipped import shipped_drafters
from sd2.trace import Block

log = logging.getLogger(__name__)

VERIFIER_METHOD = "verifier"  # plain autoregressive decoding of the verifier: the baseline
SELF_METHOD = "self"  # the verifier drafts for itself: a sanity check that must reach τ = k + 1


def display_text(text: str) -> str:
    """Decoded text as results show and stores keep it: a NUL character (a byte-level token can decode
    to one) becomes U+FFFD, since PostgreSQL text cannot hold NUL. Token ids stay exact."""
    return text.replace("\x00", "\ufffd")


class UnknownMethodError(InvalidValue):
    """The requested method is neither a built-in nor a loaded drafter (field "method")."""

    def __init__(self, method: str, available: Sequence[str]):
        super().__init__("method", f"unknown method {method!r}; available: {', '.join(available)}")


class UnknownDrafterError(InvalidValue):
    """No drafter of that name is loaded (field "drafter")."""

    def __init__(self, name: str, loaded: Sequence[str]):
        super().__init__("drafter", f"unknown drafter {name!r}; loaded: {', '.join(loaded) or 'none'}")


@dataclass(frozen=True, kw_only=True)
class GenerateRequest:
    """One generation: what to say, which method, how to decode."""

    prompt: str | None = None
    messages: tuple[dict, ...] | None = None  # chat history, overrides prompt
    method: str = VERIFIER_METHOD  # "verifier", "self", or a drafter name (pretrained, distilled, sd2…)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    steering: bool = True  # use the drafter's SD² head when it has one; False runs it unsteered
    # record each block's unsteered counterfactual (sd2.counterfactual) when the run is steered; the
    # emitted tokens are the same either way, and its time is left out of the speed figures
    counterfactual: bool = False
    chat: bool = True  # format a plain prompt with the verifier's chat template


@dataclass(frozen=True)
class PreparedRequest:
    """A request the Engine has checked, once: its method is loaded, its prompt encoded and fits the
    verifier's context. `Engine.prepare` makes one; `Engine.stream`/`generate` take it as it is."""

    request: GenerateRequest
    prompt_ids: tuple[int, ...]
    drafter: Drafter | None  # the method's drafter; None for "verifier" and "self"

    @property
    def steered(self) -> bool:
        """Whether the run uses an SD² head: a drafter that has one, with steering on."""
        return self.drafter is not None and self.request.steering and self.drafter.head is not None


@dataclass
class GenerationResult:
    """The outcome of one generation, with its full per-block trace (docs/trace.md#a-generation)."""

    text: str
    token_ids: list[int]
    method: str
    steering: bool
    prompt_tokens: int
    finish_reason: str  # "stop" (a stop token was emitted), "length" (max_new_tokens) or "time" (budget)
    config: DecodeConfig
    metrics: GenerationMetrics
    blocks: list[Block]
    precision: str = ""  # where and how it ran, e.g. "cpu/bf16" (Engine.precision)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "method": self.method,
            "steering": self.steering,
            "prompt_tokens": self.prompt_tokens,
            "finish_reason": self.finish_reason,
            "precision": self.precision,
            "config": asdict(self.config),
            "metrics": self.metrics.to_dict(),
            "blocks": [b.to_dict() for b in self.blocks],
        }


class Engine:
    """A loaded verifier, its tokenizer and named drafters. Not thread-safe: callers serialise runs.

    Callers outside sd2 (the service, the UI) use the methods below and never the models themselves:
    `prepare` → `stream`/`generate`, `methods`, `drafter`/`drafter_names`/`loaded_drafters`,
    `load_drafter`, `precision`/`device_label`, `text_of` (not thread-safe either: the tokenizer's).
    """

    def __init__(
        self,
        verifier: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        drafters: Mapping[str, Drafter],
        placement: Placement,
        verifier_name: str = "",
        draft_step: str = "eager",
        draft_weights: str = "full",
    ):
        """`verifier` should already be batch-invariant (`make_batch_invariant`, as `load` does) for
        speculative output to equal the verifier's own bit for bit. `draft_step`: "eager", "direct" or
        "compiled" (sd2.draft_step), how drafters run. Drafters pack their weights where the verifier does.
        `draft_weights` "int8" multiplies the drafters by int8 copies of their weights (sd2.int8_weights;
        resolved by `resolve_draft_weights`), "full" by the weights themselves."""
        self.verifier, self.tokenizer, self.placement = verifier, tokenizer, placement
        self.draft_step_kind = draft_step
        self.draft_weights = draft_weights
        self._compiled_steps: dict[
            str, CompiledDraftStep
        ] = {}  # method → its drafter's step, reused per request
        self.verifier_name = verifier_name
        self.stop_ids = stop_token_ids(verifier, tokenizer)
        self._token_text = lru_cache(maxsize=65536)(self._decode_one)
        self._verify_costs: VerifyCosts | None = None
        self._costs: dict[str, CostProfile] = {}
        self.drafters = {name: self._on_engine_kernels(drafter) for name, drafter in drafters.items()}

    @classmethod
    def load(
        cls,
        verifier: str | None = None,
        drafters: Mapping[str, str] | None = None,
        device: str | None = None,
        shipped: bool = True,
        dtype: str | None = None,
        batch_invariant: bool = True,
        draft_vocab: bool = True,
        home: Path | None = None,
        draft_step: str | None = None,
        packed_weights: bool | None = None,
        draft_weights: str | None = None,
    ) -> Engine:
        """Load the verifier (default: the embedded SmolLM2) and drafters {name: folder or hub id}.

        With the embedded verifier, the drafters shipped for it in assets/drafters are loaded too
        (unless `shipped` is False); a drafter given by name replaces a shipped one of that name.
        `dtype` is auto, bf16 or fp32 (None: $SD2_DTYPE, else auto). `batch_invariant` (the default)
        runs the verifier on kernels whose row results do not depend on the forward's length, which
        exactness needs (sd2.invariant); False keeps transformers' kernels (faster, not exact).
        `draft_vocab` (the default) drafts over each drafter's reduced vocabulary when it ships one.
        `home` holds the converted embedded verifier (default `sd2.paths.sd2_home()`).
        `draft_step` is auto, eager, direct, compiled (None: $SD2_DRAFT_STEP, else auto = compiled on CUDA,
        direct elsewhere).
        `packed_weights` (None: $SD2_PACKED_WEIGHTS, else on) lets the invariant kernels keep a packed
        copy of each weight for oneDNN on a CPU (fp32, or bf16 where the CPU has it natively): faster, and
        as much memory again as the weights (≈ 300 MB for the embedded verifier in bf16, 600 MB in fp32);
        off uses the padded layouts.
        `draft_weights` is auto, int8 or full (None: $SD2_DRAFT_WEIGHTS, else auto = int8 on a CPU in bf16
        with the eager or direct step): the drafters multiply by int8 copies of their weights, a cheaper
        draft step whose drafts the verifier still judges exactly (sd2.int8_weights).
        """
        packed = resolve_packed_weights(packed_weights)
        placement = default_placement(device, dtype)
        step_kind = resolve_draft_step(draft_step, placement.device)
        weights = resolve_draft_weights(draft_weights, placement.dtype, placement.device, step_kind)
        path = resolve_model_path(verifier, home)
        model, tokenizer = load_causal_lm(path, placement), load_tokenizer(path)
        if batch_invariant:
            make_batch_invariant(model, packed=packed)
        found = shipped_drafters() if shipped and verifier is None else {}
        if shipped and verifier is None and not found:
            log.warning("no shipped drafters found (set $SD2_ASSETS to a checkout's assets/ folder)")
        wanted = {**found, **(drafters or {})}
        loaded = {
            name: load_drafter(name, drafter_path, placement, model, tokenizer, draft_vocab=draft_vocab)
            for name, drafter_path in wanted.items()
        }
        name = verifier or "SmolLM2-135M-Instruct"
        return cls(
            model,
            tokenizer,
            loaded,
            placement,
            verifier_name=name,
            draft_step=step_kind,
            draft_weights=weights,
        )

    @property
    def batch_invariant(self) -> bool:
        return is_batch_invariant(self.verifier)

    @property
    def packed_weights(self) -> bool:
        """Whether the verifier multiplies by packed copies of its weights (sd2.invariant); its drafters
        do where it does."""
        return uses_packed_weights(self.verifier)

    @property
    def precision(self) -> str:
        """What ran, for reports: e.g. "cpu/bf16" (+ ", stock kernels" when not batch-invariant)."""
        return self.placement.label + ("" if self.batch_invariant else ", stock kernels")

    @property
    def device_label(self) -> str:
        """Where and in what precision the models run, e.g. "cpu/bf16"."""
        return self.placement.label

    def methods(self) -> list[str]:
        return [VERIFIER_METHOD, SELF_METHOD, *self.drafters]

    def drafter_names(self) -> list[str]:
        return list(self.drafters)

    def loaded_drafters(self) -> list[Drafter]:
        return list(self.drafters.values())

    def drafter(self, name: str) -> Drafter:
        """The loaded drafter of that name; UnknownDrafterError if there is none."""
        if name not in self.drafters:
            raise UnknownDrafterError(name, self.drafter_names())
        return self.drafters[name]

    def load_drafter(self, name: str, path: str | Path, draft_vocab: bool = True) -> Drafter:
        """Load a drafter folder for this verifier (sd2.models.load_drafter) and register it under
        `name`, replacing one of that name; returns it."""
        drafter = load_drafter(name, str(path), self.placement, self.verifier, self.tokenizer, draft_vocab)
        self.add_drafter(drafter)
        return drafter

    def prepare(self, request: GenerateRequest) -> PreparedRequest:
        """Check a request once: the method is loaded (UnknownMethodError), the prompt encodes
        (InvalidValue on "prompt" or "messages") and fits the verifier's context with room for
        max_new_tokens + k + 1."""
        if request.method not in self.methods():
            raise UnknownMethodError(request.method, self.methods())
        field_name = "prompt" if request.messages is None else "messages"
        try:
            ids = encode_prompt(self.tokenizer, request.prompt, request.messages, request.chat)
        except InvalidValue:
            raise
        except ValueError as err:  # the tokenizer's own refusal of the text
            raise InvalidValue(field_name, str(err)) from err
        needed = len(ids) + request.decode.max_new_tokens + request.decode.max_k + 1
        if needed > context_length(self.verifier):
            raise InvalidValue(
                field_name,
                f"prompt is too long: {len(ids)} prompt tokens + max_new_tokens "
                f"{request.decode.max_new_tokens} + k + 1 exceed the verifier's context of "
                f"{context_length(self.verifier)} tokens",
            )
        return PreparedRequest(request, tuple(ids), self.drafters.get(request.method))

    def encode(self, request: GenerateRequest) -> list[int]:
        """The request's prompt ids (`prepare`'s checks included)."""
        return list(self.prepare(request).prompt_ids)

    def stream(
        self, request: GenerateRequest | PreparedRequest, time_budget_s: float | None = None
    ) -> Iterator[Block | GenerationResult]:
        """Yield each trace Block as it is decoded (token texts filled in), then the GenerationResult.

        `time_budget_s` bounds the run's wall time: once a block ends past it, decoding stops there and
        the result has `finish_reason` "time" (what was emitted is kept; a block is never cut, so a
        run takes at most the budget plus one block — the prefill being the first).
        """
        prepared = request if isinstance(request, PreparedRequest) else self.prepare(request)
        decoder = self._decoder(prepared)
        start, blocks, out_of_time = time.perf_counter(), [], False
        run = decoder.run(prepared.prompt_ids)
        try:
            for block in run:
                self.fill_text(block)
                blocks.append(block)
                yield block
                if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
                    out_of_time = True
                    break
        finally:
            run.close()
        wall_ms = (time.perf_counter() - start) * 1e3
        yield self._result(prepared, blocks, wall_ms, out_of_time)

    def generate(
        self, request: GenerateRequest | PreparedRequest, time_budget_s: float | None = None
    ) -> GenerationResult:
        """Run one generation to the end (or to its time budget, as in `stream`)."""
        *_, result = self.stream(request, time_budget_s)
        return result

    def text_of(self, token_ids: Sequence[int]) -> str:
        """The text of emitted token ids as a result holds it (special tokens left out). A stream's text
        so far is `text_of` its ids so far; a prefix of it may change as tokens arrive (a character split
        over byte-level tokens shows as U+FFFD until its last byte comes)."""
        return display_text(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def warm_up(self, max_new_tokens: int = 4) -> dict[str, float]:
        """Measure k = auto's cost profile for every speculative method and run one short greedy
        generation per method, so the first real request meets measured costs and warm kernels (the
        first calls of a shape are slow; on a GPU, kernel selection and the CUDA context). Returns
        the seconds each method took."""
        seconds = {}
        for method in self.methods():
            start = time.perf_counter()
            if method != VERIFIER_METHOD:
                self.cost_profile(method)
            decode = DecodeConfig(temperature=0.0, max_new_tokens=max_new_tokens)
            self.generate(GenerateRequest(prompt="Hello", method=method, decode=decode))
            seconds[method] = time.perf_counter() - start
        return seconds

    @property
    def measured_cost_profiles(self) -> tuple[str, ...]:
        """The methods whose cost profile has been measured (on first use, or by `warm_up`)."""
        return tuple(self._costs)

    def cost_profile(self, method: str) -> CostProfile:
        """The measured cost profile k = auto uses for a speculative method (sd2.draft_length), timed on
        first use — a few seconds on a CPU, once per engine for the verifier and once per drafter."""
        if method not in self._costs:
            if self._verify_costs is None:
                self._verify_costs = measure_verify_costs(self.verifier, AUTO_MAX_K)
            proposer = self.proposer(method)
            self._costs[method] = proposer.measure_costs(self.verifier, AUTO_MAX_K, self._verify_costs)
        return self._costs[method]

    def proposer(self, method: str, drafter: Drafter | None = None) -> Proposer:
        """A speculative method's drafter side (sd2.proposer) with its kept compiled step, if any: the
        method's loaded drafter, or `drafter` when given (a request keeps the one it was prepared with),
        or the verifier itself for "self"."""
        if method == SELF_METHOD:
            return Proposer(self.verifier)
        drafter = drafter or self.drafters.get(method)
        if drafter is None:
            raise UnknownMethodError(method, self.methods())
        direct = self.draft_step_kind == "direct"
        return Proposer(
            drafter.model, drafter.head, drafter.draft_head, self._draft_step(method, drafter), direct
        )

    def generate_batch(
        self, requests: Sequence[GenerateRequest | PreparedRequest], max_rows: int = MAX_ROWS
    ) -> list[GenerationResult]:
        """Decode several requests together (sd2.batching), all to their end; each result's tokens equal
        its own `generate`'s (at T > 0 with its seed too). Per-request times are shared ones: each block
        waited for the whole batch's forwards. Drafters run eager steps here (a compiled step keeps one
        static cache per drafter)."""
        prepared = [r if isinstance(r, PreparedRequest) else self.prepare(r) for r in requests]
        batch, blocks, wall_ms = Batch(max_rows), {i: [] for i in range(len(prepared))}, {}
        start = time.perf_counter()
        for i, request in enumerate(prepared):
            batch.add(i, self.program(request))
        while len(batch):
            report = batch.step()
            if report.failed:
                key, error = next(iter(report.failed.items()))
                raise RuntimeError(f"request {key} of the batch failed") from error
            for key, block in report.blocks:
                self.fill_text(block)
                blocks[key].append(block)
            for key in report.finished:
                wall_ms[key] = (time.perf_counter() - start) * 1e3
        return [self.finish(request, blocks[i], wall_ms[i]) for i, request in enumerate(prepared)]

    def program(self, prepared: PreparedRequest) -> Program:
        """The prepared request's decode as a Program (sd2.decoding), for a driver that batches requests
        (sd2.batching.Batch): `fill_text` each Block it yields, `finish` its Blocks into the result."""
        return self._decoder(prepared, batched=True).program(prepared.prompt_ids)

    def finish(
        self, prepared: PreparedRequest, blocks: list[Block], wall_ms: float, out_of_time: bool = False
    ) -> GenerationResult:
        """The GenerationResult of a request's decoded Blocks (`out_of_time`: its time budget ended it)."""
        return self._result(prepared, blocks, wall_ms, out_of_time)

    def _decoder(self, prepared: PreparedRequest, batched: bool = False) -> Decoder:
        """The Decoder of the prepared request's method (`batched`: with its own eager draft step)."""
        method, config = prepared.request.method, prepared.request.decode
        if method == VERIFIER_METHOD:
            return VerifierDecoder(self.verifier, config, self.stop_ids)
        proposer = self.proposer(method, prepared.drafter)  # the drafter prepare found, even if replaced
        if not prepared.steered:
            proposer = proposer.unsteered()
        if batched:
            proposer = proposer.eager()
        length = DraftLength.of(config, self.cost_profile(method) if config.auto_k else None)
        return SpeculativeDecoder(
            self.verifier, proposer, config, self.stop_ids, length, prepared.request.counterfactual
        )

    def _draft_step(self, method: str, drafter: Drafter) -> CompiledDraftStep | None:
        """The method's kept compiled step (built on first use), or None: an eager step per request. The
        verifier drafting for itself ("self") always runs eagerly, on its batch-invariant kernels."""
        if self.draft_step_kind != "compiled" or method == SELF_METHOD:
            return None
        if method not in self._compiled_steps:
            self._compiled_steps[method] = CompiledDraftStep(drafter.model, drafter.draft_head)
        return self._compiled_steps[method]

    def _on_engine_kernels(self, drafter: Drafter) -> Drafter:
        """The drafter on batch-invariant kernels where the verifier is and its steps are eager or direct
        (compiled steps keep the stock ones), so its batched steps equal its solo ones (sd2.batching); on
        int8 copies of its weights where the engine's `draft_weights` says so (also row-invariant) and
        the int8 product takes the drafter (bf16 on a CPU; one added in another precision keeps its own)."""
        if self.draft_step_kind != "compiled" and is_batch_invariant(self.verifier):
            make_batch_invariant(drafter.model, packed=self.packed_weights)
        weight = drafter.model.get_input_embeddings().weight
        if self.draft_weights == "int8" and int8_available(weight.dtype, weight.device):
            use_int8_weights(drafter.model, drafter.draft_head)
        return drafter

    def fill_text(self, block: Block) -> None:
        """Fill in the text of every token of a block: its events, their explainer candidates and its
        counterfactual's tokens."""
        tokens = [*block.drafts, *([block.extra] if block.extra else [])]
        if block.counterfactual is not None:
            tokens += block.counterfactual.drafts
        for token in tokens:
            token.text = self._token_text(token.token_id)
            for candidate in [*token.target_top, *token.draft_top, *getattr(token, "residual_top", [])]:
                candidate.text = self._token_text(candidate.token_id)

    def _decode_one(self, token_id: int) -> str:
        return display_text(self.tokenizer.decode([token_id]))

    def _result(
        self, prepared: PreparedRequest, blocks: list[Block], wall_ms: float, out_of_time: bool = False
    ) -> GenerationResult:
        request = prepared.request
        token_ids = [t.token_id for b in blocks for t in b.emitted]
        stopped = bool(token_ids) and token_ids[-1] in self.stop_ids
        complete = stopped or len(token_ids) >= request.decode.max_new_tokens
        finish_reason = "stop" if stopped else "time" if out_of_time and not complete else "length"
        return GenerationResult(
            text=self.text_of(token_ids),
            token_ids=token_ids,
            method=request.method,
            steering=prepared.steered,
            prompt_tokens=len(prepared.prompt_ids),
            finish_reason=finish_reason,
            config=request.decode,
            metrics=summarize(blocks, request.decode.max_k, wall_ms=wall_ms),
            blocks=blocks,
            precision=self.precision,
        )

    def add_drafter(self, drafter: Drafter) -> None:
        """Register (or replace) a named drafter, e.g. when a training job finishes. A replaced one's
        cost profile and compiled step go with it. With an invariant verifier and eager drafter steps,
        the drafter runs on invariant kernels too, so a batched step equals its solo step (sd2.batching)."""
        self.drafters[drafter.name] = self._on_engine_kernels(drafter)
        self._costs.pop(drafter.name, None)
        step = self._compiled_steps.pop(drafter.name, None)
        if step is not None:
            step.close()
