"""The OpenAI-compatible routes, driven by the official `openai` client against a live server with the
tiny pair: the same engine and store as POST /generate, OpenAI's shapes, SD² extension fields."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import httpx
import openai
import pytest

from sd2.engine import Engine
from sd2.trace import Block, BlockKind, TokenEvent, TokenStatus
from service.app import create_app
from service.openai_shapes import BlockTexts
from service.settings import Settings
from tests.service.conftest import PROMPT, SlowEngine, count, live_server

SD2 = {"method": "tiny", "k": 4}  # a speculative method, so acceptance is measured
CHAT = [{"role": "user", "content": PROMPT}]


@pytest.fixture
def server(settings: Settings) -> Iterator[str]:
    with live_server(create_app(settings)) as url:
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def model_id(url: str) -> str:
    return client(url).models.list().data[0].id


def generate(url: str, **body) -> dict:
    response = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def stored_run(url: str, run_id: int) -> dict:
    return httpx.get(f"{url}/runs/{run_id}", timeout=10).json()


def test_models_lists_the_verifier_with_the_loaded_methods(server, settings):
    models = client(server).models.list()
    assert [m.id for m in models.data] == [settings.verifier]
    entry = models.data[0]
    assert entry.object == "model" and entry.owned_by == "sd2" and entry.created > 0
    assert entry.sd2["methods"] == ["verifier", "self", "tiny"] and entry.sd2["default_method"] == "verifier"


def test_a_completion_is_a_stored_run_with_the_text_of_generate(server):
    model = model_id(server)
    completion = client(server).completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=SD2
    )
    run_id = completion.sd2["run_id"]
    assert completion.id == f"cmpl-{run_id}" and completion.object == "text_completion"
    assert completion.model == model
    # A completion continues the prompt as given: /generate's chat = false.
    reference = generate(server, prompt=PROMPT, max_new_tokens=12, chat=False, **SD2)
    (choice,) = completion.choices
    assert choice.text == reference["text"] and choice.finish_reason == reference["finish_reason"] == "length"
    assert completion.usage.prompt_tokens == reference["prompt_tokens"]
    assert completion.usage.completion_tokens == 12
    assert completion.usage.total_tokens == 12 + reference["prompt_tokens"]
    run = stored_run(server, run_id)
    assert run["status"] == "succeeded" and run["method"] == "tiny" and run["config"]["k"] == 4
    assert run["text"] == choice.text and run["blocks"]
    assert completion.sd2["tau"] == run["tau"] and completion.sd2["acceptance_rate"] == run["acceptance_rate"]
    assert completion.sd2["precision"] == run["precision"]


def test_a_streamed_completion_sends_each_blocks_text_then_done(server):
    api, model = client(server), model_id(server)
    plain = api.completions.create(model=model, prompt=PROMPT, max_tokens=20, extra_body=SD2)
    chunks = list(
        api.completions.create(model=model, prompt=PROMPT, max_tokens=20, stream=True, extra_body=SD2)
    )
    *blocks, last = chunks
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text  # T = 0 by default
    assert all(c.choices[0].finish_reason is None for c in blocks)
    assert last.choices[0].finish_reason == "length"
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("cmpl-stream-")
    run = stored_run(server, last.sd2["run_id"])
    assert len(blocks) == len(run["blocks"])  # one chunk per decoded block
    assert run["text"] == plain.choices[0].text and last.sd2["n_blocks"] == run["metrics"]["n_blocks"]


def test_chat_plain_and_streamed_match_generate_with_messages(server):
    api, model = client(server), model_id(server)
    plain = api.chat.completions.create(model=model, messages=CHAT, max_completion_tokens=16, extra_body=SD2)
    reference = generate(server, messages=CHAT, max_new_tokens=16, **SD2)
    assert plain.choices[0].message.role == "assistant"
    assert plain.choices[0].message.content == reference["text"]
    assert plain.id == f"chatcmpl-{plain.sd2['run_id']}" and plain.object == "chat.completion"
    stream = api.chat.completions.create(
        model=model,
        messages=CHAT,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=SD2,
    )
    chunks = list(stream)
    role, *blocks, last, usage = chunks
    assert role.choices[0].delta.role == "assistant" and role.choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in [*blocks, last])
    assert text == reference["text"] and last.choices[0].finish_reason == "length"
    assert usage.choices == [] and usage.usage.completion_tokens == 16
    assert usage.usage.prompt_tokens == reference["prompt_tokens"]
    assert all(c.usage is None for c in chunks[:-1])
    run = stored_run(server, last.sd2["run_id"])
    assert run["messages"] == CHAT and len(run["blocks"]) == len(blocks)
    assert httpx.get(f"{server}/runs", timeout=10).json()["total"] == 3


def test_extension_fields_reach_the_engine_and_the_store(server):
    extension = {"method": "tiny", "k": 3, "steering": False, "top_k": 5, "draft_threshold": 0.25}
    chat = client(server).chat.completions.create(
        model=model_id(server),
        messages=CHAT,
        max_tokens=8,
        temperature=0.7,
        top_p=0.9,
        seed=11,
        extra_body={**extension, "prompt_set": "openai"},
    )
    run = stored_run(server, chat.sd2["run_id"])
    assert run["method"] == "tiny" and run["steering"] is False and run["prompt_set"] == "openai"
    assert run["config"] == {
        "k": 3,
        "temperature": 0.7,
        "top_k": 5,
        "top_p": 0.9,
        "max_new_tokens": 8,
        "seed": 11,
        "draft_threshold": 0.25,
    }
    sampled = generate(
        server, messages=CHAT, max_new_tokens=8, temperature=0.7, top_p=0.9, seed=11, **extension
    )
    assert chat.choices[0].message.content == sampled["text"]  # the same seed, the same sample


def test_refusals_name_the_field_and_store_nothing(server, settings):
    api, model = client(server), model_id(server)
    prompt = {"model": model, "prompt": PROMPT, "max_tokens": 4}
    refusals = [
        (openai.NotFoundError, {"model": "gpt-4o"}, "model", "model_not_found"),
        (openai.UnprocessableEntityError, {"n": 2}, "n", "unsupported"),
        (openai.UnprocessableEntityError, {"stop": ["\n"]}, "stop", "unsupported"),
        (openai.UnprocessableEntityError, {"prompt": ["a", "b"]}, "prompt", "unsupported"),
        (openai.UnprocessableEntityError, {"frequency_penalty": 0.5}, "frequency_penalty", "unsupported"),
        (openai.UnprocessableEntityError, {"max_tokens": 10_000}, "max_tokens", "value_error"),
        (openai.UnprocessableEntityError, {"extra_body": {"method": "nope"}}, "method", "value_error"),
        (openai.UnprocessableEntityError, {"extra_body": {"k": 0}}, "k", "value_error"),
    ]
    for error, change, param, code in refusals:
        with pytest.raises(error) as caught:
            api.completions.create(**{**prompt, **change})
        assert (caught.value.param, caught.value.code) == (param, code), change
        assert caught.value.body["message"] and caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        api.chat.completions.create(
            model=model, messages=CHAT, tools=[{"type": "function", "function": {"name": "f"}}]
        )
    assert caught.value.param == "tools"
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        api.chat.completions.create(model=model, messages=[{"role": "user", "content": "a\x00b"}])
    assert caught.value.param == "messages[0].content"
    # The client itself refuses to encode NaN, so its raw-body request carries it.
    nan = json.dumps({"model": model, "prompt": PROMPT}).replace("}", ', "temperature": NaN}').encode()
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        api.post("/completions", content=nan, cast_to=openai.types.Completion)
    assert caught.value.param == "temperature"
    assert count(settings, "runs") == 0


def test_v1_errors_keep_the_house_detail_and_the_rest_of_the_api_is_unchanged(server):
    v1 = httpx.post(f"{server}/v1/completions", json={"model": "x", "prompt": "hi", "seed": -1}, timeout=10)
    body = v1.json()
    assert v1.status_code == 422 and body["detail"][0]["loc"] == ["body", "seed"]
    assert body["error"]["param"] == "seed" and body["error"]["code"] == "greater_than_equal"
    house = httpx.post(f"{server}/generate", json={"prompt": "hi", "seed": -1}, timeout=10)
    assert house.status_code == 422 and set(house.json()) == {"detail"}


def test_a_streamed_client_that_leaves_early_leaves_a_cancelled_run(settings, tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = SlowEngine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    with live_server(create_app(settings, engine=engine)) as url:
        stream = client(url).chat.completions.create(
            model=model_id(url), messages=CHAT, max_tokens=200, stream=True
        )
        next(iter(stream))
        stream.close()  # after ~1 of 200 blocks
        deadline = time.time() + 10
        while count(settings, "runs") == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert count(settings, "runs", "status = 'cancelled'") == 1 and count(settings, "blocks") == 0


def test_a_run_the_time_budget_ended_is_length_for_openai_and_time_for_sd2(settings):
    budget = replace(settings, generation_time_budget_s=1e-6)  # over after the first block (the prefill)
    with live_server(create_app(budget)) as url:
        chat = client(url).chat.completions.create(model=model_id(url), messages=CHAT, max_tokens=50)
        run = stored_run(url, chat.sd2["run_id"])
    assert chat.choices[0].finish_reason == "length" and chat.sd2["finish_reason"] == "time"
    assert run["finish_reason"] == "time" and chat.usage.completion_tokens < 50


def _block(index: int, token_id: int) -> Block:
    """A verifier step that emitted one token."""
    extra = TokenEvent(token_id, TokenStatus.BONUS, None, 1.0)
    return Block(index, BlockKind.VERIFIER, [], extra, k=0, n_accepted=0, complete=True)


def test_a_character_split_over_two_blocks_is_sent_whole_with_the_later_one(tiny_pair_dir):
    engine = Engine.load(str(tiny_pair_dir[0]), {}, device="cpu")
    text = "sky é!"  # "é" is two byte-level tokens: the tiny tokenizer learned no merge for it
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    halves = [n for n in range(len(ids)) if engine.text_of(ids[:n]).endswith("\ufffd")]
    assert engine.text_of(ids) == text and len(halves) == 1  # the prefix that ends inside "é"
    texts = BlockTexts(engine)
    pieces = [texts(_block(i, token_id)) for i, token_id in enumerate(ids)]
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    assert "é" in pieces and all(p != "\ufffd" for p in pieces)


class _FailingEngine(Engine):
    """The real engine, failing like a device fault after its first block."""

    def program(self, prepared):
        run, result = super().program(prepared), None
        while True:
            item = run.send(result)
            result = yield item
            if isinstance(item, Block):
                run.close()
                raise RuntimeError("device lost")


def test_a_run_that_fails_is_stored_and_reported_in_openais_shape(settings, tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = _FailingEngine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    with live_server(create_app(settings, engine=engine)) as url:
        api, model = client(url), model_id(url)
        with pytest.raises(openai.InternalServerError) as caught:
            api.completions.create(model=model, prompt=PROMPT, max_tokens=8)
        assert caught.value.code == "run_failed" and "device lost" in caught.value.message
        stream = api.completions.create(model=model, prompt=PROMPT, max_tokens=8, stream=True)
        with pytest.raises(openai.APIError) as mid_stream:
            for _chunk in stream:
                pass
        failed = mid_stream.value.body
        assert failed["code"] == "run_failed" and failed["sd2"]["status"] == "failed"
        assert stored_run(url, failed["sd2"]["run_id"])["status"] == "failed"
    assert count(settings, "runs", "status = 'failed'") == 2


def test_a_full_queue_is_a_rate_limit_error_with_retry_after(settings, tiny_pair_dir):
    app = create_app(replace(settings, generation_queue=1))
    with live_server(app) as url:
        api, model = client(url), model_id(url)
        services = app.state.services
        waiting = threading.Thread(
            target=api.completions.create, kwargs={"model": model, "prompt": PROMPT, "max_tokens": 2}
        )
        with services.host.lock:  # the model is busy: the first request holds the one slot, waiting
            waiting.start()
            deadline = time.time() + 10
            while services.admission.admitted == 0:
                assert time.time() < deadline, "the first request was never admitted"
                time.sleep(0.02)
            with pytest.raises(openai.RateLimitError) as caught:
                api.chat.completions.create(model=model, messages=CHAT, max_tokens=2)
        waiting.join(30)
    assert caught.value.code == "busy" and caught.value.body["type"] == "rate_limit_error"
    assert caught.value.response.headers["retry-after"] == "1"
    assert count(settings, "runs") == 1


def test_generation_needs_no_api_key_as_generate_needs_none(settings):
    with live_server(create_app(replace(settings, api_key="s3cret"))) as url:
        chat = client(url).chat.completions.create(model=model_id(url), messages=CHAT, max_tokens=3)
    assert chat.choices[0].message.content is not None and count(settings, "runs") == 1


def test_openapi_documents_the_event_stream_and_openais_error_shape(client):
    spec = client.get("/openapi.json").json()
    error = {"$ref": "#/components/schemas/OpenAIErrorOut"}
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = spec["paths"][path]["post"]["responses"]
        assert set(responses["200"]["content"]) == {"application/json", "text/event-stream"}
        for status in ("404", "422", "429", "500", "503"):
            assert responses[status]["content"]["application/json"]["schema"] == error, (path, status)
