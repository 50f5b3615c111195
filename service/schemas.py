"""Pydantic request/response models of the REST API (OpenAPI), separate from the ORM in `service.orm`.

Requests are strict (no "8" → 8 coercion) and forbid unknown fields, so a typo like `max_tokens`
gets a 422 naming it instead of being ignored.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sd2.bench.report import SCHEMA_VERSION as BENCH_SCHEMA_VERSION
from sd2.choices import LOSSES
from sd2.config import AUTO_K, DECODE_DEFAULTS, MAX_K, MIN_TEMPERATURE
from sd2.trace import BlockKind
from service.settings import NAME_PATTERN

Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=64, examples=["sd2"])]


def _iso_8601(value: object) -> object:
    """Only ISO 8601 text is a date here: pydantic would take "0.5" as a Unix timestamp."""
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("must be an ISO 8601 date-time, e.g. 2026-12-01T12:00:00Z") from None


def _naive_utc(moment: datetime) -> datetime:
    """In naive UTC (naive input is UTC already), clamped to the calendar: 9999-12-31T23:59:59-14:00 is
    after every representable moment, 0001-01-01T00:00:00+14:00 before every one."""
    if moment.tzinfo is None:
        return moment
    try:
        return moment.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:
        return datetime.max if moment.year == datetime.max.year else datetime.min


# A query-string moment: ISO 8601 only, compared in UTC.
UtcMoment = Annotated[datetime, BeforeValidator(_iso_8601), AfterValidator(_naive_utc)]
# Hard caps documented in the schema; the tighter per-deployment limits come from Settings.
PROMPT_CAP = 1_000_000
TOKENS_CAP = 1_000_000


def _unicode_text(value: str) -> str:
    """Refuse a lone surrogate ("\\ud800" is valid JSON but not text: no tokenizer or store takes it) and
    the NUL character ("\\u0000": PostgreSQL text cannot hold it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"must be Unicode text; a lone surrogate at position {err.start}") from None
    if "\x00" in value:
        raise ValueError(f"must not contain the NUL character (position {value.index(chr(0))})")
    return value


# Free text that reaches the models and the store: its length limits first (their own messages), then
# the Unicode check.
PromptText = Annotated[str, Field(min_length=1, max_length=PROMPT_CAP), AfterValidator(_unicode_text)]
TrainText = Annotated[str, Field(min_length=1), AfterValidator(_unicode_text)]
LabelText = Annotated[str, Field(max_length=200), AfterValidator(_unicode_text)]


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: PromptText


class DecodeKnobs(BaseModel):
    """The decode settings every generation route takes under these names and defaults
    (sd2.config.DecodeConfig): /generate and /compare, and the /v1 routes as extension fields."""

    model_config = ConfigDict(strict=True, extra="forbid")

    k: Annotated[int, Field(ge=1, le=MAX_K)] | Literal["auto"] = Field(
        DECODE_DEFAULTS.k,
        description="drafts per block, or \"auto\": each block's k from the pair's measured costs and "
        "the run's acceptance so far",
    )
    draft_threshold: float = Field(
        DECODE_DEFAULTS.draft_threshold,
        ge=0,
        le=1,
        description="stop a block's draft once the drafter's probability of its latest draft is ≤ this "
        "(0 = never, 1 = after one draft)",
    )
    temperature: float = Field(
        DECODE_DEFAULTS.temperature,
        ge=0,
        le=100,
        description=f"0 = greedy: output equals the verifier's greedy; otherwise ≥ {MIN_TEMPERATURE}",
    )
    top_k: int = Field(
        DECODE_DEFAULTS.top_k, ge=0, description="0 = off; applied to verifier and drafter alike (lossless)"
    )
    top_p: float = Field(DECODE_DEFAULTS.top_p, gt=0, le=1, description="1 = off")
    seed: int | None = Field(
        DECODE_DEFAULTS.seed, ge=0, lt=2**63, description="seeds the run's one torch.Generator; null = fresh"
    )
    steering: bool = Field(True, description="use the drafter's SD² head when it has one")
    counterfactual: bool = Field(
        False,
        description="record each steered block's unsteered counterfactual (`blocks[].counterfactual`, "
        "`metrics.steering_gain`); the output is the same, its time is left out of the speed figures. "
        "Only steered runs get one",
    )

    @field_validator("k", mode="wrap")
    @classmethod
    def _one_k_error(cls, value, handler):
        """One error for a bad k, not one per member of its union (int | "auto")."""
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f"must be {AUTO_K!r} or an integer in 1..{MAX_K}, got {value!r}") from None


class DecodeSettings(DecodeKnobs):
    """Decoding knobs shared by /generate and /compare (sd2.config.DecodeConfig)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    max_new_tokens: int = Field(
        DECODE_DEFAULTS.max_new_tokens,
        ge=1,
        le=TOKENS_CAP,
        description="capped by the server's SD2_MAX_NEW_TOKENS",
    )
    chat: bool = Field(True, description="format a plain prompt with the verifier's chat template")
    prompt: PromptText | None = Field(None, examples=["Why is the sky blue?"])
    messages: list[Message] | None = Field(None, min_length=1, max_length=256)
    prompt_set: Name | None = Field(None, description="a label to aggregate runs by in /stats")

    @model_validator(mode="after")
    def _one_prompt(self) -> DecodeSettings:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt: give exactly one of prompt or messages")
        return self


class GenerateIn(DecodeSettings):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"prompt": "Why is the sky blue?", "method": "sd2", "k": 8, "max_new_tokens": 64},
                {"messages": [{"role": "user", "content": "Hi!"}], "method": "verifier", "stream": True},
            ]
        },
    )

    method: Name = Field("verifier", description="verifier, self, or a drafter name from GET /drafters")
    stream: bool = Field(False, description="NDJSON: one line per block as decoded, then a summary line")


class CompareIn(DecodeSettings):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        json_schema_extra={"examples": [{"prompt": "Why is the sky blue?", "methods": ["verifier", "sd2"]}]},
    )

    methods: list[Name] = Field(min_length=1, max_length=8)
    stream: bool = Field(
        False, description="NDJSON: each method's blocks as decoded, a result line per method, then a summary"
    )

    @model_validator(mode="after")
    def _distinct(self) -> CompareIn:
        if len(set(self.methods)) != len(self.methods):
            raise ValueError("methods: each method may appear once")
        return self


class CandidateOut(BaseModel):
    """One of a distribution's most likely tokens (sd2.trace.Candidate)."""

    token_id: int
    prob: float
    text: str


EXPLAINER = "filled at judged positions of speculative blocks; empty elsewhere and in runs stored before it"


class TokenEventOut(BaseModel):
    token_id: int
    status: Literal["accepted", "rejected", "discarded", "resampled", "bonus"]
    draft_prob: float | None
    target_prob: float | None
    text: str
    target_rank: int | None = Field(
        None, description="its rank under the verifier (1 = most likely); " + EXPLAINER
    )
    target_top: list[CandidateOut] = Field(
        default_factory=list, description="the verifier's top 5; " + EXPLAINER
    )
    draft_top: list[CandidateOut] = Field(
        default_factory=list, description="the drafter's top 5 (drafts only)"
    )
    residual_top: list[CandidateOut] = Field(
        default_factory=list, description="a resampled token's law norm(max(0, p − q)), its top 5"
    )


class TimingsOut(BaseModel):
    draft_ms: float
    verify_ms: float
    steer_ms: float
    total_ms: float
    counterfactual_ms: float = Field(0.0, description="spent on the counterfactual, apart from total_ms")


class CounterfactualTokenOut(BaseModel):
    """A token the unsteered drafter would have drafted (sd2.trace.CounterfactualToken)."""

    token_id: int
    draft_prob: float
    target_prob: float
    survival: float = Field(description="P(this and every earlier draft accepted) = Π min(1, p/q)")
    status: Literal["accepted", "rejected", "discarded"] | None = Field(
        description="what it would have got at T = 0; null at T > 0"
    )
    text: str
    target_rank: int | None
    target_top: list[CandidateOut]
    draft_top: list[CandidateOut]


class CounterfactualOut(BaseModel):
    """The block's unsteered counterfactual (sd2.trace.Counterfactual, docs/trace.md)."""

    drafts: list[CounterfactualTokenOut]
    accepted: int | None = Field(description="T = 0: its drafts the verifier would have accepted; else null")
    expected_accepted: float = Field(description="Σ_j Π_{i≤j} min(1, p_i/q_i) of the unsteered draft")
    steered_expected_accepted: float = Field(description="the same for the block's own, steered draft")
    outcome: Literal["won", "tied", "lost"] = Field(description="steered against unsteered")


class BlockOut(BaseModel):
    index: int
    kind: BlockKind
    drafts: list[TokenEventOut]
    extra: TokenEventOut | None
    k: int
    n_accepted: int
    complete: bool
    overlaps: list[float]
    steering_norm: float | None
    layer_bias_norms: list[float]
    timings: TimingsOut
    draft_stop: Literal["k", "confidence", "length"] | None = Field(
        None, description="why drafting ended: the block's k, the confidence threshold, or the length limit"
    )
    counterfactual: CounterfactualOut | None = Field(
        None, description="the unsteered counterfactual, in a steered run asked with `counterfactual: true`"
    )
    batch_size: int = Field(
        1, description="requests whose rows shared this block's verifier forward (1: it ran alone)"
    )
    n_emitted: int
    counts_for_tau: bool = Field(description="whether τ averages over this block (docs/metrics.md)")


class SteeringGainOut(BaseModel):
    """sd2.metrics.SteeringGain (docs/metrics.md#steering-gain)."""

    n_blocks: int
    steered: float
    unsteered: float
    gain: float
    low: float | None
    high: float | None
    won: int
    tied: int
    lost: int


class MetricsOut(BaseModel):
    """sd2.metrics.GenerationMetrics; conventions in docs/metrics.md."""

    n_tokens: int
    n_blocks: int
    tau: float | None
    acceptance_rate: float | None
    alpha_hat: float | None
    accepted: int
    drafted: int
    histogram: list[int]
    per_position_unconditional: list[float]
    per_position_conditional: list[float]
    prefill_ms: float
    decode_ms: float
    tokens_per_s: float | None
    tokens_per_s_e2e: float | None
    drafter_step_ms: float | None
    verify_ms: float | None
    cost_ratio: float | None
    speedup_ceiling: float | None
    counterfactual_ms: float = 0.0  # runs stored before it existed spent none
    steering_gain: SteeringGainOut | None = Field(None, description="null without counterfactuals")


class ConfigOut(BaseModel):
    k: int | Literal["auto"]
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    seed: int | None
    draft_threshold: float = 0.0  # runs stored before it existed drafted without a threshold


class GenerationOut(BaseModel):
    """docs/trace.md#a-generation: GenerationResult.to_dict() plus the id of the stored run."""

    run_id: int
    text: str
    token_ids: list[int]
    method: str
    steering: bool
    prompt_tokens: int
    finish_reason: Literal["stop", "length", "time"] = Field(
        description='"stop": a stop token; "length": max_new_tokens or the context; "time": the server\'s '
        "per-generation time budget (SD2_GENERATION_TIME_BUDGET_S) ran out, the output so far is kept"
    )
    precision: str = Field(description='device and precision it ran in, e.g. "cpu/bf16"')
    config: ConfigOut
    metrics: MetricsOut
    blocks: list[BlockOut]


class CompareOut(BaseModel):
    comparison_id: int
    results: list[GenerationOut]


class RunSummary(BaseModel):
    id: int
    created_at: datetime
    status: Literal["succeeded", "failed", "cancelled"]
    error: str | None
    method: str
    drafter: str | None
    steering: bool
    prompt_set: str | None
    prompt: str | None
    messages: list[Message] | None
    config: ConfigOut
    precision: str | None = Field(None, description='device and precision it ran in, e.g. "cpu/bf16"')
    comparison_id: int | None
    text: str | None
    n_tokens: int | None
    tau: float | None
    acceptance_rate: float | None
    alpha_hat: float | None
    tokens_per_s: float | None


class RunDetail(RunSummary):
    token_ids: list[int] | None
    prompt_tokens: int | None
    finish_reason: str | None
    metrics: MetricsOut | None
    blocks: list[BlockOut]


class RunPage(BaseModel):
    items: list[RunSummary]
    total: int
    limit: int
    offset: int


class StatsRow(BaseModel):
    """Means over succeeded runs of one method and prompt set (τ, acceptance and tokens/s as in §3)."""

    method: str
    prompt_set: str | None
    n_runs: int
    n_tokens: int
    tau: float | None
    acceptance_rate: float | None
    alpha_hat: float | None
    tokens_per_s: float | None


class DrafterOut(BaseModel):
    name: str
    architecture: str
    recipe: str | None
    steering: bool
    n_params: int
    source: Literal["config", "training"]


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    models_loaded: bool
    verifier: str
    methods: list[str]
    device: str = Field(description='device and precision, e.g. "cpu/bf16"')
    batch_invariant: bool = Field(
        description="whether the verifier runs on length-invariant kernels (exact speculative output)"
    )
    draft_step: Literal["eager", "direct", "compiled"] = Field(
        description="how drafters run: eager kernels, the eager step's kernels called directly (the CPU "
        "default), or a static cache and a compiled step (CUDA graphs on CUDA; --draft-step)"
    )
    packed_weights: bool = Field(
        description="whether the verifier keeps packed copies of its weights for oneDNN's CPU kernels "
        "(faster on CPUs, as much memory again as the weights; $SD2_PACKED_WEIGHTS, --no-packed-weights)"
    )
    draft_weights: Literal["int8", "full"] = Field(
        description="the drafters' products: on int8 copies of their weights (the CPU default in bf16: a "
        "cheaper draft step, the output still the verifier's) or on the weights themselves "
        "($SD2_DRAFT_WEIGHTS, --draft-weights)"
    )
    database: bool


class ErrorItem(BaseModel):
    loc: list[str | int] = Field(description='e.g. ["body", "k"], ["path", "run_id"], ["server", "database"]')
    msg: str
    type: str


class ErrorOut(BaseModel):
    """Every error response: FastAPI's validation shape, whatever the status."""

    detail: list[ErrorItem]


class ReadyOut(BaseModel):
    status: Literal["ready", "not_ready"]
    models_loaded: bool
    database_writable: bool = Field(description="a write transaction can start now (probed, rolled back)")
    training_worker: bool = Field(description="the training jobs' worker thread is alive")


class DecodeDefaultsOut(BaseModel):
    """The value the API gives each decode field a request leaves out (sd2.config.DECODE_DEFAULTS)."""

    k: int | Literal["auto"]
    draft_threshold: float
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    seed: int | None


class DefaultsOut(BaseModel):
    decode: DecodeDefaultsOut
    max_new_tokens_limit: int = Field(description="this server's cap on max_new_tokens (SD2_MAX_NEW_TOKENS)")


class VersionOut(BaseModel):
    sd2: str
    schema_version: int
    api: str


class TrainIn(BaseModel):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "my-drafter", "method": "pretrain", "base_drafter": "sd2", "steps": 20, "lr": 1e-4}
            ]
        },
    )

    name: Name = Field(description="name of the drafter the job registers")
    method: Literal["pretrain", "distill", "sd2"] = "pretrain"
    base_drafter: Name
    data: list[TrainText] | None = Field(
        None, max_length=10_000, description="training texts; default: a few built-in sentences"
    )
    steps: int = Field(20, ge=1, le=1_000_000)
    lr: float = Field(1e-4, gt=0, le=1)
    k: int = Field(8, ge=1, le=MAX_K, description="draft length the steering offset is sampled from (sd2)")
    seq_len: int = Field(64, ge=8, le=4096)
    batch_size: int = Field(4, ge=1, le=256)
    seed: int = Field(0, ge=0, lt=2**63)
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="autocast of the training forwards: auto = bf16 on a CUDA GPU, fp32 on CPU; bf16 is "
        "≈ 2× faster on CPUs with AVX-512 BF16 / AMX",
    )
    loss: Literal[LOSSES] = Field(
        "kl",
        description="distill and sd2: the divergence of the drafter from the verifier at T = 1 — forward "
        "KL, tvd (TV distance = 1 − the acceptance probability) or their mean",
    )

    @model_validator(mode="after")
    def _loss_needs_a_verifier(self) -> TrainIn:
        if self.loss != "kl" and self.method == "pretrain":
            raise ValueError(f"loss {self.loss!r} is for distill and sd2; pretrain learns next tokens")
        return self


class MetricPointOut(BaseModel):
    step: int
    name: str
    value: float


class TrainJobOut(BaseModel):
    id: int
    name: str
    method: str
    base_drafter: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    progress: float
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    spec: dict
    points: list[MetricPointOut]


class BenchCellIn(BaseModel):
    """One aggregated cell of an `sd2 bench` result (its other keys are kept as they are)."""

    model_config = ConfigDict(extra="allow")

    method: str = Field(max_length=200)
    prompt_set: str = Field(max_length=200)
    temperature: float
    k: int | Literal["auto"] | None
    tau: float | None
    alpha_hat: float | None
    acceptance_rate: float | None
    speedup_vs_verifier: float | None
    speedup_vs_hf_generate: float | None
    tokens_per_s: dict


class BenchmarkIn(BaseModel):
    """The JSON `sd2 bench` writes (bench.json, schema `sd2.bench`), optionally labelled; the
    per-generation rows may be left out and are not stored."""

    model_config = ConfigDict(extra="forbid")

    schema_: Literal["sd2.bench"] = Field(alias="schema")
    schema_version: int = Field(ge=1, le=BENCH_SCHEMA_VERSION)
    created_at: str = Field(max_length=40)
    command: str = Field(max_length=10_000)
    machine: dict
    models: dict
    plan: dict
    prompt_sets: list[dict] = Field(max_length=100)
    conventions: dict | None = None
    forward_times: list[dict] = Field(default_factory=list, max_length=100)
    cells: list[BenchCellIn] = Field(min_length=1, max_length=10_000)
    best_k: list[dict] = Field(default_factory=list, max_length=1_000)
    cost_profiles: dict[str, dict] = Field(default_factory=dict)  # schema ≥ 7: what k = auto weighed
    generations: list[dict] | None = None
    label: LabelText | None = None


class BenchmarkSummary(BaseModel):
    id: int
    created_at: datetime
    measured_at: str
    label: str | None
    command: str
    bench_schema_version: int
    machine: dict
    methods: list[str]
    prompt_sets: list[str]
    n_cells: int


class BenchmarkDetail(BenchmarkSummary):
    models: dict
    plan: dict
    prompt_set_details: list[dict]
    forward_times: list[dict]
    cells: list[dict]
    best_k: list[dict]


class BenchmarkPage(BaseModel):
    items: list[BenchmarkSummary]
    total: int
    limit: int
    offset: int
