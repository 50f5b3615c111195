"""The drafter side of speculative decoding as one object: what proposes a block's drafts.

A `Proposer` holds the drafter model, its SD² steering head (None: unsteered), its LM head over a reduced
draft vocabulary (None: the full vocabulary) and how its one-token step runs: a kept step shared by every
request (`sd2.draft_step.CompiledDraftStep`), or a fresh eager step per request. It knows its own cost:
`measure_costs` times its step against the verifier for k = auto (sd2.draft_length). The decoder
(`sd2.decoding.SpeculativeDecoder`) takes a Proposer and a draft-length policy
(`sd2.draft_length.DraftLength`) and nothing else of the drafter's.

A new kind of drafter (say, one whose step runs on another runtime) is a subclass that overrides
`new_step` with its own `sd2.draft_step.DraftStep`; see docs/architecture.md#adding-a-kind-of-drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from sd2.config import AUTO_MAX_K
from sd2.direct_step import DirectDraftStep, supports_direct_step
from sd2.draft_length import CostProfile, VerifyCosts, measure_costs
from sd2.draft_step import DraftStep, EagerDraftStep
from sd2.draft_vocab import ReducedHead
from sd2.steering import SteeringHead


@dataclass(frozen=True)
class Proposer:
    """What drafts: the drafter `model`, its steering `head`, its reduced `draft_head` and a `kept_step`
    (a step every request shares, e.g. a compiled one; None: each request gets its own eager step)."""

    model: nn.Module
    head: SteeringHead | None = None
    draft_head: ReducedHead | None = None
    kept_step: DraftStep | None = None
    direct: bool = False  # per-request steps are direct ones (sd2.direct_step) where the model allows

    @property
    def steered(self) -> bool:
        return self.head is not None

    def new_step(self) -> DraftStep:
        """The step one request drafts with (sd2.draft_step): the kept one, or a fresh eager (or direct)
        one."""
        if self.kept_step is not None:
            return self.kept_step
        direct = self.direct and supports_direct_step(self.model)  # checked per request: hooks may come
        return (DirectDraftStep if direct else EagerDraftStep)(self.model, self.draft_head)

    def eager(self) -> Proposer:
        """The same drafter with a step of its own per request, eager or direct (what a batch needs:
        sd2.batching drives their caches)."""
        return replace(self, kept_step=None)

    def unsteered(self) -> Proposer:
        """The same drafter without its steering head (the pretrained-only row of a comparison)."""
        return replace(self, head=None)

    def measure_costs(
        self, verifier: nn.Module, max_k: int = AUTO_MAX_K, verify: VerifyCosts | None = None
    ) -> CostProfile:
        """Its cost profile against `verifier` for k = auto, its step timed as decoding runs it
        (`verify`: the verifier's half when measured already)."""
        return measure_costs(
            verifier, self.model, self.draft_head, max_k, verify=verify, draft_step=self.new_step()
        )
