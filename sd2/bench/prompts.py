"""Prompt sets: `assets/prompts/<name>.jsonl` files, else a small built-in demo set (labelled as such).

Each JSONL line holds `prompt` (a user message) or `messages` (a chat history; trailing assistant
turns are dropped so the model answers the last user turn), and optionally `id`. Lines with neither
(e.g. a provenance header) are skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sd2.config import DecodeConfig
from sd2.engine import GenerateRequest
from sd2.paths import assets_dir, prompts_dir, repo_relative

DEMO_SET = "demo"
DEMO_SOURCE = "sd2.bench.prompts.DEMO_PROMPTS (built in)"
DEMO_PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Summarize in two sentences: speculative decoding lets a small drafter model propose several "
    "tokens that a large verifier model checks in a single forward pass, so the output is unchanged "
    "while fewer slow verifier steps are needed.",
    "List three tips for writing clear technical documentation.",
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of a set: a plain user message or a chat history."""

    id: str
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None

    def request(self, method: str, decode: DecodeConfig) -> GenerateRequest:
        return GenerateRequest(prompt=self.prompt, messages=self.messages, method=method, decode=decode)


@dataclass(frozen=True)
class PromptSet:
    """A named prompt set and where it came from."""

    name: str
    prompts: tuple[BenchPrompt, ...]
    source: str  # file path (repo-relative inside the repository: sd2.paths.repo_relative), or DEMO_SOURCE
    demo: bool  # True for the built-in demo set: numbers on it are a smoke test, not a benchmark
    n_available: int  # prompts in the source before --max-prompts
    sha256: str | None = None  # of the source file, so a result names the exact prompt version
    n_too_long: int = 0  # prompts skipped because prompt + max_new_tokens + k + 1 exceed the context


def demo_set(max_prompts: int | None = None) -> PromptSet:
    prompts = tuple(BenchPrompt(f"demo-{i}", prompt=p) for i, p in enumerate(DEMO_PROMPTS))
    return PromptSet(DEMO_SET, prompts[:max_prompts], DEMO_SOURCE, True, len(prompts))


def load_prompt_sets(
    directory: Path | None = None, names: Sequence[str] | None = None, max_prompts: int | None = None
) -> list[PromptSet]:
    """The named sets (file stems, or "demo"), or every `*.jsonl` in directory (default: the assets'
    prompts, `sd2.paths`), else the demo set. Named sets without an assets folder: AssetsNotFoundError."""
    if directory is None:
        if assets_dir() is None and not set(names or ()) - {DEMO_SET}:
            if names is None:
                log.warning("no assets folder (set $SD2_ASSETS): using the built-in demo prompts")
            return [demo_set(max_prompts)]
        directory = prompts_dir()
    files = {f.stem: f for f in sorted(directory.glob("*.jsonl"))} if directory.is_dir() else {}
    if names is None:
        if not files:
            log.warning("no prompt files in %s: using the built-in demo prompts (%s)", directory, DEMO_SOURCE)
            return [demo_set(max_prompts)]
        names = list(files)
    sets = []
    for name in names:
        if name == DEMO_SET:
            sets.append(demo_set(max_prompts))
        elif name in files:
            sets.append(read_prompt_file(files[name], max_prompts))
        else:
            raise ValueError(f"unknown prompt set {name!r}; available in {directory}: {[*files, DEMO_SET]}")
    return sets


def read_prompt_file(path: Path, max_prompts: int | None = None) -> PromptSet:
    """Read one JSONL prompt file (fields: module docstring). Text-free lines (an id and a
    `prompt_sha256`, for corpora that may not be redistributed) are rebuilt by sd2.data.prompt_sets."""
    raw = path.read_bytes()
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    if any("prompt_sha256" in r and "prompt" not in r and "messages" not in r for r in rows):
        prompts = _rebuild_text_free(path)
    else:
        parsed = (_parse_line(r, f"{path.stem}-{i}") for i, r in enumerate(rows, start=1))
        prompts = [p for p in parsed if p is not None]
    if not prompts:
        raise ValueError(f"prompt file {path} holds no line with a 'prompt' or 'messages' field")
    origins = list(dict.fromkeys(str(r["source"]) for r in rows if "source" in r))
    if len(origins) > 2:  # many files of one package: name the package and count the files
        origins = [f"{' '.join(origins[0].split()[:2])}, {len(origins)} files"]
    name = repo_relative(path)  # as records name it: "assets/prompts/chat.jsonl" on every machine
    source = f"{name} ({'; '.join(origins)})" if origins else name
    return PromptSet(
        path.stem, tuple(prompts[:max_prompts]), source, False, len(prompts), hashlib.sha256(raw).hexdigest()
    )


def _rebuild_text_free(path: Path) -> list[BenchPrompt]:
    try:
        from sd2.data.prompt_sets import load_prompt_set
    except ImportError as err:
        raise ValueError(f"{path} stores prompt hashes only and sd2.data.prompt_sets is missing") from err
    return [
        BenchPrompt(r.id, messages=tuple(r.messages)) for r in load_prompt_set(path.stem, root=path.parent)
    ]


def _parse_line(record: dict, default_id: str) -> BenchPrompt | None:
    prompt_id = str(record.get("id", default_id))
    if isinstance(record.get("prompt"), str):
        return BenchPrompt(prompt_id, prompt=record["prompt"])
    messages = list(record.get("messages") or [])
    while messages and messages[-1].get("role") == "assistant":
        messages.pop()  # a stored reply: the model must write it, not read it
    if not messages:
        return None
    return BenchPrompt(prompt_id, messages=tuple(messages))
