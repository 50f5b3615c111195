"""The run plan: which methods, temperatures, draft lengths, lengths, samples and repetitions (frozen
dataclasses).

A *cell* is one (method, k) pair run at one temperature on one prompt set; k is a number of drafts or
"auto" (sd2.draft_length; hf-assisted then runs transformers' own default schedule). Baselines
(`verifier`, `hf-generate`) draft nothing, so their cells carry k = None and run once per temperature.

Seeds: sample j of prompt i is generated with seed + SAMPLE_SEED_STRIDE · j + i, the same for every
method and repetition. A repetition redraws the same samples (it is for timing); a sample is a new
draw (at T > 0; at T = 0 every sample would be the same, so one is run). Sample j of a run is therefore
sample 0 of a run with --seed seed + SAMPLE_SEED_STRIDE · j.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sd2.config import AUTO_K, AUTO_MAX_K, DECODE_DEFAULTS, DecodeConfig

VERIFIER = "verifier"  # our verifier-only loop (Engine method "verifier"): the speed-up baseline
HF_GENERATE = "hf-generate"  # transformers `generate` on the verifier alone: the plain user baseline
HF_ASSISTED = "hf-assisted"  # transformers assisted generation: the peer a user would pick instead of us
SELF = "self"  # the verifier drafts for itself (Engine method "self"): τ must be k + 1 at T = 0
PRETRAINED = "pretrained"  # the drafter hf-assisted uses by default, when one of that name is loaded

K_SWEEP = (1, 2, 3, 4, 6, 8, 12)  # draft lengths tried by --k-sweep
K_SWEEP_QUICK = (1, 3, 8)
SAMPLE_SEED_STRIDE = 1000  # seed distance between samples; a set may hold at most this many prompts


@dataclass(frozen=True)
class MethodSpec:
    """One method of the benchmark.

    runner: "ours" (Engine), "hf-generate" or "hf-assisted". drafter: None for the baselines, "self"
    for the verifier drafting for itself, else a loaded drafter name.
    """

    name: str
    runner: str
    drafter: str | None = None

    @property
    def speculative(self) -> bool:
        return self.drafter is not None


@dataclass(frozen=True)
class Cell:
    """A method at one draft length (k = None for the baselines)."""

    method: MethodSpec
    k: int | str | None

    @property
    def label(self) -> str:
        return self.method.name if self.k is None else f"{self.method.name} (k={self.k})"


@dataclass(frozen=True)
class BenchPlan:
    """Everything that decides what runs. Defaults are a full run; `quick_plan` shrinks it. The decode
    settings (k, temperature, max_new_tokens, seed, top_k, top_p) default to DECODE_DEFAULTS, the one
    source `sd2 generate` and the API read too."""

    methods: tuple[MethodSpec, ...]
    ks: tuple[int | str, ...] = (DECODE_DEFAULTS.k,)  # draft lengths, or "auto"
    # 0 = greedy, where outputs must match the verifier exactly
    temperatures: tuple[float, ...] = (DECODE_DEFAULTS.temperature,)
    max_new_tokens: int = DECODE_DEFAULTS.max_new_tokens
    repeats: int = 3  # timed repetitions per cell; medians and spreads are over these (Spec-Bench uses 3)
    warmup: int = 1  # untimed generations per cell before the first timed one (allocators, caches)
    max_prompts: int | None = 10  # prompts used per set; None = all (a full set is hours on 2 CPU cores)
    forward_prompts: int = 3  # prompts per set on which the isolated forward times are measured
    forward_repeats: int = 5  # timed repetitions of each isolated forward (median taken)
    seed: int = DECODE_DEFAULTS.seed  # sample j of prompt i uses seed + SAMPLE_SEED_STRIDE·j + i (module doc)
    samples: int = 1  # independent samples of each prompt at T > 0 (τ pools them); T = 0 runs one
    # steered methods also record each block's unsteered counterfactual: the steering gain per cell
    # (sd2.bench.gain); off by default, as it costs an extra unsteered draft and verify per block
    counterfactual: bool = False
    # sampling filters, applied to every method identically (0 / 1.0 = off)
    top_k: int = DECODE_DEFAULTS.top_k
    top_p: float = DECODE_DEFAULTS.top_p
    # the confidence stop of our speculative cells (sd2.draft_length; 0 = off): a block's draft ends
    # after a draft whose drafter probability is ≤ this (hf-assisted keeps transformers' schedule)
    draft_threshold: float = DECODE_DEFAULTS.draft_threshold
    quick: bool = False
    k_sweep: bool = False

    def __post_init__(self) -> None:
        if not self.methods:
            raise ValueError("methods must name at least one method")
        if self.repeats < 1:
            raise ValueError(f"repeats must be ≥ 1, got {self.repeats}")
        if self.samples < 1:
            raise ValueError(f"samples must be ≥ 1, got {self.samples}")
        if not self.ks or any(k != AUTO_K and not (isinstance(k, int) and k >= 1) for k in self.ks):
            raise ValueError(f"k must be a list of integers ≥ 1 or {AUTO_K!r}, got {list(self.ks)}")
        if not self.temperatures or min(self.temperatures) < 0:
            raise ValueError(f"temperatures must be ≥ 0, got {list(self.temperatures)}")
        if not 0 <= self.draft_threshold <= 1:
            raise ValueError(f"draft_threshold must be in [0, 1], got {self.draft_threshold}")

    def cells(self) -> list[Cell]:
        """Baselines once, each speculative method at every k, in the plan's method order."""
        return [Cell(m, k) for m in self.methods for k in (self.ks if m.speculative else (None,))]

    def decode(
        self, k: int | str, temperature: float, seed: int | None = DECODE_DEFAULTS.seed
    ) -> DecodeConfig:
        """A generation's decode settings under this plan: its lengths, filters and confidence stop, at
        draft length `k`, `temperature` and `seed` (the one place the plan's settings become a config)."""
        return DecodeConfig(
            k=k,
            temperature=temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=seed,
            draft_threshold=self.draft_threshold,
        )

    def samples_at(self, temperature: float) -> int:
        """Samples per prompt at this temperature: one at T = 0 (greedy draws are all the same)."""
        return self.samples if temperature > 0 else 1

    def generation_seed(self, prompt_index: int, sample: int) -> int:
        """The seed of sample `sample` of the set's prompt `prompt_index` (module doc)."""
        return self.seed + SAMPLE_SEED_STRIDE * sample + prompt_index

    @property
    def context_k(self) -> int | str:
        """k used for the prompt-length check of every method, so all methods keep the same prompts."""
        return max(self.ks, key=lambda k: AUTO_MAX_K if k == AUTO_K else k)

    @property
    def forward_ks(self) -> tuple[int, ...]:
        """The k whose (k+1)-token verify is timed in isolation: the plan's, and 1..8 for k = auto (the
        drafts per block it chose are reported and round to one of them on a CPU)."""
        ints = {k for k in self.ks if k != AUTO_K}
        return tuple(sorted(ints | (set(range(1, 9)) if AUTO_K in self.ks else set())))


def quick_plan(plan: BenchPlan) -> BenchPlan:
    """The --quick variant: 2 prompts per set, 32 new tokens, 2 repetitions, short forward timings."""
    return replace(
        plan,
        max_new_tokens=min(plan.max_new_tokens, 32),
        repeats=min(plan.repeats, 2),
        max_prompts=2,
        forward_prompts=1,
        forward_repeats=3,
        quick=True,
    )


def resolve_methods(names: Sequence[str] | None, drafters: Sequence[str]) -> tuple[MethodSpec, ...]:
    """Method names → specs. None = the default set: verifier, hf-generate, self, and with drafters
    hf-assisted plus each drafter. `hf-assisted` uses the drafter named "pretrained" if loaded, else
    the first; `hf-assisted:NAME` picks one (NAME may be "self")."""
    if names is None:
        names = [VERIFIER, HF_GENERATE, SELF, *([HF_ASSISTED] if drafters else []), *drafters]
    return tuple(_resolve(name, list(drafters)) for name in dict.fromkeys(names))


def _resolve(name: str, drafters: list[str]) -> MethodSpec:
    if name == VERIFIER:
        return MethodSpec(VERIFIER, "ours")
    if name == HF_GENERATE:
        return MethodSpec(HF_GENERATE, "hf-generate")
    if name == SELF:
        return MethodSpec(SELF, "ours", SELF)
    if name in drafters:
        return MethodSpec(name, "ours", name)
    base, _, drafter = name.partition(":")
    if base == HF_ASSISTED:
        drafter = drafter or (PRETRAINED if PRETRAINED in drafters else next(iter(drafters), ""))
        if not drafter:
            raise ValueError("hf-assisted needs a drafter: pass --drafter NAME=PATH, or use hf-assisted:self")
        if drafter not in [*drafters, SELF]:
            raise ValueError(f"hf-assisted:{drafter}: no drafter named {drafter!r} is loaded")
        return MethodSpec(f"{HF_ASSISTED}:{drafter}", "hf-assisted", drafter)
    known = [VERIFIER, HF_GENERATE, SELF, HF_ASSISTED, *drafters]
    raise ValueError(f"unknown method {name!r}; known: {', '.join(known)} (drafters come from --drafter)")
