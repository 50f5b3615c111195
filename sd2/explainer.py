"""The rejection explainer: what each judged position of a block keeps so a reader can see why a draft
was accepted, rejected or resampled (docs/trace.md#the-rejection-explainer).

At a judged position the trace keeps the verifier's and the drafter's TOP_N tokens with p and q, the
drafted token's rank under p, and for a resampled token the TOP_N of the residual norm(max(0, p − q)) it
was drawn from. The p and q shown are the trace's (`sd2.sampling.Picker.trace_probs`); the residual is
the rule's own (one-hot on the verifier's argmax at T = 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sd2.sampling import ranks_of
from sd2.trace import TOP_N, Candidate, CounterfactualToken, TokenEvent


def top_candidates(rows: torch.Tensor, n: int = TOP_N) -> list[list[Candidate]]:
    """Each row's n most likely tokens as Candidates, zeros left out (texts filled in later by the
    Engine), with one top-k for all rows. rows: [R, V]."""
    values, ids = torch.topk(rows.float(), min(n, rows.shape[-1]), dim=-1)  # [R, n] each
    return [
        [Candidate(int(i), float(v)) for v, i in zip(row_values, row_ids, strict=True) if v > 0]
        for row_values, row_ids in zip(values.tolist(), ids.tolist(), strict=True)
    ]


def explain_block(
    judged: Sequence[TokenEvent],
    extra: TokenEvent,
    target_rows: torch.Tensor,
    draft_rows: torch.Tensor,
    residual_row: torch.Tensor | None = None,
) -> None:
    """The explainer fields of one block: each judged draft's (as `explain_draft`) and the extra token's
    (its rank and top under p; for a resampled one, the top of the residual it was drawn from), each kind
    of row ranked with one top-k. judged[i] sits at position i; the extra token at the last position.
    target_rows: the shown p at positions 0..n [n+1, V]; draft_rows: the shown q of the judged drafts
    [J, V]; residual_row: the law a resampled extra token was drawn from [V] (None for a bonus token)."""
    # positions 0..n, then the judged drafts
    tops = top_candidates(torch.cat([target_rows, draft_rows.to(target_rows)]) if judged else target_rows)
    target_tops, draft_tops = tops[: target_rows.shape[0]], tops[target_rows.shape[0] :]
    last = target_rows.shape[0] - 1
    positions = torch.tensor([*range(len(judged)), last], device=target_rows.device)  # [J+1]
    tokens = torch.tensor([t.token_id for t in (*judged, extra)], device=target_rows.device)  # [J+1]
    ranks = ranks_of(target_rows[positions], tokens)  # [J+1]
    for i, token in enumerate(judged):
        token.target_rank, token.target_top, token.draft_top = ranks[i], target_tops[i], draft_tops[i]
    extra.target_rank, extra.target_top = ranks[-1], target_tops[last]
    if residual_row is not None:
        extra.residual_top = top_candidates(residual_row[None])[0]


def explain_draft(
    token: TokenEvent | CounterfactualToken, target_row: torch.Tensor, draft_row: torch.Tensor
) -> None:
    """Fill a judged draft's explainer fields from the shown p [V] and q [V] of its position."""
    chosen = torch.tensor([token.token_id], device=target_row.device)
    token.target_rank = ranks_of(target_row[None], chosen)[0]
    token.target_top, token.draft_top = top_candidates(torch.stack([target_row, draft_row.to(target_row)]))
