"""A stored run in OpenAI's shapes: a completion or chat completion body, or its stream of server-sent
events (docs/interfaces.md#openai-compatible-endpoints).

The two routes differ only in where the text goes (`choices[].text` or `choices[].message` / `delta`),
so each is a `Flavour`; everything else — ids, usage, the `sd2` extension, the event sequence — is
shared. Streamed text is each block's new text, computed from all ids so far (`BlockTexts`), so the
pieces add up to the stored run's text exactly, even when a character spans two blocks.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from sd2.engine import Engine, GenerationResult
from sd2.trace import Block
from service.errors import public_error
from service.openai_errors import error_object
from service.repository import RunRecord
from service.streaming import Item

SSE_MEDIA_TYPE = "text/event-stream"
FINISH_REASONS = {"stop": "stop", "length": "length", "time": "length"}  # OpenAI has no "time"


@dataclass(frozen=True)
class Flavour:
    """How one OpenAI route names its objects and carries text."""

    id_prefix: str  # "cmpl" | "chatcmpl"
    object: str  # of the whole answer
    chunk_object: str  # of each streamed chunk
    chat: bool

    def choice(self, text: str, finish_reason: str) -> dict:
        if self.chat:
            message = {"role": "assistant", "content": text}
            return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def delta(self, text: str | None, finish_reason: str | None = None, role: bool = False) -> dict:
        """A streamed choice: `text` new since the last chunk (None: none); chat opens with the role."""
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        delta = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


COMPLETION = Flavour("cmpl", "text_completion", "text_completion", chat=False)
CHAT = Flavour("chatcmpl", "chat.completion", "chat.completion.chunk", chat=True)


def usage(result: GenerationResult) -> dict:
    completion = len(result.token_ids)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
    }


def sd2_extension(run_id: int, record: RunRecord) -> dict:
    """The `sd2` object of an answer: the stored run's id and what speculative decoding achieved."""
    result = record.result
    metrics = result.metrics
    return {
        "run_id": run_id,
        "status": record.status,
        "method": result.method,
        "steering": result.steering,
        "k": result.config.k,
        "precision": result.precision,
        "finish_reason": result.finish_reason,
        "tau": metrics.tau,
        "acceptance_rate": metrics.acceptance_rate,
        "alpha_hat": metrics.alpha_hat,
        "n_blocks": metrics.n_blocks,
        "tokens_per_s": metrics.tokens_per_s,
    }


def answer(flavour: Flavour, model: str, created: int, run_id: int, record: RunRecord) -> dict:
    """The whole answer to a non-streamed request whose run succeeded."""
    result = record.result
    return {
        "id": f"{flavour.id_prefix}-{run_id}",
        "object": flavour.object,
        "created": created,
        "model": model,
        "choices": [flavour.choice(result.text, FINISH_REASONS[result.finish_reason])],
        "usage": usage(result),
        "sd2": sd2_extension(run_id, record),
    }


def run_error(run_id: int, record: RunRecord) -> dict:
    """The error object of a run that was stored as failed or cancelled, with its id."""
    error = error_object(f"the run {record.status}: {record.error}", 500, code=f"run_{record.status}")
    return {**error, "sd2": {"run_id": run_id, "status": record.status}}


class BlockTexts:
    """Each block's new text, from the text of all ids so far (`Engine.text_of`, under the model lock).
    A trailing U+FFFD is held back: it may be a character whose last byte is in a later block."""

    def __init__(self, engine: Engine):
        self.engine, self.token_ids, self.sent = engine, [], ""

    def __call__(self, block: Block) -> str:
        self.token_ids += [t.token_id for t in block.emitted]
        text = self.engine.text_of(self.token_ids).rstrip("\ufffd")
        if not text.startswith(self.sent):  # an earlier piece changed; the final chunk reconciles
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new


@dataclass
class EventStream:
    """Renders a streamed run's feed items (service.one_run.stream_stored) as server-sent events:
    the role (chat), one chunk per block, a last chunk with `finish_reason` and the `sd2` extension,
    the usage chunk if asked, then `[DONE]`; a run that fails is an `error` event instead."""

    flavour: Flavour
    model: str
    include_usage: bool
    created: int = field(default_factory=lambda: int(time.time()))
    # The run's id is known once it is stored, after its last block, so the chunks share a stream id.
    id: str = field(init=False)
    streamed: str = field(init=False, default="")  # the text sent so far
    opened: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.id = f"{self.flavour.id_prefix}-stream-{uuid.uuid4().hex}"

    def __call__(self, item: Item) -> tuple[str, bool]:
        kind, payload = item
        opening = "" if self.opened or not self.flavour.chat else self._role_chunk()
        self.opened = True
        if kind == "block":
            self.streamed += payload
            return opening + _event(self._chunk(self.flavour.delta(payload))), False
        if kind == "done":
            return opening + self._ending(*payload), True
        return _event({"error": error_object(public_error(payload), 500, code="stream_failed")}), True

    def _role_chunk(self) -> str:
        return _event(self._chunk(self.flavour.delta("", role=True)))

    def _ending(self, run_id: int, record: RunRecord) -> str:
        if record.result is None:
            return _event({"error": run_error(run_id, record)})
        result = record.result
        rest = result.text[len(self.streamed) :] if result.text.startswith(self.streamed) else ""
        last = self.flavour.delta(rest or None, FINISH_REASONS[result.finish_reason])
        events = [_event({**self._chunk(last), "sd2": sd2_extension(run_id, record)})]
        if self.include_usage:
            events.append(_event({**self._chunk(None), "usage": usage(result)}))
        return "".join(events) + "data: [DONE]\n\n"

    def _chunk(self, choice: dict | None) -> dict:
        chunk = {
            "id": self.id,
            "object": self.flavour.chunk_object,
            "created": self.created,
            "model": self.model,
            "choices": [choice] if choice is not None else [],
        }
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI sends it: null on every chunk but the last
        return chunk


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
