"""The rejection explainer: what each judged position of a block keeps so a reader can see why a draft
was accepted, rejected or resampled (docs/trace.md#the-rejection-explainer).

At a judged position the trace keeps the verifier's and the drafter's TOP_N tokens with p and q, the
drafted token's rank under p, and for a resampled token the TOP_N of the residual norm(max(0, p − q)) it
was drawn from. The p and q shown are the trace's (`sd2.sampling.Picker.trace_probs`); the residual is
the rule's own (one-hot on the verifier's argmax at T = 0).
"""

from __future__ import annotations

import torch

from sd2.sampling import rank_of, residual, top_tokens
from sd2.trace import TOP_N, Candidate, CounterfactualToken, TokenEvent


def candidates(probs: torch.Tensor, n: int = TOP_N) -> list[Candidate]:
    """A row's n most likely tokens as Candidates (texts filled in later by the Engine). probs: [V]."""
    return [Candidate(token, prob) for token, prob in top_tokens(probs, n)]


def explain_draft(
    token: TokenEvent | CounterfactualToken, target_row: torch.Tensor, draft_row: torch.Tensor
) -> None:
    """Fill a judged draft's explainer fields from the shown p [V] and q [V] of its position."""
    token.target_rank = rank_of(target_row, token.token_id)
    token.target_top = candidates(target_row)
    token.draft_top = candidates(draft_row)


def explain_extra(
    token: TokenEvent,
    target_row: torch.Tensor,
    rule_target: torch.Tensor | None = None,
    rule_draft: torch.Tensor | None = None,
) -> None:
    """Fill the extra token's fields from the shown p [V] of its position; for a resampled token also
    the residual of the rule's p and q ([V] each) at the rejected position."""
    token.target_rank = rank_of(target_row, token.token_id)
    token.target_top = candidates(target_row)
    if rule_target is not None and rule_draft is not None:
        token.residual_top = candidates(residual(rule_target, rule_draft.to(rule_target.device)))
