"""A bounded fuzz pass of the OpenAPI schema (schemathesis) against a live server: no input gives a 5xx.

Every operation gets schema-derived cases over real HTTP on loopback, with the tiny model pair and a
real SQLite file: positive cases (valid per the schema) and negative ones (wrong types, out-of-range
numbers, missing fields, odd path ids). Schema-valid bodies mostly stop at a 422 the schema cannot
express (exactly one of prompt/messages, the server's tighter limits, unknown method names), so half
of the positive cases are *fitted* to the server — loaded methods, limits respected, ids of stored
runs and jobs — and reach decoding, storing, export, delete and training with fuzzed settings.
The OpenAI-compatible operations (/v1) are fitted too (the verifier's model id), and their answers
must also match their documented schemas and content types. The server runs with tight limits (≤ 32
new tokens, 2-step training jobs) so the pass stays near a minute on 2 cores.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, response_schema_conformance

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import PROMPT, live_server

EXAMPLES_PER_OPERATION = 60
MAX_NEW_TOKENS = 32
TRAIN_STEPS = 2
METHODS = ("verifier", "self", "sd2")
SEEDED = 6  # runs stored before fuzzing, so fitted path ids find something to read, export and delete


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, tiny_pair_dir) -> Iterator[str]:
    verifier_dir, drafter_dir = tiny_pair_dir
    settings = Settings(
        home=tmp_path_factory.mktemp("fuzz") / "home",
        verifier=str(verifier_dir),
        # Named like the schema's examples ("method": "sd2"), so those decode and train for real.
        drafters=(("sd2", str(drafter_dir)),),
        device="cpu",
        max_new_tokens=MAX_NEW_TOKENS,
        max_body_bytes=20_000,
        max_prompt_chars=2_000,
        max_train_steps=TRAIN_STEPS,
    )
    with live_server(create_app(settings)) as url:
        for i in range(SEEDED):
            body = {"prompt": PROMPT, "method": METHODS[i % 3], "max_new_tokens": 8}
            assert httpx.post(f"{url}/generate", json=body, timeout=60).status_code == 200
        job = {"name": "seeded", "base_drafter": "sd2", "steps": 1}
        assert httpx.post(f"{url}/train", json=job, timeout=60).status_code == 202
        yield url


def _operations() -> dict[str, object]:
    """The app's own OpenAPI document (building it loads no model), one entry per operation."""
    spec = schemathesis.openapi.from_dict(create_app(Settings()).openapi())
    return {op.label: op for op in (result.ok() for result in spec.get_all_operations())}


OPERATIONS = _operations()
# Operations without parameters or a body have no invalid input to generate.
NEGATIVE = sorted(label for label, op in OPERATIONS.items() if "{" in label or label.startswith("POST"))

# Operations whose answers are also checked against their documented schemas and content types.
CONFORMING = sorted(label for label in OPERATIONS if " /v1/" in label)

fits = st.one_of(
    st.none(),
    st.fixed_dictionaries({"method": st.sampled_from(METHODS), "id": st.integers(1, SEEDED + 2)}),
)


def fit_to_server(label: str, case, fit: dict, model: str) -> None:
    """Turn a schema-valid case into one this server accepts, keeping the fuzzed knobs."""
    for name in ("run_id", "job_id"):
        if case.path_parameters and name in case.path_parameters:
            case.path_parameters[name] = fit["id"]
    body = case.body
    if not isinstance(body, dict):
        return
    # JSON Schema counts 25.0 as an integer; the API is strict (no 25.0 → 25), like JSON encoders.
    body.update({key: int(v) for key, v in body.items() if isinstance(v, float) and v.is_integer()})
    if label in ("POST /generate", "POST /compare"):
        if (body.get("prompt") is None) == (body.get("messages") is None):
            body.pop("messages", None)
            body["prompt"] = body.get("prompt") or PROMPT
        body["max_new_tokens"] = min(body.get("max_new_tokens", 8), MAX_NEW_TOKENS)
        if label == "POST /compare":
            body["methods"] = sorted({fit["method"], "verifier"})
        else:
            body["method"] = fit["method"]
    elif label in ("POST /v1/completions", "POST /v1/chat/completions"):
        body.update(model=model, method=fit["method"])
        if body.get("max_completion_tokens") is not None:
            body.pop("max_tokens", None)  # both, when different, are a 422
        else:
            body["max_tokens"] = body.get("max_tokens") or 8
        for name in ("max_tokens", "max_completion_tokens"):
            if body.get(name) is not None:
                body[name] = min(body[name], MAX_NEW_TOKENS)
        if isinstance(body.get("prompt"), str):
            body["prompt"] = _clean(body["prompt"])
        for message in body.get("messages") or []:
            if isinstance(message.get("content"), str):
                message["content"] = _clean(message["content"])
            for part in message.get("content") if isinstance(message.get("content"), list) else []:
                part["text"] = _clean(part["text"])
    elif label == "POST /train":
        body.update(base_drafter="sd2", method="pretrain", steps=min(body.get("steps", 1), TRAIN_STEPS))


def _clean(text: str) -> str:
    """Fuzzed text as the server takes it (no NUL, no lone surrogate, not empty; the schema cannot say so)."""
    return text.replace("\x00", "").encode("utf-8", "ignore").decode() or PROMPT


@pytest.mark.parametrize(
    ("label", "mode"),
    [(label, GenerationMode.POSITIVE) for label in sorted(OPERATIONS)]
    + [(label, GenerationMode.NEGATIVE) for label in NEGATIVE],
    ids=lambda v: v.value if isinstance(v, GenerationMode) else v,
)
def test_no_server_errors(label: str, mode: GenerationMode, fuzz_server: str, tiny_pair_dir) -> None:
    model = str(tiny_pair_dir[0])  # the one id of GET /v1/models: the verifier's name
    seen: Counter[int] = Counter()

    @given(case=OPERATIONS[label].as_strategy(generation_mode=mode), fit=fits)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,  # no .hypothesis folder in the repo
        derandomize=True,  # the same cases on every run, so a failure reproduces
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case, fit) -> None:
        if mode is GenerationMode.POSITIVE and fit is not None:
            fit_to_server(label, case, fit, model)
        response = case.call(base_url=fuzz_server, timeout=60)
        seen[response.status_code] += 1
        assert response.status_code < 500, (
            f"{response.status_code} from {case.as_curl_command()}\n{response.text[:2000]}"
        )
        if label in CONFORMING:
            case.validate_response(response, checks=[response_schema_conformance, content_type_conformance])

    check()
    assert seen.total() > 0, "no case was sent"
    print(f"{label} {mode.value}: {dict(seen)}")
