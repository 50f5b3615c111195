"""Training examples as token ids: a chat-templated prompt and the response the drafter learns.

The prompt is never truncated (a left-cut would drop the chat header the verifier conditions on); the
response may be cut on the right when packing (`shards`). The response ends with the end-of-turn
token whenever the speaker stopped, so the drafter also learns when to stop.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from sd2.data.records import Conversation
from sd2.prompts import encode_prompt

END_OF_TURN = "<|im_end|>"  # ChatML; other templates fall back to the tokenizer's eos


@dataclass(frozen=True)
class Example:
    """One training sequence: loss on `response_ids` only (all of it when `prompt_ids` is empty)."""

    id: str  # the conversation (or document window) it came from, for provenance and leak checks
    prompt_ids: tuple[int, ...]  # chat-templated prompt incl. the assistant header; empty for plain text
    response_ids: tuple[int, ...]  # the tokens to learn, ending with end-of-turn when the reply finished


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The token that closes an assistant turn (ChatML `<|im_end|>`, else eos)."""
    token_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
        return token_id
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has neither <|im_end|> nor an eos token to end a turn with")
    return tokenizer.eos_token_id


def synth_examples(path: Path) -> Iterator[Example]:
    """Examples from a `sd2 data synth` JSONL file, or its gzipped export `*.jsonl.gz` (ids stored
    exactly as the verifier produced them)."""
    opener = gzip.open if Path(path).suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as stream:
        for line in stream:
            if line.strip():
                row = json.loads(line)
                yield Example(row["id"], tuple(row["prompt_ids"]), tuple(row["response_ids"]))


def conversation_examples(
    conversations: Iterable[Conversation], tokenizer: PreTrainedTokenizerBase
) -> Iterator[Example]:
    """Teacher-forced corpus text: the opening user turn as prompt, the first reply as response."""
    eot = end_of_turn_id(tokenizer)
    for conv in conversations:
        prompt = conv.first_user_turn()
        reply = next((m["content"] for m in conv.messages if m["role"] == "assistant"), None)
        if prompt is None or reply is None:
            continue
        prompt_ids = encode_prompt(tokenizer, messages=[{"role": "user", "content": prompt}])
        reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
        yield Example(conv.id, tuple(prompt_ids), (*reply_ids, eot))


def turn_examples(
    conversations: Iterable[Conversation], tokenizer: PreTrainedTokenizerBase, window: int
) -> Iterator[Example]:
    """Every assistant turn of the corpus (not only the first): its user turn as the prompt and as
    much of the reply as fits in `window`; the rest of a long reply as plain-text windows.

    A reply whose prompt leaves no room (a pasted wall of text) is learned as plain text only, so no
    recorded reply is lost — ≈ 15× the tokens of `conversation_examples` on ShareGPT.
    """
    eot = end_of_turn_id(tokenizer)
    for conv in conversations:
        for index, (asked, reply) in enumerate(user_reply_pairs(conv.messages)):
            reply_ids = (*tokenizer(reply, add_special_tokens=False)["input_ids"], eot)
            prompt_ids = tuple(encode_prompt(tokenizer, messages=[{"role": "user", "content": asked}]))
            room = window - len(prompt_ids) if len(prompt_ids) < window // 2 else 0
            if room:
                yield Example(f"{conv.id}#{index}", prompt_ids, reply_ids[:room])
            for part, start in enumerate(range(room, len(reply_ids), window)):
                yield Example(f"{conv.id}#{index}@{part}", (), reply_ids[start : start + window])


def user_reply_pairs(messages) -> Iterator[tuple[str, str]]:
    """(user turn, the assistant turn right after it) for every such pair, in order."""
    for asked, answered in itertools.pairwise(messages):
        if asked["role"] == "user" and answered["role"] == "assistant" and answered["content"].strip():
            yield asked["content"], answered["content"]


def text_examples(
    documents: Iterable[tuple[str, str]], tokenizer: PreTrainedTokenizerBase, window: int
) -> Iterator[Example]:
    """Plain text (pretraining) cut into windows of at most `window` tokens, every token learned."""
    for doc_id, text in documents:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for index, start in enumerate(range(0, len(ids), window)):
            yield Example(f"{doc_id}@{index}", (), tuple(ids[start : start + window]))
