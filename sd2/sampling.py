"""Pure sampling math: logit warping, token sampling and the speculative accept/resample rule.

Tensors in, tensors out; randomness only through a `torch.Generator` argument. EOS and length
handling belong to the caller (`sd2.decoding`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Warp:
    """How logits become the distribution both models sample from (applied identically to both)."""

    temperature: float = 0.0  # 0 means greedy: distributions become one-hot on the argmax
    top_k: int = 0  # 0 disables top-k filtering
    top_p: float = 1.0  # 1 disables nucleus filtering

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp_probs(logits: torch.Tensor, warp: Warp) -> torch.Tensor:
    """Turn logits into the probabilities the acceptance rule uses (temperature → top-k → top-p).

    logits: [..., V]. Returns [..., V] float32 rows summing to 1; one-hot on argmax when greedy.
    """
    logits = logits.float()
    if warp.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / warp.temperature
    if 0 < warp.top_k < logits.shape[-1]:
        kth = torch.topk(logits, warp.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if warp.top_p < 1.0:
        logits = _nucleus_mask(logits, warp.top_p)
    return torch.softmax(logits, dim=-1)


def _nucleus_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches top_p (always at least one)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [..., V]
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)  # [..., V]
    drop_sorted = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # mass before token ≥ p
    # The most likely token always stays: a top_p below float32's range (1e-300) rounds to 0 in the
    # comparison above, which would otherwise drop every token and leave softmax nothing but NaN.
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a probability row (any non-negative weights; normalised here). probs: [V].

    Inversion in float64: the first id whose cumulative weight exceeds u · total, for one uniform u
    drawn in float64. Each id's chance is its share of the total up to float64 rounding (≈ 1e-16 per
    id, where float32 rounding of the cumulative sums would reach ≈ 1e-7 near the end of a 49k
    vocabulary), and it costs one cumulative sum: `torch.multinomial` draws an exponential per id,
    ≈ 20× slower on a CPU (1 ms for 49 152 ids against 50 µs), a cost paid on every sampled token and
    every sampled draft. An id of weight 0 is never drawn: its cumulative weight equals the one before.
    """
    cumulative = probs.double().cumsum(-1)  # [V]
    total = cumulative[-1]
    if not total > 0:  # NaN or no mass: no law to draw from
        raise ValueError(f"cannot sample from a row of total weight {float(total)}")
    u = torch.rand((), dtype=torch.float64, generator=generator, device=probs.device)
    token = int(torch.searchsorted(cumulative, u * total, right=True))
    if token >= probs.shape[-1]:  # u · total rounded up to the total: the last id of positive weight
        token = int((probs > 0).nonzero()[-1])
    return token


class Picker:
    """Chooses a token from logits under a run's warp, and reports its trace probability."""

    def __init__(self, warp: Warp, generator: torch.Generator):
        self.warp, self.generator = warp, generator

    def pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        """logits: [V] → (token, probs [V]) where probs is the rule's distribution (one-hot if greedy)."""
        probs = warp_probs(logits, self.warp)
        if self.warp.greedy:  # one-hot on the logits' first argmax
            return int(probs.argmax()), probs
        return sample(probs, self.generator), probs

    def trace_probs(self, logits: torch.Tensor, rule_probs: torch.Tensor) -> torch.Tensor:
        """What the trace shows: the rule's probabilities, or the plain softmax when greedy."""
        return torch.softmax(logits.float(), dim=-1) if self.warp.greedy else rule_probs


@dataclass(frozen=True)
class Verdict:
    """Outcome of judging one block of drafts."""

    n_accepted: int  # drafts accepted before the first rejection (0..K)
    extra_token: int  # resampled token after a rejection, or the bonus token when all K were accepted


def rejection_sample(
    draft_tokens: torch.Tensor,  # [K] ids drafted from draft_probs
    draft_probs: torch.Tensor,  # [K, V] drafter distribution q at each draft step
    target_probs: torch.Tensor,  # [K+1, V] verifier distribution p; row K is the bonus distribution
    generator: torch.Generator | None,
) -> Verdict:
    """Leviathan et al. 2023, Alg. 1: accept d_i w.p. min(1, p(d_i)/q(d_i)); resample from norm(max(0, p−q)).

    The emitted tokens are distributed exactly as the verifier's p, whatever q is.
    """
    k = draft_tokens.shape[0]
    positions = torch.arange(k)
    p_draft = target_probs[positions, draft_tokens]  # [K]
    q_draft = draft_probs[positions, draft_tokens]  # [K]
    uniforms = torch.rand(k, generator=generator, device=draft_probs.device)  # [K]
    rejected = (uniforms * q_draft >= p_draft).nonzero()  # u ≥ p/q, written without division
    if rejected.numel() == 0:
        return Verdict(k, sample(target_probs[k], generator))
    first = int(rejected[0])
    return Verdict(first, sample(residual(target_probs[first], draft_probs[first]), generator))


def residual(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)), the law of the token emitted after a rejection. Rows: [V].

    The residual can only vanish when p == q (then nothing is ever rejected) or through rounding;
    in that case p itself is the exact answer, so fall back to it instead of dividing by zero.
    """
    mass = (target_row - draft_row).clamp_(min=0.0)  # [V]
    total = mass.sum()
    if total <= 0:
        return target_row
    return mass / total


def greedy_verdict(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> Verdict:
    """T = 0 rule: accept while the draft equals the verifier argmax; emit the verifier argmax after.

    draft_tokens: [K]; target_argmax: [K+1] verifier argmax at each verified position.
    """
    k = draft_tokens.shape[0]
    mismatch = (draft_tokens != target_argmax[:k]).nonzero()
    n_accepted = int(mismatch[0]) if mismatch.numel() else k
    return Verdict(n_accepted, int(target_argmax[n_accepted]))


def acceptance_survival(
    draft_tokens: torch.Tensor,  # [K] drafted ids
    draft_probs: torch.Tensor,  # [K, V] the drafter's rule distribution q at each step
    target_probs: torch.Tensor,  # [≥K, V] the verifier's rule distribution p at each drafted position
) -> torch.Tensor:
    """P(drafts 1..j all accepted) = Π_{i≤j} min(1, p_i(d_i) / q_i(d_i)) for j = 1..K: [K] float64.

    Its sum is the draft's expected accepted length under Leviathan's rule; at T = 0 (one-hot p and q)
    every factor is 1 or 0, so the sum counts the leading argmax matches exactly.
    """
    k = draft_tokens.shape[0]
    positions = torch.arange(k)
    tokens = draft_tokens.to(target_probs.device)
    p = target_probs[positions, tokens].double()  # [K]
    q = draft_probs.to(target_probs.device)[positions, tokens].double()  # [K]; > 0: d_i was drawn from q_i
    ratio = torch.where(q > 0, (p / q.clamp(min=1e-300)).clamp(max=1.0), torch.ones_like(p))
    return ratio.cumprod(0).cpu()


def ranks_of(rows: torch.Tensor, tokens: torch.Tensor) -> list[int]:
    """Each row's token's rank in it (1 = most likely; ties share the best rank). rows: [R, V]; tokens:
    [R] ids on the rows' device."""
    return ((rows > rows.gather(1, tokens[:, None])).sum(-1) + 1).tolist()


def overlap(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """β = Σ_v min(p, q) = 1 − TV(p, q) per row: the acceptance probability of a draft. [..., V] → [...]."""
    return torch.minimum(target_probs, draft_probs).sum(-1)
