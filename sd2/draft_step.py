"""The drafter's side of decoding: its KV cache, its steering, and how its one-token step runs.

Three kinds behind one interface (`DraftStep`), chosen by `--draft-step` / `$SD2_DRAFT_STEP`:

  eager     the rollback cache of sd2.kv_cache and eager kernels; steering hooks live for one block's
            draft.
  direct    the eager step whose one-token forwards skip transformers' call stack and fuse the linears
            that read one input (sd2.direct_step): the same logits bit for bit, about 30 % less time per
            step on a CPU. The default on a CPU, for the drafters it takes (Llama-shaped); others run
            eagerly.
  compiled  a preallocated `StaticCache` (rolled back by moving its length: stale entries are masked by
            the causal mask and overwritten later) and steering through fixed bias buffers updated in
            place, so every one-token step has the same shapes and tensor addresses. That step runs
            through `torch.compile(mode="reduce-overhead")`, which on CUDA records it as a CUDA graph and
            replays it — batch-1 eager decoding of a 0.6–1 B drafter is launch-bound on a GPU — and on a
            CPU fuses it into generated C++ (no graphs there). Forwards of several tokens (the prompt, a
            block's 2-token first step) stay eager on the same cache. The default on CUDA. One is kept
            per drafter and reused by every request: a new cache or a new hook would make torch.compile
            trace again. The first use compiles (seconds to tens of seconds); the compiler's caches live
            under SD2_HOME (`use_compile_cache`), so a restart, a container's included, reuses them.

Both are exact: the drafter only proposes, and every draft is judged by the verifier's rule on the q the
drafter computed (docs/math.md#acceptance-and-rejection-sampling), so the kernels that computed q never
change the output's law — only how often drafts are accepted, and how fast.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from transformers import StaticCache

from sd2.architecture import decoder_layers, mlp
from sd2.choices import DRAFT_STEP_CHOICES, DRAFT_STEP_ENV
from sd2.kv_cache import rollback_cache
from sd2.paths import sd2_home
from sd2.steering import steered

CAPACITY_QUANTUM = 1024  # a static cache grows in whole multiples of this many tokens (each growth retraces)
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # where torch.compile's inductor keeps code and graphs


class DraftStep(Protocol):
    """The drafter during one request: `start` it on the prompt, then per block `logits` under
    `steering` and `crop_to` the committed length. `length` is how many tokens its cache holds."""

    length: int

    def start(self, prompt_ids: Sequence[int], room: int) -> None:
        """Forward the prompt (unsteered) into an empty cache with space for `room` more tokens."""

    def logits(self, inputs: Sequence[int]) -> torch.Tensor:
        """Feed `inputs` (1 or 2 tokens) and return the next token's logits: [V], or [N] over the
        reduced draft vocabulary when the drafter has one."""

    def steering(self, biases: Mapping[int, torch.Tensor]) -> Iterator[None]:
        """A context manager: inside it, drafter layer l's up_proj output gains biases[l] ([2, F] rows:
        previous and current anchor, the last T of them lining up with the T tokens fed)."""

    def crop_to(self, length: int) -> None:
        """Roll the cache back to its first `length` tokens (a no-op beyond that, but sliding-window
        layers still trim back to their window)."""


def next_logits(model: nn.Module, draft_head: nn.Module | None, ids: torch.Tensor, cache) -> torch.Tensor:
    """One cached forward of ids [1, T]: the last position's logits [V], or [N] through `draft_head`."""
    if draft_head is None:
        return model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    return draft_head(
        model.get_decoder()(input_ids=ids, cache=cache, use_cache=True).last_hidden_state[0, -1]
    )


def _device(model: nn.Module) -> torch.device:
    return model.get_input_embeddings().weight.device


class EagerDraftStep:
    """The drafter on transformers' eager kernels and a dynamic rollback cache (one per request)."""

    def __init__(self, drafter: nn.Module, draft_head: nn.Module | None = None):
        self.model, self.draft_head = drafter, draft_head
        self.cache = rollback_cache(drafter)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def start(self, prompt_ids: Sequence[int], room: int) -> None:
        self.cache = rollback_cache(self.model)
        self.logits(prompt_ids)

    def logits(self, inputs: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(inputs)], device=_device(self.model))  # [1, T]
        return next_logits(self.model, self.draft_head, ids, self.cache)

    def steering(self, biases: Mapping[int, torch.Tensor]):
        return steered(self.model, dict(biases)) if biases else nullcontext()

    def crop_to(self, length: int) -> None:
        self.cache.crop(-max(self.length - length, 0))  # also at 0: sliding-window layers trim


def reduce_overhead(step: Callable) -> Callable:
    """How `CompiledDraftStep` compiles its one-token step (CUDA graphs on CUDA), its caches under
    SD2_HOME."""
    use_compile_cache()
    return torch.compile(step, mode="reduce-overhead", fullgraph=True, dynamic=False)


def use_compile_cache(env: MutableMapping[str, str] | None = None) -> Path:
    """Point torch.compile's caches (inductor's generated code and compiled graphs) at
    SD2_HOME/compile-cache — inductor's default is the temp dir, which a container or a reboot loses —
    unless $TORCHINDUCTOR_CACHE_DIR names another place (inductor itself writes its default there when
    first imported, which counts as unset). Returns the directory."""
    env = os.environ if env is None else env
    if env.get(COMPILE_CACHE_ENV) in (None, "", _inductor_default()):
        env[COMPILE_CACHE_ENV] = str(sd2_home(env) / "compile-cache")
    return Path(env[COMPILE_CACHE_ENV])


def _inductor_default() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch layout: only an unset variable counts as unset
        return None
    return os.path.abspath(default_cache_dir())


class CompiledDraftStep:
    """The drafter on a static cache with a compiled one-token step (CUDA graphs on CUDA).

    Kept per drafter and reused across requests (`start` resets it). While it lives, every decoder
    layer's up_proj carries a hook that adds the step's bias buffer during `steering` and nothing
    otherwise; `close` removes the hooks.
    """

    def __init__(
        self,
        drafter: nn.Module,
        draft_head: nn.Module | None = None,
        compiler: Callable[[Callable], Callable] = reduce_overhead,
    ):
        """`compiler` turns the one-token step into its fast form (tests pass a tracing-only backend)."""
        if any(layer.is_sliding for layer in StaticCache(config=drafter.config, max_cache_len=1).layers):
            raise ValueError(
                "--draft-step compiled does not support sliding-window drafters (their static cache cannot "
                "roll back); use --draft-step eager"
            )
        self.model, self.draft_head = drafter, draft_head
        weight = drafter.get_input_embeddings().weight
        layers = range(len(decoder_layers(drafter)))
        self._bias = {
            layer: torch.zeros(
                2, mlp(drafter, layer).up_proj.out_features, device=weight.device, dtype=weight.dtype
            )
            for layer in layers
        }  # layer → [2, F], written in place by `steering`
        self._steering_on = False
        self._handles = [
            mlp(drafter, layer).up_proj.register_forward_hook(self._hook(layer)) for layer in layers
        ]
        self.cache: StaticCache | None = None
        self.capacity, self.length = 0, 0
        self._compiled = compiler(self._one_token)

    def _hook(self, layer: int) -> Callable:
        bias, owner = self._bias[layer], mlp(self.model, layer).up_proj

        def add_bias(module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor | None:
            # `copy.deepcopy` of the drafter (a training job's copy, an export) copies its hooks too:
            # they must not steer the copy
            if not self._steering_on or module is not owner:
                return None  # output unchanged
            return output + bias[-output.shape[1] :]

        return add_bias

    def _one_token(self, ids: torch.Tensor) -> torch.Tensor:  # ids [1, 1] → [V] or [N]
        return next_logits(self.model, self.draft_head, ids, self.cache)

    def start(self, prompt_ids: Sequence[int], room: int) -> None:
        needed = len(prompt_ids) + room
        if needed > self.capacity:  # grow (rare: the first request, or a longer one than ever before)
            self.capacity = -(-needed // CAPACITY_QUANTUM) * CAPACITY_QUANTUM
            self.cache = StaticCache(config=self.model.config, max_cache_len=self.capacity)
            self.length = 0
        self.crop_to(0)
        self.logits(prompt_ids)

    def logits(self, inputs: Sequence[int]) -> torch.Tensor:
        if self.length + len(inputs) > self.capacity:
            raise RuntimeError(f"draft cache full: {self.length} + {len(inputs)} > {self.capacity} tokens")
        ids = torch.tensor([list(inputs)], device=_device(self.model))  # [1, T]
        if len(inputs) == 1:
            torch.compiler.cudagraph_mark_step_begin()
            out = self._compiled(ids).clone()  # a graph's output buffer is overwritten by its next replay
        else:
            out = next_logits(self.model, self.draft_head, ids, self.cache)
        self.length += len(inputs)
        return out

    @contextmanager
    def steering(self, biases: Mapping[int, torch.Tensor]) -> Iterator[None]:
        if not biases:
            yield
            return
        for layer, buffer in self._bias.items():
            if layer in biases:
                buffer.copy_(biases[layer].to(buffer.dtype).expand_as(buffer))
            else:
                buffer.zero_()
        self._steering_on = True
        try:
            yield
        finally:
            self._steering_on = False

    def crop_to(self, length: int) -> None:
        surplus = self.length - length
        if surplus > 0:
            self.cache.crop(-surplus)
            self.length = length

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def resolve_draft_step(name: str | None, device: torch.device) -> str:
    """--draft-step (or $SD2_DRAFT_STEP when None) → "eager", "direct" or "compiled"; auto = compiled on
    CUDA, direct elsewhere (sd2.direct_step; drafters it does not take run eagerly)."""
    name = (name if name is not None else os.environ.get(DRAFT_STEP_ENV, "auto")).strip().lower()
    if name not in DRAFT_STEP_CHOICES:
        choices = ", ".join(DRAFT_STEP_CHOICES)
        raise ValueError(f"--draft-step must be one of {choices} (or ${DRAFT_STEP_ENV}), got {name!r}")
    if name == "auto":
        return "compiled" if device.type == "cuda" else "direct"
    return name
