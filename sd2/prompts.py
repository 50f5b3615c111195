"""Turning a user prompt or chat history into verifier token ids (the verifier's chat template)."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from sd2.errors import InvalidValue

ROLES = ("system", "user", "assistant")


def validate_messages(messages: Sequence[dict]) -> None:
    """Chat messages: a non-empty list of {role, content} with a known role and non-empty content."""
    if not messages:
        raise InvalidValue("messages", "messages must contain at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise InvalidValue("messages", f"messages[{i}].role must be one of {list(ROLES)}")
        if not isinstance(message.get("content"), str) or not message["content"].strip():
            raise InvalidValue("messages", f"messages[{i}].content must be a non-empty string")


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | None = None,
    messages: Sequence[dict] | None = None,
    chat: bool = True,
) -> list[int]:
    """Token ids of a prompt: chat messages (or a plain prompt as one user turn) through the chat
    template with the generation prompt appended, or the raw prompt text when `chat` is False."""
    if messages is None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidValue("prompt", "prompt must be a non-empty string")
        messages = [{"role": "user", "content": prompt}]
        if not chat or tokenizer.chat_template is None:
            return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    validate_messages(messages)
    if tokenizer.chat_template is None:
        raise InvalidValue("messages", "messages need a chat template; this verifier's tokenizer has none")
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
