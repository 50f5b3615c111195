"""Python documentation paragraphs (Debian `python3.11-doc` reST sources) as text and summarisation prompts.

Only prose is kept: top-level paragraphs that are not headings, directives, comments, lists, tables
or code (indented blocks). Inline reST roles are reduced to their visible text so the model sees
what a reader sees: ":func:`json.dumps`" → "json.dumps", "``x``" → "x".
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sd2.data.records import Conversation, CorpusMissingError, Provenance

PACKAGE = "python3.11-doc"
SOURCES = Path("/usr/share/doc/python3.11/html/_sources")
SUMMARIZE_TEMPLATE = "Summarize the following documentation paragraph:\n\n{paragraph}"
EXPLAIN_TEMPLATE = (
    "Explain the following passage from the Python documentation in plain words, with an example "
    "where it helps:\n\n{paragraph}"
)
_ROLE = re.compile(r":[\w:+-]+:`([^`]+)`")  # :role:`text <target>` → text, :role:`~a.b` → a.b
_ESCAPE = re.compile(r"\\([*_`|\\ ])")  # reST escapes: "char\\*" → "char*"; "\\n" in code stays
_TARGET = re.compile(r"^(.+?)\s+<[^<>]+>$")
_LITERAL = re.compile(r"``([^`]+)``")
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`_{1,2}")  # `text <url>`_ → text
_REF = re.compile(r"`([^`]+)`_{1,2}|\*\*([^*]+)\*\*|(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])")
_HEADING = re.compile(r"^([=\-~^*#\"'`+.:_])\1{2,}\s*$")
_LIST_OR_TABLE = re.compile(r"^(\s*[-*+|]\s|\s*#\.\s|\s*\d+[.)]\s|\s*\(\w\)\s|\+[-=+]+\+|=+\s+=+)")


@dataclass(frozen=True)
class ParagraphRule:
    """Which paragraphs count as prose worth summarising (or training on)."""

    min_chars: int = 300  # shorter paragraphs are mostly one-liners: nothing to summarise
    max_chars: int = 1500  # ≈350 tokens: the prompt plus a summary stays well inside 512 tokens
    min_words: int = 50  # guards against long identifiers or URLs passing min_chars


def docs_version() -> str:
    """The installed Debian package version (dpkg), or "unknown" where dpkg is unavailable."""
    try:
        result = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", PACKAGE],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() or "unknown"


def docs_files(root: Path = SOURCES) -> list[Path]:
    """Every reST source file, sorted; CorpusMissingError names the Debian package when absent."""
    files = sorted(root.rglob("*.rst.txt")) if root.is_dir() else []
    if not files:
        raise CorpusMissingError(
            f"the Python-docs corpus needs the Debian package {PACKAGE} (reST under {root}): "
            f"apt-get update && apt-get install -y {PACKAGE}"
        )
    return files


def plain_text(text: str) -> str:
    """Inline reST markup reduced to its visible text, whitespace collapsed."""
    text = _LINK.sub(r"\1", text)
    text = _ROLE.sub(_role_text, text)
    text = _LITERAL.sub(r"\1", text)
    text = _REF.sub(lambda m: next(g for g in m.groups() if g is not None), text)
    text = " ".join(_ESCAPE.sub(r"\1", text).split())
    return text[:-2] + ":" if text.endswith("::") else text


def _role_text(match: re.Match) -> str:
    content = match.group(1).strip().lstrip("~!")
    target = _TARGET.match(content)
    return target.group(1) if target else content


def _is_prose(lines: list[str]) -> bool:
    first = lines[0]
    if first[:1].isspace() or first.startswith(".."):
        return False  # indented = code, quote or directive body; ".." = directive, comment, target
    if any(_HEADING.match(line) for line in lines) or any(_LIST_OR_TABLE.match(line) for line in lines):
        return False
    return not any(line.lstrip().startswith((">>>", "...", ".. ")) for line in lines)


def paragraphs(text: str, rule: ParagraphRule = ParagraphRule()) -> Iterator[str]:
    """Prose paragraphs of one reST document, as plain text, in document order."""
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.split("\n") if line.strip()]
        if not lines or not _is_prose(lines):
            continue
        paragraph = plain_text(" ".join(lines))
        if rule.min_chars <= len(paragraph) <= rule.max_chars and len(paragraph.split()) >= rule.min_words:
            yield paragraph


def docs_paragraphs(
    root: Path = SOURCES, rule: ParagraphRule = ParagraphRule(), template: str = SUMMARIZE_TEMPLATE
) -> Iterator[Conversation]:
    """Every prose paragraph as a one-turn prompt (`template`: summarise by default, or
    EXPLAIN_TEMPLATE); a document is one split unit, whatever the template."""
    files = docs_files(root)
    provenance_version = docs_version() if root == SOURCES else "unversioned"
    for path in files:
        relative = path.relative_to(root).as_posix()
        provenance = Provenance(
            "pydocs", PACKAGE if root == SOURCES else "local dir", provenance_version, relative
        )
        for index, paragraph in enumerate(
            paragraphs(path.read_text(encoding="utf-8", errors="replace"), rule)
        ):
            yield Conversation(
                f"{relative}#{index}",
                ({"role": "user", "content": template.format(paragraph=paragraph)},),
                provenance,
                group=relative,
                meta={"paragraph": paragraph},
            )


def docs_documents(root: Path = SOURCES) -> Iterator[tuple[str, str]]:
    """(relative path, prose text) per document, paragraphs of any length joined by blank lines:
    plain text for next-token pretraining, split by the same document key as the prompts."""
    loose = ParagraphRule(min_chars=1, max_chars=10**9, min_words=1)
    for path in docs_files(root):
        text = "\n\n".join(paragraphs(path.read_text(encoding="utf-8", errors="replace"), loose))
        if text:
            yield path.relative_to(root).as_posix(), text
