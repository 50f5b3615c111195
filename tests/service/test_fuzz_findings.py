"""Regression tests for the 5xx the schemathesis pass (test_fuzz.py) found, one per finding."""

from __future__ import annotations

import pytest

from service.schemas import ErrorOut
from tests.service.conftest import PROMPT, table_counts

OK = {"prompt": PROMPT, "method": "tiny", "k": 4, "max_new_tokens": 8}


@pytest.mark.parametrize("temperature", [5e-324, 6.551875915667392e-159, 1e-40, 1e-5])
@pytest.mark.parametrize(("path", "extra"), [("/generate", {}), ("/compare", {"methods": ["verifier"]})])
def test_a_vanishing_positive_temperature_is_a_4xx_not_a_failed_run(
    client, settings, path, extra, temperature
):
    # Found by the fuzz pass: 0 < T below float32's range made logits / T overflow, softmax gave NaN
    # and the run failed mid-decoding (500, a failed run stored). It is a bad input: 422, nothing stored.
    # (sd2.config.DecodeConfig now refuses 0 < T < MIN_TEMPERATURE; the service names the field.)
    body = {**OK, "temperature": temperature, **extra}
    if "methods" in extra:
        del body["method"]
    before = table_counts(settings)
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "temperature"]
    assert table_counts(settings) == before


@pytest.mark.parametrize("temperature", [0.0, 1e-3, 0.05])
def test_greedy_and_small_sampling_temperatures_still_decode(client, temperature):
    response = client.post("/generate", json={**OK, "temperature": temperature})
    assert response.status_code == 200, response.text
    assert response.json()["config"]["temperature"] == temperature


def _raw_post(client, path: str, body: str):
    return client.post(
        path, content=body.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"}
    )


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("field", ["temperature", "top_p", "draft_threshold"])
def test_non_finite_json_numbers_are_a_4xx_naming_the_field(client, settings, literal, field):
    # Python's JSON parser accepts NaN / Infinity (and 1e999 overflows to inf); the 422 that
    # followed could not be rendered (its detail echoed the non-finite input) and became a 500.
    before = table_counts(settings)
    response = _raw_post(client, "/generate", f'{{"prompt": "Hi!", "method": "tiny", "{field}": {literal}}}')
    assert response.status_code == 422, response.text
    assert any(d["loc"] == ["body", field] for d in response.json()["detail"])
    assert table_counts(settings) == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", '{"prompt": "a\\ud800b", "method": "tiny"}', "prompt"),
        ("/generate", '{"messages": [{"role": "user", "content": "\\udfff"}], "method": "tiny"}', "content"),
        ("/train", '{"name": "x\\ud800", "method": "pretrain", "base_drafter": "tiny"}', "name"),
    ],
)
def test_a_lone_surrogate_is_a_4xx_naming_the_field(client, settings, path, body, field):
    # "\ud800" is valid JSON but not Unicode text; it reached the tokenizer / the store (or an
    # error message that could not be encoded) and gave a 500.
    before = table_counts(settings)
    response = _raw_post(client, path, body)
    assert response.status_code == 422, response.text
    assert any(field in str(part) for d in response.json()["detail"] for part in d["loc"]), response.text
    assert table_counts(settings) == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", '{"prompt": "a\\u0000b", "method": "tiny"}', "prompt"),
        ("/generate", '{"messages": [{"role": "user", "content": "\\u0000"}], "method": "tiny"}', "content"),
        ("/train", '{"name": "x", "base_drafter": "tiny", "data": ["a\\u0000b"]}', "data"),
    ],
)
def test_a_nul_character_is_a_4xx_naming_the_field(client, settings, path, body, field):
    # Found running the suite on PostgreSQL, whose text columns cannot hold NUL: it became a 503 there.
    before = table_counts(settings)
    response = _raw_post(client, path, body)
    assert response.status_code == 422, response.text
    assert any(field in str(part) for d in response.json()["detail"] for part in d["loc"]), response.text
    assert "NUL" in response.text
    assert table_counts(settings) == before


def test_a_token_that_decodes_to_nul_is_shown_as_the_replacement_character(tiny_pair_dir):
    """The tiny tokenizer's byte token 191 decodes to "\x00"; results and stores show U+FFFD instead
    (PostgreSQL text cannot hold NUL), while token ids stay exact."""
    from sd2.engine import Engine

    verifier_dir, _ = tiny_pair_dir
    engine = Engine.load(str(verifier_dir))
    assert "\x00" in engine.tokenizer.decode([191])  # the raw decode, for the record
    assert engine._token_text(191) == engine.tokenizer.decode([191]).replace("\x00", "\ufffd")


@pytest.mark.parametrize(
    ("params", "total"),
    [
        ({"since": "9999-12-31T23:59:59-14:00"}, 0),  # after every representable moment
        ({"until": "0001-01-01T00:00:00+14:00"}, 0),  # before every one
        ({"until": "9999-12-31T23:59:59-14:00"}, None),  # every run so far
        ({"since": "0001-01-01T00:00:00+14:00"}, None),
    ],
)
def test_datetimes_at_the_calendars_edge_are_answered_not_a_500(client, params, total):
    # Converting these to UTC overflows the calendar; they are valid ISO 8601 and get an answer.
    client.post("/generate", json=OK)
    response = client.get("/runs", params=params)
    assert response.status_code == 200, response.text
    everything = client.get("/runs").json()["total"]
    assert response.json()["total"] == (everything if total is None else total)


@pytest.mark.parametrize("value", ["0.5", "1700000000", "yesterday"])
def test_a_number_or_a_word_is_not_a_date(client, value):
    # pydantic took "0.5" as a Unix timestamp; only ISO 8601 is a date here.
    response = client.get("/runs", params={"until": value})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", "until"]
    assert "ISO 8601" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize("path", ["/generate", "/compare", "/train"])
def test_a_body_not_in_utf8_is_a_400_in_the_error_schema(client, settings, path):
    # FastAPI answered these with a plain-string `detail`, outside the documented ErrorOut shape.
    response = client.post(path, content=b'{"prompt": "\xff"}', headers={"content-type": "application/json"})
    assert response.status_code == 400
    ErrorOut.model_validate(response.json())
    assert response.json()["detail"][0]["loc"] == ["body"]
    assert set(table_counts(settings).values()) == {0}


def test_an_unknown_path_is_a_404_in_the_error_schema(client):
    response = client.get("/no-such-thing")
    assert response.status_code == 404
    assert ErrorOut.model_validate(response.json()).detail[0].msg == "Not Found"
