"""OpenAI-compatible routes: GET /v1/models, POST /v1/completions and POST /v1/chat/completions, plain or
streamed as server-sent events, on the same engine and store as POST /generate (every call is a run).

The one model id is the verifier's name: whatever the method, lossless decoding makes the output the
verifier's, so the SD² method is a request extension (`method`, with `k`, `steering`, … — the `openai`
client's `extra_body`), not a model. Generation needs no API key, as POST /generate needs none.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from sd2.engine import VERIFIER_METHOD, Engine
from service.deps import Services, ServicesDep
from service.errors import FieldError
from service.one_run import admitted, decode_stored, stream_stored
from service.openai_errors import OpenAIRoute
from service.openai_schemas import (
    ChatCompletionIn,
    ChatCompletionOut,
    CompletionIn,
    CompletionOut,
    ModelListOut,
    OpenAIErrorOut,
    OpenAIRequest,
)
from service.openai_shapes import (
    CHAT,
    COMPLETION,
    SSE_MEDIA_TYPE,
    BlockTexts,
    EventStream,
    Flavour,
    answer,
    run_error,
)
from service.schemas import DecodeSettings

router = APIRouter(prefix="/v1", tags=["openai"], route_class=OpenAIRoute)

OWNER = "sd2"
STREAM_DOC = (
    "With `stream: true` the response is `text/event-stream`: `data: {chunk}` events — for chat first "
    "`delta.role` — then one chunk per decoded block with that block's new text, a last chunk with "
    "`finish_reason` and the `sd2` extension object (its `run_id`), a `usage` chunk if "
    "`stream_options.include_usage`, then `data: [DONE]`. Chunk ids are `…-stream-<hex>` (the run is "
    'stored when it ends). A run that fails mid-stream ends with `data: {"error": {...}}`; a client '
    "that leaves cancels the run, which is stored as cancelled."
)
# Answered by the route, in OpenAI's shape. 400 (Host), 405 and a declared oversize body (413) are answered
# before routing, in the house's (service.limits, service.hosts).
ERRORS = {
    404: "`model` is not an id of GET /v1/models (`code`: model_not_found)",
    422: "a field is invalid or not supported by sd2 (`error.param` names it; `code`: unsupported)",
    429: "every generation slot is taken; retry after `Retry-After` seconds",
    500: "the run failed; it is stored with status failed (`error.sd2.run_id`)",
    503: "the database cannot be read or written now; retry after `Retry-After` seconds",
}
SSE_EVENT = {  # OpenAPI 3.1: an event stream's `schema` describes each event
    "type": "object",
    "properties": {"data": {"type": "string", "description": "a chunk's JSON, an error's, or `[DONE]`"}},
    "required": ["data"],
}
GENERATION_RESPONSES = {
    200: {"content": {SSE_MEDIA_TYPE: {"schema": SSE_EVENT}}},
    **{status: {"model": OpenAIErrorOut, "description": text} for status, text in ERRORS.items()},
}


@router.get(
    "/models",
    response_model=ModelListOut,
    summary="The model ids /v1 requests may name (OpenAI's list shape)",
    description="One model: the verifier. The `sd2` object lists the methods a request's `method` may take.",
)
async def list_models(services: ServicesDep):
    engine = services.host.engine
    model = {
        "id": engine.verifier_name,
        "object": "model",
        "created": int(time.time()),  # sd2 cannot know when a checkpoint was made; vLLM does the same
        "owned_by": OWNER,
        "sd2": {
            "methods": engine.methods(),
            "default_method": VERIFIER_METHOD,
            "device": engine.device_label,
        },
    }
    return JSONResponse({"object": "list", "data": [model]})


@router.post(
    "/completions",
    response_model=CompletionOut,
    summary="Complete one prompt (OpenAI's legacy completions) and store the run",
    description="The prompt is continued as given unless `chat: true`. " + STREAM_DOC,
    responses=GENERATION_RESPONSES,
)
async def completions(body: CompletionIn, services: ServicesDep, http: Request):
    return await _run(services, http, body, body.decode_settings(), COMPLETION)


@router.post(
    "/chat/completions",
    response_model=ChatCompletionOut,
    summary="Answer a chat (OpenAI's chat completions) and store the run",
    description="The messages go through the verifier's chat template. " + STREAM_DOC,
    responses=GENERATION_RESPONSES,
)
async def chat_completions(body: ChatCompletionIn, services: ServicesDep, http: Request):
    return await _run(services, http, body, body.decode_settings(), CHAT)


async def _run(
    services: Services, http: Request, body: OpenAIRequest, settings: DecodeSettings, flavour: Flavour
):
    """The /generate pipeline (service.one_run) with OpenAI's names for its errors and its answer."""
    engine = services.host.engine
    _check_model(engine, body.model)
    try:
        prepared = await admitted(services, settings, body.method)
    except FieldError as err:
        if err.field == "max_new_tokens":  # the server's cap, under the name this request used
            err.field = body.max_tokens_field
            err.message = err.message.replace("max_new_tokens", err.field)
        raise
    if body.stream:
        events = EventStream(flavour, body.model, body.include_usage)
        texts = BlockTexts(engine)
        return await stream_stored(services, prepared, body.prompt_set, texts, events, SSE_MEDIA_TYPE)
    created = int(time.time())
    run_id, record = await decode_stored(services, prepared, body.prompt_set, http)
    if record.result is None:
        error = run_error(run_id, record)
        detail = [{"loc": ["server", "run"], "msg": error["message"], "type": error["code"]}]
        return JSONResponse({"error": error, "detail": detail}, status_code=500)
    return JSONResponse(answer(flavour, body.model, created, run_id, record))


def _check_model(engine: Engine, model: str) -> None:
    if model != engine.verifier_name:
        message = f"the model {model!r} does not exist here; GET /v1/models lists {engine.verifier_name!r}"
        detail = [{"loc": ["body", "model"], "msg": message, "type": "model_not_found"}]
        raise HTTPException(404, detail=detail)
