"""Synthetic training data: the verifier answers prompts, so the drafter learns the verifier's own outputs.

Batched HF `generate` with left padding. Sampling is pure: temperature as given, top_p = 1 and
top_k = 0 set explicitly (the paper inherited the model's top_p/top_k, so its "T = 1" data were not).
Batches are cut from groups of `sort_batches` · B consecutive prompts sorted by prompt length (stable),
so a batch's rows need little left padding, while a cut-short run still covers the prompts' order.
Resumable: each batch is appended to a JSONL file in one write and fsynced; a rerun skips ids already
there. Deterministic: the batches are a function of the prompt list and the config alone, and each is
sampled under a seed derived from (seed, its ids), so an interrupted-and-resumed run writes exactly what
an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerBase

from sd2.data.atomic import write_text
from sd2.data.records import Conversation
from sd2.prompts import encode_prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SynthConfig:
    """How the verifier answers. Recorded next to the output; a resume must use the same values."""

    max_new_tokens: int = 256  # response budget; rows that hit it are marked finish_reason "length"
    temperature: float = 1.0  # 1 = the verifier's own distribution (the paper's choice); 0 = greedy
    batch_size: int = 128  # rows per generate call (bf16 on a 2-core CPU: 1.8× the answers/h of 16)
    seed: int = 0  # with the prompt ids, fixes every sample
    max_prompt_tokens: int = 256  # longer prompts are skipped, never truncated (a left-cut loses the header)
    sort_batches: int = (
        16  # batches cut from groups of this many · batch_size length-sorted prompts; 0 = as given
    )
    # At most this many rows × (longest prompt + max_new_tokens) tokens per batch (0: no limit), so long
    # prompts (`--turns all` contexts) run in fewer rows instead of running out of memory.
    max_batch_tokens: int = 128 * 512

    def __post_init__(self):
        for name in ("max_new_tokens", "batch_size", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("temperature", "sort_batches", "max_batch_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")


# Settings added after files were first written, with the value those older files implied: recorded
# only when they differ from it, so an older file still resumes when they are set that way.
IMPLIED_BY_OLDER_FILES = {
    "sort_batches": 0,
    "max_batch_tokens": 0,
    "turns": "first",
    "samples": 1,
    "precision": "fp32",
}


def recorded_settings(settings: dict) -> dict:
    """The settings written beside an output: `settings` less those an older file implies."""
    return {k: v for k, v in settings.items() if IMPLIED_BY_OLDER_FILES.get(k, object()) != v}


@dataclass(frozen=True)
class SynthPrompt:
    """A prompt to answer: the conversation id and its chat-templated ids (with the assistant header)."""

    id: str
    prompt_ids: tuple[int, ...]


TURNS = ("first", "all", "later")  # which user turns become prompts


def synth_prompts(
    conversations: Iterable[Conversation],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_tokens: int,
    turns: str = "first",
    samples: int = 1,
) -> list[SynthPrompt]:
    """Chat-templated prompts from conversations; too-long prompts are skipped, never truncated.

    `turns="first"`: the opening user turn of each conversation (id = the conversation's id).
    `turns="all"`: every user turn with the conversation so far as its context — the recorded earlier
    turns, replies included — so the verifier answers where the recorded speaker did (id
    "<conversation>@<message index>"; the opening turn keeps the bare id, so "first" files stay a
    subset). `turns="later"`: the turns of "all" except the opening one, so a "later" file and a
    "first" file of one split answer disjoint prompts. `samples` > 1 repeats each prompt under ids
    "<id>~<j>", j = 0..samples-1, for several sampled answers per prompt (each row of a batch draws its
    own sample).
    """
    if turns not in TURNS:
        raise ValueError(f"turns must be one of {TURNS}, got {turns!r}")
    if samples < 1:
        raise ValueError(f"samples must be ≥ 1, got {samples}")
    prompts, skipped = [], 0
    for conv in conversations:
        for prompt_id, messages in _prompt_turns(conv, turns):
            ids = encode_prompt(tokenizer, messages=messages)
            if len(ids) > max_prompt_tokens:
                skipped += 1
                continue
            if samples == 1:
                prompts.append(SynthPrompt(prompt_id, tuple(ids)))
            else:
                prompts.extend(SynthPrompt(f"{prompt_id}~{j}", tuple(ids)) for j in range(samples))
    log.info(
        "synth: %d prompts (%s user turns, %d sample(s) each), %d skipped as longer than %d tokens",
        len(prompts),
        turns,
        samples,
        skipped,
        max_prompt_tokens,
    )
    return prompts


def _prompt_turns(conv: Conversation, turns: str) -> Iterable[tuple[str, list[dict]]]:
    """(prompt id, messages up to and including a user turn) for the turns asked for."""
    if turns == "first":
        text = conv.first_user_turn()
        if text is not None:
            yield conv.id, [{"role": "user", "content": text}]
        return
    opening = next((i for i, m in enumerate(conv.messages) if m["role"] != "system"), None)
    for index, message in enumerate(conv.messages):
        if message["role"] == "user" and not (turns == "later" and index == opening):
            prompt_id = conv.id if index == opening else f"{conv.id}@{index}"
            yield prompt_id, [dict(m) for m in conv.messages[: index + 1]]


def prompt_window(prompts: Sequence[SynthPrompt], skip: int, limit: int | None) -> list[SynthPrompt]:
    """prompts[skip : skip + limit] (limit None = to the end), so files can cover disjoint stretches."""
    for flag, value in (("skip", skip), ("limit", limit)):
        if value is not None and value < 0:
            raise ValueError(f"{flag} must be ≥ 0, got {value}")
    if skip and skip >= len(prompts):
        raise ValueError(f"skip {skip} leaves nothing: there are only {len(prompts)} prompts")
    return list(prompts[skip : None if limit is None else skip + limit])


def plan_batches(prompts: Sequence[SynthPrompt], config: SynthConfig) -> list[list[SynthPrompt]]:
    """The batches in the order they run: each group of sort_batches · batch_size consecutive prompts
    sorted by prompt length (ties keep their order; sort_batches 0 = as given), then cut into batches
    of at most batch_size rows and max_batch_tokens tokens (a prompt too long for it runs alone)."""
    ordered = list(prompts)
    if config.sort_batches:
        group = config.sort_batches * config.batch_size
        ordered = [
            p
            for start in range(0, len(ordered), group)
            for p in sorted(ordered[start : start + group], key=lambda p: len(p.prompt_ids))
        ]
    batches, batch, width = [], [], 0
    for prompt in ordered:
        wider = max(width, len(prompt.prompt_ids))
        tokens = (len(batch) + 1) * (wider + config.max_new_tokens)
        full = len(batch) == config.batch_size or (
            config.max_batch_tokens and tokens > config.max_batch_tokens
        )
        if batch and full:
            batches.append(batch)
            batch, wider = [], len(prompt.prompt_ids)
        batch.append(prompt)
        width = wider
    return batches + ([batch] if batch else [])


def generation_config(config: SynthConfig, stop_ids: Sequence[int], pad_id: int) -> GenerationConfig:
    """Every logits processor set explicitly to its neutral value, so nothing is inherited from the model."""
    sampling = config.temperature > 0
    return GenerationConfig(
        do_sample=sampling,
        temperature=config.temperature if sampling else 1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        max_new_tokens=config.max_new_tokens,
        min_new_tokens=0,
        eos_token_id=list(stop_ids),
        pad_token_id=pad_id,
        num_beams=1,
    )


def batch_seed(seed: int, ids: Sequence[str]) -> int:
    return int.from_bytes(hashlib.sha256(json.dumps([seed, *ids]).encode()).digest()[:8], "big") % 2**63


def generate_batch(
    model: nn.Module, prompts: Sequence[SynthPrompt], gen_config: GenerationConfig, seed: int
) -> list[list[int]]:
    """Answer a batch (left-padded); each answer cut after its first stop token."""
    device = next(model.parameters()).device
    width = max(len(p.prompt_ids) for p in prompts)
    pad_id = gen_config.pad_token_id
    input_ids = torch.tensor(
        [[pad_id] * (width - len(p.prompt_ids)) + list(p.prompt_ids) for p in prompts], device=device
    )  # [B, T]
    attention_mask = torch.tensor(
        [[0] * (width - len(p.prompt_ids)) + [1] * len(p.prompt_ids) for p in prompts], device=device
    )  # [B, T]
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():  # seed locally, leave global RNG alone
        torch.manual_seed(batch_seed(seed, [p.id for p in prompts]))
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=gen_config)
    new_tokens = out[:, width:].tolist()  # [B, ≤ max_new_tokens]
    stops = set(gen_config.eos_token_id)
    return [_cut_at_stop(row, stops) for row in new_tokens]


def _cut_at_stop(tokens: list[int], stops: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    return tokens


def done_ids(path: Path) -> set[str]:
    """Ids already answered in `path`; a torn last line (crash mid-write) is cut off the file first."""
    if not path.is_file():
        return set()
    data = path.read_bytes()
    good = data.rfind(b"\n") + 1
    if good < len(data):
        log.warning("synth: dropping a torn last line (%d bytes) from %s", len(data) - good, path)
        with open(path, "rb+") as handle:
            handle.truncate(good)
    return {json.loads(line)["id"] for line in data[:good].decode("utf-8").splitlines() if line.strip()}


def meta_path(out: Path) -> Path:
    """Where a synth file's settings (verifier, source, split, generation config) are written. A gzipped
    export (`x.jsonl.gz`) shares the settings of the file it was made from (`x.jsonl.meta.json`), so
    `gunzip -k` beside it gives a file `sd2 data synth` can resume."""
    name = Path(out).name.removesuffix(".gz")
    return Path(out).with_name(name + ".meta.json")


def check_meta(out: Path, meta: dict) -> None:
    """Write the run's settings next to the output, or refuse to resume a run made with other settings."""
    settings = meta_path(out)
    if settings.is_file():
        previous = json.loads(settings.read_text())
        if previous != meta:
            changed = sorted(k for k in meta.keys() | previous.keys() if meta.get(k) != previous.get(k))
            raise ValueError(
                f"{out} was generated with other settings ({', '.join(changed)} differ): "
                "use a new --out file or the same settings"
            )
        return
    write_text(settings, json.dumps(meta, indent=1, sort_keys=True) + "\n")


def run_synth(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[SynthPrompt],
    out: Path,
    config: SynthConfig,
    stop_ids: Iterable[int],
    meta: dict | None = None,
    max_batches: int | None = None,
    progress: bool = True,
) -> int:
    """Answer every prompt not yet in `out`, appending one batch at a time; return rows written now."""
    out.parent.mkdir(parents=True, exist_ok=True)
    check_meta(out, recorded_settings({**asdict(config), **(meta or {})}))
    done = done_ids(out)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    gen_config = generation_config(config, sorted(stop_ids), pad_id)
    batches = plan_batches(prompts, config)
    pending = [b for b in batches if any(p.id not in done for p in b)]
    written = tokens = 0
    started = time.perf_counter()
    bar = tqdm(
        total=len(prompts),
        initial=len(prompts) - sum(len(b) for b in pending),
        disable=not progress,
        desc="synth",
        unit="prompt",
    )
    with bar, open(out, "a", encoding="utf-8") as sink:
        for batch in pending[:max_batches]:
            # 1. answer the whole batch (its composition fixes the samples), 2. append the new rows, 3. fsync
            answers = generate_batch(model, batch, gen_config, config.seed)
            rows = [
                _row(p, a, gen_config, tokenizer)
                for p, a in zip(batch, answers, strict=True)
                if p.id not in done
            ]
            sink.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            sink.flush()
            os.fsync(sink.fileno())
            written += len(rows)
            tokens += sum(len(r["response_ids"]) for r in rows)
            bar.update(len(batch))
            bar.set_postfix_str(_rate(written, tokens, time.perf_counter() - started), refresh=False)
    if written:
        log.info(
            "synth: %d answers, %s → %s", written, _rate(written, tokens, time.perf_counter() - started), out
        )
    return written


def _rate(answers: int, tokens: int, seconds: float) -> str:
    seconds = max(seconds, 1e-9)
    return f"{answers / seconds * 3600:.0f} answers/h, {tokens / seconds:.0f} tok/s"


def _row(
    prompt: SynthPrompt, answer: list[int], gen_config: GenerationConfig, tokenizer: PreTrainedTokenizerBase
) -> dict:
    stopped = bool(answer) and answer[-1] in set(gen_config.eos_token_id)
    return {
        "id": prompt.id,
        "prompt_ids": list(prompt.prompt_ids),
        "response_ids": answer,
        "finish_reason": "stop" if stopped else "length",
        "response": tokenizer.decode(answer, skip_special_tokens=True),
    }
