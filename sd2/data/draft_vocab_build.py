"""`sd2 data draft-vocab`: rank tokens by how often the verifier emits them, and store the top N with
drafters (sd2.draft_vocab).

Counts come first from the verifier's own answers to training prompts (`sd2 data synth` files); tokens
they never show are ranked after them by their frequency in the recorded replies of the training split
(ShareGPT), so any N is filled. Held-out prompts and their replies are never counted.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from sd2.draft_vocab import DraftVocab

log = logging.getLogger(__name__)


def synth_answers(paths: Sequence[Path]) -> Iterator[list[int]]:
    """The response ids of every row of `sd2 data synth` JSONL files."""
    for path in paths:
        with Path(path).open() as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)["response_ids"]


def recorded_replies(tokenizer, limit: int) -> Iterator[list[int]]:
    """Token ids of the assistant turns of the first `limit` training-split ShareGPT conversations."""
    from sd2.data.sharegpt import sharegpt_conversations
    from sd2.data.split import train_only

    for conversation in train_only(sharegpt_conversations())[:limit]:
        for message in conversation.messages:
            if message["role"] == "assistant":
                yield tokenizer.encode(message["content"], add_special_tokens=False)


def ranked_vocab(
    answers: Iterable[Sequence[int]],
    fallback: Iterable[Sequence[int]],
    size: int,
    always: Iterable[int],
    source: str,
) -> DraftVocab:
    """`always` first, then tokens by their count in `answers`, then unseen ones by their `fallback` count.
    The coverage is measured on `answers` (the verifier's own output)."""
    answers = [list(a) for a in answers]
    primary = Counter(t for a in answers for t in a)
    secondary = Counter(t for f in fallback for t in f)
    forced = list(dict.fromkeys(always))
    by_answers = sorted(primary, key=lambda t: (-primary[t], t))
    by_corpus = sorted((t for t in secondary if t not in primary), key=lambda t: (-secondary[t], t))
    kept = list(dict.fromkeys([*forced, *by_answers, *by_corpus]))[:size]
    if len(kept) < size:
        raise ValueError(f"only {len(kept)} distinct tokens were seen; choose a size ≤ {len(kept)}")
    total = sum(primary.values())
    coverage = sum(primary[t] for t in kept) / total if total else None
    return DraftVocab(tuple(kept), source=source, coverage=coverage, extra={"answers_tokens": total})
