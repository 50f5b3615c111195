"""The transformers peers: `generate` on the verifier alone, and assisted generation with a drafter.

Both run on the Engine's own verifier object (same weights, dtype and device as ours, but on
transformers' stock kernels rather than sd2.invariant's, as a user of `generate` gets them), on the ids
`Engine.encode` gives (same prompt, same chat template), with the same stop ids and max_new_tokens
and no min_new_tokens, so at T = 0 they emit exactly the same tokens as our loop. Timing follows
`sd2.bench.measure`: wall time around `model.generate`, first token seen by a streamer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

from sd2.bench.measure import GenerationStats, Runner, synchronize
from sd2.bench.plan import SELF, Cell
from sd2.bench.prompts import BenchPrompt
from sd2.config import DecodeConfig
from sd2.engine import Engine
from sd2.invariant import stock_kernels


class TimingStreamer(BaseStreamer):
    """When each `put` arrives and how many tokens it carries: the first is the prompt, each later
    one the tokens a verifier forward emitted."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.sizes: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())
        self.sizes.append(value.numel())

    def end(self) -> None:
        pass


def generation_config(decode: DecodeConfig, stop_ids: frozenset[int], pad_id: int) -> GenerationConfig:
    """HF settings equivalent to `decode`: greedy at T = 0, else sampling with the same filters."""
    common = {
        "max_new_tokens": decode.max_new_tokens,
        "eos_token_id": sorted(stop_ids),
        "pad_token_id": pad_id,
    }
    if decode.warp.greedy:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(
        do_sample=True, temperature=decode.temperature, top_k=decode.top_k, top_p=decode.top_p, **common
    )


DRAFTING_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@contextmanager
def _drafting(assistant: nn.Module, values: dict) -> Iterator[nn.Module]:
    """Set HF's drafting keys on the assistant's own generation_config (where HF reads them), restored
    afterwards."""
    config = assistant.generation_config
    saved = {key: getattr(config, key, None) for key in DRAFTING_KEYS}
    for key, value in values.items():
        setattr(config, key, value)
    try:
        yield assistant
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


def constant_drafting(assistant: nn.Module, k: int):
    """Make HF draft exactly k tokens per block: constant schedule, no confidence early exit."""
    values = dict(zip(DRAFTING_KEYS, (k, "constant", 0.0), strict=True))
    return _drafting(assistant, values)


def hf_default_drafting(assistant: nn.Module):
    """k = auto for hf-assisted: transformers' own default draft schedule and confidence exit (from a
    fresh GenerationConfig, so it follows the installed version)."""
    defaults = GenerationConfig()
    return _drafting(assistant, {key: getattr(defaults, key) for key in DRAFTING_KEYS})


@torch.inference_mode()
def hf_generate(
    model: nn.Module,
    prompt_ids: list[int],
    decode: DecodeConfig,
    stop_ids: frozenset[int],
    pad_id: int,
    assistant: nn.Module | None = None,
) -> GenerationStats:
    """One timed `model.generate` (assisted when `assistant` is given; then drafting k = decode.k)."""
    device = model.get_input_embeddings().weight.device
    input_ids = torch.tensor([prompt_ids], device=device)  # [1, T]
    config = generation_config(decode, stop_ids, pad_id)
    extra = {"assistant_model": assistant} if assistant is not None else {}
    if not decode.warp.greedy:
        torch.manual_seed(decode.seed or 0)  # HF samples from the global generator
    streamer = TimingStreamer()
    synchronize(device)
    start = time.perf_counter()
    output = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        generation_config=config,
        streamer=streamer,
        **extra,
    )
    synchronize(device)
    end = time.perf_counter()
    token_ids = tuple(output[0, len(prompt_ids) :].tolist())  # [N]
    emitted = streamer.sizes[1:]  # tokens per verifier forward; the first put is the prompt
    first = streamer.times[1] if emitted else end
    # τ as sd2.metrics counts it: the last forward, usually cut by EOS or the length limit, is left out
    judged = emitted[:-1] if len(emitted) > 1 else emitted
    return GenerationStats(
        token_ids=token_ids,
        prefill_ms=(first - start) * 1e3,
        wall_ms=(end - start) * 1e3,
        judged_blocks=len(judged),
        judged_tokens=sum(judged),
    )


def hf_runner(engine: Engine, cell: Cell) -> Runner:
    """`hf-generate` (no drafter) or `hf-assisted:<drafter>` at k = cell.k."""
    assistant = None
    if cell.method.runner == "hf-assisted":
        name = cell.method.drafter
        assistant = engine.verifier if name == SELF else engine.drafters[name].model
    pad_id = engine.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else min(engine.stop_ids)

    def run(prompt: BenchPrompt, decode: DecodeConfig) -> GenerationStats:
        prompt_ids = engine.encode(prompt.request("verifier", decode))
        with stock_kernels(engine.verifier):  # the peers as users run them: transformers' own kernels
            if assistant is None:
                return hf_generate(engine.verifier, prompt_ids, decode, engine.stop_ids, pad_id)
            drafting = (
                hf_default_drafting(assistant) if decode.auto_k else constant_drafting(assistant, decode.k)
            )
            with drafting:
                return hf_generate(engine.verifier, prompt_ids, decode, engine.stop_ids, pad_id, assistant)

    return run
