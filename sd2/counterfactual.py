"""The unsteered counterfactual of a steered block: what the same drafter with its steering bias off
would have drafted from the block's committed prefix, and how the verifier would have judged it
(docs/trace.md#the-counterfactual, docs/metrics.md#steering-gain).

`UnsteeredTwin` is a second drafter cache of the same model that is never steered. At every block it
catches up on the committed tokens, feeding them with the row counts the run's own draft step fed them
(one token at a time, then the same 1- or 2-token group), drafts as many tokens as the block drafted,
then is cropped back to the committed prefix. So with a zero steering head its drafts and q equal the
run's own bit for bit on eager kernels (the negative control). Sampling (T > 0) uses a copy of the
run's generator as it was before the block's own draft: both drafts see the same random numbers
(common random numbers: a fairer comparison), and the run's generator is never touched. The verifier
judges the draft in one forward on the run's cache, which is cropped back after it: with the
batch-invariant verifier the run's next verify is unchanged, so the emitted tokens are identical with
and without the counterfactual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from sd2.draft_step import EagerDraftStep
from sd2.draft_vocab import ReducedHead
from sd2.explainer import explain_draft
from sd2.kv_cache import cached_forward, crop_to
from sd2.sampling import Picker, Warp, acceptance_survival, warp_probs
from sd2.trace import Counterfactual, CounterfactualToken, TokenStatus, steering_outcome


@dataclass(frozen=True)
class CounterfactualDraft:
    """The counterfactual draft of a block and both models' distributions at its positions."""

    tokens: list[int]  # [K] ids
    rule_q: torch.Tensor  # [K, V] the unsteered drafter's rule distribution
    shown_q: torch.Tensor  # [K, V] what the trace shows of it
    rule_p: torch.Tensor  # [K, V] the verifier's rule distribution after the counterfactual prefix
    shown_p: torch.Tensor  # [K, V]

    def record(self, steered_survival: torch.Tensor, greedy: bool) -> Counterfactual:
        """The block's Counterfactual, against `acceptance_survival` [K] of its own steered draft."""
        survival = acceptance_survival(torch.tensor(self.tokens), self.rule_q, self.rule_p)  # [K]
        accepted = int(survival.sum()) if greedy else None
        records = []
        for j, token in enumerate(self.tokens):
            record = CounterfactualToken(
                token,
                float(self.shown_q[j, token]),
                float(self.shown_p[j, token]),
                float(survival[j]),
                None if accepted is None else _would_get(j, accepted),
            )
            explain_draft(record, self.shown_p[j], self.shown_q[j])
            records.append(record)
        expected, steered = float(survival.sum()), float(steered_survival.sum())
        return Counterfactual(records, accepted, expected, steered, steering_outcome(steered, expected))


def _would_get(position: int, accepted: int) -> TokenStatus:
    """At T = 0, the status draft `position` (0-based) would have had with `accepted` leading matches."""
    if position < accepted:
        return TokenStatus.ACCEPTED
    return TokenStatus.REJECTED if position == accepted else TokenStatus.DISCARDED


class UnsteeredTwin:
    """The counterfactual's drafter: the run's drafter model on a cache of its own, never steered."""

    def __init__(self, verifier: nn.Module, drafter: nn.Module, draft_head: ReducedHead | None, warp: Warp):
        self.verifier, self.draft_head, self.warp = verifier, draft_head, warp
        self.step = EagerDraftStep(drafter, draft_head)
        self.device = verifier.get_input_embeddings().weight.device

    def start(self, prompt_ids: Sequence[int], room: int) -> None:
        """Forward the prompt, as the run's draft step does (prompts are never steered)."""
        self.step.start(prompt_ids, room)

    @torch.inference_mode()
    def propose(
        self,
        tokens: Sequence[int],
        n_pending: int,
        k: int,
        generator_state: torch.Tensor,
        verifier_cache: DynamicCache,
    ) -> CounterfactualDraft:
        """Draft and verify the counterfactual of one block, before the block's own verify.

        tokens: the committed ids, prompt included (the last one is in neither cache yet); n_pending:
        how many tokens the run's draft step fed at this block's first draft step (1 or 2); k: the
        drafts of the block (≥ 1); generator_state: the run's generator before the block's draft;
        verifier_cache: the run's verifier cache, holding tokens[:-1], cropped back to it on return.
        """
        drafts, rule_q, shown_q = self._draft(tokens, n_pending, k, generator_state)  # [K], [K, V], [K, V]
        committed = verifier_cache.get_seq_length()
        # K + 1 tokens, as wide as the block's own verify though the last row is not needed: a verifier
        # whose kernels depend on a forward's width (not batch-invariant) then still gives a draft the
        # block shares with its counterfactual the very p it gave the block
        logits = cached_forward(self.verifier, [tokens[-1], *drafts], verifier_cache, last_only=False)[:-1]
        crop_to(verifier_cache, committed)
        rule_p = warp_probs(logits, self.warp)  # [K, V]: row j judges draft j + 1
        shown_p = Picker(self.warp, None).trace_probs(logits, rule_p)
        return CounterfactualDraft(drafts, rule_q, shown_q, rule_p, shown_p)

    def _draft(
        self, tokens: Sequence[int], n_pending: int, k: int, generator_state: torch.Tensor
    ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Catch up on the committed tokens, draft k unsteered tokens, crop back. Returns the ids, the
        rule's q [K, V] and the shown q [K, V] over the full vocabulary."""
        generator = torch.Generator(device=self.device)
        generator.set_state(generator_state)
        picker = Picker(self.warp, generator)
        pending = list(tokens[self.step.length :])
        for token in pending[:-n_pending]:  # fed one at a time, as the run's draft steps fed them
            self.step.logits([token])
        inputs, drafts, logit_rows, rule_rows = pending[-n_pending:], [], [], []
        for _ in range(k):  # as SpeculativeDecoder._draft, without steering and without a stop
            logits = self.step.logits(inputs)  # [V] or [N]
            token, probs = picker.pick(logits)
            if self.draft_head is not None:
                token = self.draft_head.vocabulary_id(token)
            drafts.append(token)
            logit_rows.append(logits)
            rule_rows.append(probs)
            inputs = [token]
        self.step.crop_to(len(tokens))
        logits, rule_q = torch.stack(logit_rows), torch.stack(rule_rows)  # [K, V], or [K, N]
        if self.draft_head is not None:
            logits, rule_q = self.draft_head.to_vocabulary(logits, rule_q)
        return drafts, rule_q, picker.trace_probs(logits, rule_q)
