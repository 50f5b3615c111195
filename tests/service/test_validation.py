"""Bad input gets a 4xx whose detail names the field, and writes nothing."""

from __future__ import annotations

import pytest

from tests.service.conftest import PROMPT, table_counts

OK = {"prompt": PROMPT, "method": "tiny", "k": 4, "max_new_tokens": 8}


def _fields(response) -> list[str]:
    """The field names in a 4xx detail (FastAPI's [{loc: [...], msg}] shape, or a message mentioning it)."""
    detail = response.json()["detail"]
    if isinstance(detail, str):
        return [detail]
    return [str(part) for d in detail for part in d["loc"][1:]] + [d["msg"] for d in detail]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"method": "tiny"}, 422, "prompt"),  # missing prompt (and messages)
        ({**OK, "messages": [{"role": "user", "content": "hi"}]}, 422, "prompt"),  # both given
        ({**OK, "prompt": ""}, 422, "prompt"),
        ({**OK, "prompt": 42}, 422, "prompt"),  # wrong type
        ({**OK, "k": "8"}, 422, "k"),  # strings are not coerced
        ({**OK, "k": 0}, 422, "k"),
        ({**OK, "k": 65}, 422, "k"),
        ({**OK, "k": 2.5}, 422, "k"),
        ({**OK, "k": "Auto"}, 422, "k"),  # only the exact word auto
        ({**OK, "draft_threshold": 1.5}, 422, "draft_threshold"),
        ({**OK, "draft_threshold": -0.1}, 422, "draft_threshold"),
        ({**OK, "temperature": -1}, 422, "temperature"),
        ({**OK, "top_p": 0}, 422, "top_p"),
        ({**OK, "max_new_tokens": 10**9}, 422, "max_new_tokens"),  # over the schema's hard cap
        ({**OK, "max_new_tokens": 257}, 422, "max_new_tokens"),  # over this server's SD2_MAX_NEW_TOKENS
        ({**OK, "prompt": "x" * 5_001}, 422, "prompt"),  # over SD2_MAX_PROMPT_CHARS
        ({**OK, "method": "nope"}, 422, "method"),  # unknown method/drafter
        ({**OK, "method": "../etc"}, 422, "method"),  # path-like names never reach a lookup
        ({**OK, "method": "/etc/passwd"}, 422, "method"),
        ({**OK, "method": "a/../../b"}, 422, "method"),
        ({**OK, "max_tokens": 8}, 422, "max_tokens"),  # unknown field (a typo) is refused, not ignored
        ({**OK, "prompt": None, "messages": [{"role": "robot", "content": "hi"}]}, 422, "role"),
        ({**OK, "prompt": None, "messages": []}, 422, "messages"),
        ({**OK, "prompt_set": "../x"}, 422, "prompt_set"),
        ({**OK, "counterfactual": "true"}, 422, "counterfactual"),  # strict: no "true" → True
        ({**OK, "counterfactual": 1}, 422, "counterfactual"),
    ],
)
def test_bad_generate_input_is_rejected_naming_the_field_and_writes_nothing(
    client, settings, body, status, field
):
    before = table_counts(settings)
    response = client.post("/generate", json={k: v for k, v in body.items() if v is not None})
    assert response.status_code == status, response.text
    assert any(field in f for f in _fields(response)), response.json()
    assert table_counts(settings) == before


def test_prompt_too_long_for_the_verifier_context_is_a_4xx_not_a_failed_run(client, settings):
    # ~250 prompt tokens + 256 new tokens + k + 1 exceed the tiny verifier's 512-token context.
    for stream in (False, True):
        response = client.post(
            "/generate", json={**OK, "prompt": "a b " * 250, "max_new_tokens": 256, "stream": stream}
        )
        assert response.status_code == 422 and "prompt" in _fields(response)
    assert table_counts(settings)["runs"] == 0


def test_malformed_json_and_oversized_bodies(client, settings):
    response = client.post("/generate", content=b'{"prompt": ', headers={"content-type": "application/json"})
    assert response.status_code == 422 and "body" in str(response.json()["detail"][0]["loc"])
    response = client.post("/generate", json={**OK, "prompt": "x" * 30_000})  # over max_body_bytes (20 000)
    assert response.status_code == 413
    assert response.json()["detail"][0]["loc"] == ["body"]

    def chunks():  # no Content-Length: the limit counts the bytes actually received
        for _ in range(30):
            yield b"x" * 1_000

    response = client.post("/generate", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["detail"][0]["loc"] == ["body"]
    assert table_counts(settings)["runs"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": PROMPT, "methods": []}, "methods"),
        ({"prompt": PROMPT, "methods": ["tiny", "tiny"]}, "methods"),
        ({"prompt": PROMPT, "methods": ["tiny", "missing"]}, "method"),  # checked before any run
        ({"prompt": PROMPT, "methods": ["tiny", "../../x"]}, "methods"),
        ({"methods": ["tiny"]}, "prompt"),
    ],
)
def test_bad_compare_input_writes_nothing(client, settings, body, field):
    response = client.post("/compare", json=body)
    assert response.status_code == 422 and any(field in f for f in _fields(response)), response.json()
    assert table_counts(settings) == dict.fromkeys(table_counts(settings), 0)


def test_bad_query_and_path_parameters(client):
    assert client.get("/runs", params={"limit": 0}).status_code == 422
    assert client.get("/runs", params={"since": "yesterday"}).status_code == 422
    assert client.get("/runs", params={"method": "../etc"}).status_code == 422
    assert client.get("/runs/abc").status_code == 422
    assert client.get("/runs/999").status_code == 404
    assert client.get("/train/999").status_code == 404


@pytest.mark.parametrize("bad", ["true", 1, None, [True]])
def test_a_counterfactual_that_is_not_a_boolean_is_refused_by_every_generation_route(client, settings, bad):
    """`counterfactual` is a request field of /generate and /compare and an SD² extension field of the /v1
    routes: a non-boolean gets 422 naming it (and, on /v1, OpenAI's `param`), and nothing is stored."""
    model = client.get("/v1/models").json()["data"][0]["id"]
    chat = [{"role": "user", "content": PROMPT}]
    requests = [
        ("/generate", {**OK, "counterfactual": bad}),
        ("/compare", {"prompt": PROMPT, "methods": ["tiny"], "counterfactual": bad}),
        ("/v1/completions", {"model": model, "prompt": PROMPT, "method": "tiny", "counterfactual": bad}),
        ("/v1/chat/completions", {"model": model, "messages": chat, "method": "tiny", "counterfactual": bad}),
    ]
    for path, body in requests:
        response = client.post(path, json=body)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["detail"][0]["loc"] == ["body", "counterfactual"], (path, response.json())
        if path.startswith("/v1/"):
            assert response.json()["error"]["param"] == "counterfactual"
    assert table_counts(settings) == dict.fromkeys(table_counts(settings), 0)
