"""Request and response models of the OpenAI-compatible routes (/v1/models, /v1/completions,
/v1/chat/completions), separate from the house API's `service.schemas`.

A request holds OpenAI's fields plus the SD² ones as extensions (what the `openai` client sends with
`extra_body`): the decode knobs of `DecodeKnobs` under the names and defaults /generate uses — so
temperature defaults to 0 (greedy), not OpenAI's 1 — and `method`, `prompt_set`. OpenAI fields sd2
cannot honour are refused by name (code `unsupported`) unless they hold a value that changes nothing
(`n: 1`, `stop: null`, `presence_penalty: 0`, …); fields OpenAI does not define are refused too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from sd2.config import DECODE_DEFAULTS
from sd2.engine import VERIFIER_METHOD
from service.errors import FieldError
from service.schemas import TOKENS_CAP, DecodeKnobs, DecodeSettings, ErrorItem, Message, Name, PromptText


def _refused(why: str):
    """A validator for an OpenAI field sd2 cannot honour: the values its annotation allows (the ones
    that change nothing) pass; any other is refused with `why`, not silently ignored."""

    def check(value: Any, handler):
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("unsupported", "not supported by sd2: {why}", {"why": why}) from None

    return WrapValidator(check)


ONE = Annotated[int, Field(ge=1, le=1)]
ZERO = Annotated[float, Field(ge=0, le=0)]
EMPTY_LIST = Annotated[list[Any], Field(max_length=0)]
MaxTokens = Annotated[int, Field(ge=1, le=TOKENS_CAP, description="capped by SD2_MAX_NEW_TOKENS")]

N = Annotated[ONE | None, _refused("one choice per request (each choice would be a run of its own)")]
Stop = Annotated[
    EMPTY_LIST | None, _refused("stop sequences; the verifier stops at its own stop token (use max_tokens)")
]
Penalty = Annotated[ZERO | None, _refused("presence and frequency penalties (only 0)")]
LogitBias = Annotated[
    Annotated[dict[str, float], Field(max_length=0)] | None, _refused("logit_bias (only {})")
]
Tools = Annotated[EMPTY_LIST | None, _refused("tools and functions")]
ToolChoice = Annotated[Literal["none"] | None, _refused('tool calls (tool_choice: "none" only)')]


def _one_prompt_string(value: Any) -> Any:
    if isinstance(value, list):
        raise PydanticCustomError(
            "unsupported", "not supported by sd2: a list of prompts or token ids; send one string (one run)"
        )
    return value


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool = Field(False, description="a last chunk with `usage` (and `choices: []`)")


class TextFormat(BaseModel):
    """The only response format sd2 produces: plain text."""

    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text"]


ResponseFormat = Annotated[TextFormat | None, _refused('response formats other than {"type": "text"}')]


class OpenAIRequest(DecodeKnobs):
    """What /v1/completions and /v1/chat/completions share: OpenAI's fields, the SD² extensions."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str = Field(min_length=1, max_length=1_000, description="an id from GET /v1/models (the verifier)")
    method: Name = Field(VERIFIER_METHOD, description="SD² extension: verifier, self, or a drafter name")
    prompt_set: Name | None = Field(None, description="SD² extension: a label to aggregate runs by in /stats")
    stream: bool = Field(False, description="server-sent events: a chunk per decoded block, then `[DONE]`")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=1_000, description="accepted, not used")
    n: N = None
    stop: Stop = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    logit_bias: LogitBias = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def max_tokens_field(self) -> str:
        """The name this request gives the length limit (/generate's max_new_tokens)."""
        return "max_tokens"

    def _decode_settings(self, max_tokens: int | None, **prompt: Any) -> DecodeSettings:
        """The /generate settings this request means; its values are already validated by the same types."""
        knobs = {name: getattr(self, name) for name in DecodeKnobs.model_fields}
        return DecodeSettings.model_construct(
            **knobs,
            max_new_tokens=DECODE_DEFAULTS.max_new_tokens if max_tokens is None else max_tokens,
            prompt_set=self.prompt_set,
            **prompt,
        )


class CompletionIn(OpenAIRequest):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        json_schema_extra={
            "examples": [{"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "prompt": "The sky is", "k": 4}]
        },
    )

    prompt: Annotated[PromptText, BeforeValidator(_one_prompt_string)] = Field(examples=["The sky is"])
    max_tokens: MaxTokens | None = Field(None, description=f"default {DECODE_DEFAULTS.max_new_tokens}")
    chat: bool = Field(
        False, description="SD² extension: format the prompt with the verifier's chat template (default: no)"
    )
    logprobs: Annotated[None, _refused("logprobs")] = None
    echo: Annotated[Literal[False] | None, _refused("echo")] = None
    best_of: Annotated[ONE | None, _refused("best_of (only 1)")] = None
    suffix: Annotated[None, _refused("suffix (insertion)")] = None

    def decode_settings(self) -> DecodeSettings:
        return self._decode_settings(self.max_tokens, prompt=self.prompt, chat=self.chat)


TEXT_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string", "minLength": 1}},
    "required": ["type", "text"],
    "additionalProperties": False,
}

TEXT_PARTS = {"type": "array", "minItems": 1, "items": TEXT_PART}


def _joined_text_parts(value: Any) -> Any:
    """OpenAI's content parts as the one string they mean; only text parts are supported."""
    if not isinstance(value, list):
        return value
    texts = []
    for i, part in enumerate(value):
        if not (isinstance(part, dict) and set(part) == {"type", "text"} and part["type"] == "text"):
            raise PydanticCustomError(
                "unsupported",
                'not supported by sd2: content part {i}; only parts of type "text"',
                {"i": i},
            )
        if not (isinstance(part["text"], str) and part["text"]):
            message = "content part {i}: text must be a non-empty string"
            raise PydanticCustomError("string_type", message, {"i": i})
        texts.append(part["text"])
    return "".join(texts)


# A message's content: a string, or text parts joined into one (checked as one PromptText).
Content = Annotated[
    PromptText,
    BeforeValidator(_joined_text_parts),
    WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1}, TEXT_PARTS]}),
]


class ChatMessageIn(BaseModel):
    """An OpenAI chat message with text content; "developer" is the verifier's "system"."""

    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: Content

    def as_message(self) -> Message:
        role = "system" if self.role == "developer" else self.role
        return Message.model_construct(role=role, content=self.content)  # the server's limits come later


class ChatCompletionIn(OpenAIRequest):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                    "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                    "method": "sd2",
                    "k": 4,
                    "stream": True,
                }
            ]
        },
    )

    messages: list[ChatMessageIn] = Field(min_length=1, max_length=256)
    max_completion_tokens: MaxTokens | None = Field(
        None, description=f"default {DECODE_DEFAULTS.max_new_tokens}"
    )
    max_tokens: MaxTokens | None = Field(None, description="the older name of max_completion_tokens")
    logprobs: Annotated[Literal[False] | None, _refused("logprobs")] = None
    top_logprobs: Annotated[Annotated[int, Field(ge=0, le=0)] | None, _refused("top_logprobs")] = None
    tools: Tools = None
    functions: Tools = None
    tool_choice: ToolChoice = None
    function_call: ToolChoice = None
    parallel_tool_calls: bool | None = Field(None, description="accepted, not used (no tools)")
    response_format: ResponseFormat = None

    @property
    def max_tokens_field(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def decode_settings(self) -> DecodeSettings:
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if self.max_tokens not in (None, max_tokens):
            raise FieldError("max_completion_tokens", "give max_completion_tokens or max_tokens, not both")
        return self._decode_settings(max_tokens, messages=[m.as_message() for m in self.messages], chat=True)


# Responses. Only what OpenAI clients read, plus the `sd2` extension object.

FinishReason = Literal["stop", "length"]


class Sd2RunOut(BaseModel):
    """The SD² extension of a response: the stored run and its acceptance (docs/metrics.md)."""

    run_id: int = Field(description="GET /runs/{run_id} has its trace")
    status: Literal["succeeded"]
    method: str
    steering: bool
    k: int | Literal["auto"]
    precision: str = Field(description='device and precision it ran in, e.g. "cpu/bf16"')
    finish_reason: Literal["stop", "length", "time"] = Field(
        description='sd2\'s own: "time" (the server\'s time budget ran out) is "length" in `choices`'
    )
    tau: float | None
    acceptance_rate: float | None
    alpha_hat: float | None
    n_blocks: int
    tokens_per_s: float | None


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoiceOut(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: FinishReason


class CompletionOut(BaseModel):
    id: str = Field(description='"cmpl-<run_id>"')
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoiceOut]
    usage: UsageOut
    sd2: Sd2RunOut


class AssistantMessageOut(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoiceOut(BaseModel):
    index: int
    message: AssistantMessageOut
    logprobs: None
    finish_reason: FinishReason


class ChatCompletionOut(BaseModel):
    id: str = Field(description='"chatcmpl-<run_id>"')
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoiceOut]
    usage: UsageOut
    sd2: Sd2RunOut


class ModelSd2Out(BaseModel):
    methods: list[str] = Field(description="the `method` values this server decodes with (loaded now)")
    default_method: str
    device: str = Field(description='device and precision, e.g. "cpu/bf16"')


class ModelOut(BaseModel):
    id: str = Field(description="the verifier: every method's output is the verifier's")
    object: Literal["model"]
    created: int
    owned_by: str
    sd2: ModelSd2Out


class ModelListOut(BaseModel):
    object: Literal["list"]
    data: list[ModelOut]


class OpenAIErrorBody(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error")
    param: str | None = Field(description='the field, e.g. "temperature" or "messages[0].content"')
    code: str | None = Field(description='e.g. "model_not_found", "unsupported", "busy"')


class OpenAIErrorOut(BaseModel):
    """Every /v1 error: OpenAI's `error` object, and the house's `detail` list naming the same field."""

    error: OpenAIErrorBody
    detail: list[ErrorItem]
