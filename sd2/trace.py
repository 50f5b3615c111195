"""The per-token trace: one record per block, the heart of the UI and the DB (docs/trace.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum


class TokenStatus(StrEnum):
    """What happened to a token. Colours everywhere: accepted green, rejected red (struck through),
    discarded grey, resampled/bonus blue — as in the paper's Table 2."""

    ACCEPTED = "accepted"  # a draft the verifier kept
    REJECTED = "rejected"  # the first draft the verifier refused
    DISCARDED = "discarded"  # drafts after the first rejection (never judged), or cut by EOS/length
    RESAMPLED = "resampled"  # emitted from norm(max(0, p − q)) after a rejection
    BONUS = "bonus"  # emitted from p after all drafts were accepted (or by a plain verifier step)


class DraftStop(StrEnum):
    """Why a block's draft ended (sd2.draft_length)."""

    K = "k"  # it drafted the block's k (fixed, or chosen by k = auto)
    CONFIDENCE = "confidence"  # the drafter's probability of its latest draft fell to the threshold
    LENGTH = "length"  # the run's max_new_tokens left no room for the block's k


class BlockKind(StrEnum):
    """What a verifier forward was."""

    PREFILL = "prefill"  # the forward over the prompt; its token is sampled from the last position
    VERIFIER = "verifier"  # a plain verifier step: no drafts, one token
    SPECULATIVE = "speculative"  # a drafted-and-verified block


def counts_for_tau(kind: BlockKind | str, complete: bool) -> bool:
    """The one rule of which blocks τ averages over (docs/metrics.md#which-blocks-count): complete
    decode blocks. Prefill and blocks cut by EOS or the length limit count in throughput only."""
    return complete and kind in (BlockKind.SPECULATIVE, BlockKind.VERIFIER)


class SteeringOutcome(StrEnum):
    """A block's steered draft against its unsteered counterfactual, by expected accepted length."""

    WON = "won"  # the steered draft expected more accepted tokens
    TIED = "tied"  # equal (within TIE_TOLERANCE)
    LOST = "lost"  # the unsteered draft expected more


TIE_TOLERANCE = 1e-6  # expected accepted lengths closer than this are a tie (rounding of p / q)
TOP_N = 5  # how many of a distribution's most likely tokens a judged position keeps (the explainer)


@dataclass
class Candidate:
    """One of a distribution's most likely tokens, as the rejection explainer shows it."""

    token_id: int
    prob: float
    text: str = ""


@dataclass
class TokenEvent:
    """One token in a block. Probabilities are the warped distributions the acceptance rule used,
    except at T = 0, where the rule compares argmaxes and these are plain softmax (T = 1) values.

    The explainer fields are filled at judged positions of speculative blocks (each draft up to the
    first rejection, and the extra token); elsewhere they stay empty."""

    token_id: int
    status: TokenStatus
    draft_prob: float | None  # q(token); None for the extra token (not drafted)
    target_prob: float | None  # p(token); None for discarded drafts past a cut
    text: str = ""
    target_rank: int | None = None  # the token's rank under p (1 = the verifier's most likely)
    target_top: list[Candidate] = field(default_factory=list)  # the verifier's TOP_N at this position
    draft_top: list[Candidate] = field(default_factory=list)  # the drafter's TOP_N (drafts only)
    # a resampled token's law norm(max(0, p − q)) at the rejected position, its TOP_N non-zero entries
    residual_top: list[Candidate] = field(default_factory=list)

    @property
    def emitted(self) -> bool:
        return self.status in (TokenStatus.ACCEPTED, TokenStatus.RESAMPLED, TokenStatus.BONUS)


@dataclass
class BlockTimings:
    """Wall-clock milliseconds spent in each phase of a block. `total_ms` is the block's own time;
    `counterfactual_ms`, spent on the unsteered counterfactual, is apart from it and from every speed
    figure (it is not part of decoding)."""

    draft_ms: float = 0.0
    verify_ms: float = 0.0
    steer_ms: float = 0.0
    total_ms: float = 0.0
    counterfactual_ms: float = 0.0


@dataclass
class CounterfactualToken:
    """One token the unsteered drafter would have drafted, and what the verifier makes of it."""

    token_id: int
    draft_prob: float  # q(token) under the unsteered drafter (shown as TokenEvent.draft_prob is)
    target_prob: float  # p(token) under the verifier after the counterfactual draft's own prefix
    survival: float  # P(this and every earlier draft accepted) = Π_{i≤j} min(1, p_i/q_i) under the rule
    status: TokenStatus | None  # at T = 0 what it would have got (accepted/rejected/discarded); else None
    text: str = ""
    target_rank: int | None = None  # its rank under p
    target_top: list[Candidate] = field(default_factory=list)  # the verifier's TOP_N at this position
    draft_top: list[Candidate] = field(default_factory=list)  # the unsteered drafter's TOP_N


@dataclass
class Counterfactual:
    """What the same drafter with its steering off would have proposed from the block's committed
    prefix, with as many drafts, and how the verifier would have judged it (docs/trace.md)."""

    drafts: list[CounterfactualToken]
    accepted: int | None  # T = 0: its leading argmax matches, exact; None at T > 0
    expected_accepted: float  # Σ_j Π_{i≤j} min(1, p_i/q_i) of the counterfactual draft
    steered_expected_accepted: float  # the same for the block's own (steered) draft
    outcome: SteeringOutcome  # steered against unsteered, by expected accepted length

    @property
    def gain(self) -> float:
        """Expected accepted drafts that steering added in this block (negative: it lost some)."""
        return self.steered_expected_accepted - self.expected_accepted


def steering_outcome(steered: float, unsteered: float) -> SteeringOutcome:
    """Won / tied / lost by expected accepted length (exact counts at T = 0)."""
    if abs(steered - unsteered) <= TIE_TOLERANCE:
        return SteeringOutcome.TIED
    return SteeringOutcome.WON if steered > unsteered else SteeringOutcome.LOST


@dataclass
class Block:
    """One verifier forward and what it decided.

    `complete` is False when EOS or the length limit cut the block short or its draft was shortened
    near the limit; such blocks are excluded from τ (as in the paper) but count in throughput
    (`counts_for_tau`).
    """

    index: int
    kind: BlockKind
    drafts: list[TokenEvent]
    extra: TokenEvent | None
    k: int  # drafts proposed in this block
    n_accepted: int
    complete: bool
    overlaps: list[float] = field(default_factory=list)  # Σ min(p, q) at each judged position
    steering_norm: float | None = None  # ‖g‖ of the vector that steered this block's drafts
    layer_bias_norms: list[float] = field(default_factory=list)  # ‖bias_l‖ per steered layer
    timings: BlockTimings = field(default_factory=BlockTimings)
    draft_stop: DraftStop | None = None  # why drafting ended; None for prefill and verifier steps
    counterfactual: Counterfactual | None = None  # the unsteered draft's record, when the run asked for it
    # requests whose rows shared this block's verifier forward (sd2.batching); 1: it ran alone. Its
    # timings are then the shared forwards' wall times, waits for the other rows included
    batch_size: int = 1

    @property
    def emitted(self) -> list[TokenEvent]:
        tokens = [t for t in self.drafts if t.status is TokenStatus.ACCEPTED]
        return tokens + ([self.extra] if self.extra is not None else [])

    @property
    def counts_for_tau(self) -> bool:
        return counts_for_tau(self.kind, self.complete)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["n_emitted"] = len(self.emitted)
        data["counts_for_tau"] = self.counts_for_tau
        return data
