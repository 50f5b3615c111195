"""The API client and the mount, against the live service (tiny pair, UI at `/`) over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from app import views
from app.client import ApiClient, ApiError, error_message


@pytest.fixture
def client(live_ui) -> ApiClient:
    c = ApiClient(live_ui)
    yield c
    c.close()


def test_mounting_the_ui_at_root_leaves_the_api_routes_answering(live_ui):
    assert httpx.get(f"{live_ui}/health").json()["status"] == "ok"
    assert "/generate" in httpx.get(f"{live_ui}/openapi.json").json()["paths"]
    assert httpx.get(f"{live_ui}/runs/999999").status_code == 404  # the API's 404, not the UI's page
    page = httpx.get(f"{live_ui}/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "gradio" in page.text.lower()


def test_stream_yields_blocks_then_a_summary_whose_totals_match(client):
    events = list(client.generate_stream({"prompt": "Hi!", "method": "sd2", "k": 4, "max_new_tokens": 24}))
    *blocks, summary = events
    assert {e["event"] for e in blocks} == {"block"} and summary["event"] == "summary"
    assert sum(e["block"]["n_emitted"] for e in blocks) == summary["metrics"]["n_tokens"]
    assert client.run(summary["run_id"])["method"] == "sd2"


def test_api_errors_carry_the_field_and_message(client):
    with pytest.raises(ApiError) as err:
        client.generate({"prompt": "Hi", "method": "sd2", "k": 0})
    assert err.value.status_code == 422 and err.value.message.startswith("k: ")
    with pytest.raises(ApiError, match="max_new_tokens must be ≤ 256 on this server"):
        list(client.generate_stream({"prompt": "Hi", "method": "sd2", "max_new_tokens": 999}))
    with pytest.raises(ApiError, match="no run 987654"):
        client.run(987654)


def test_unreachable_api_is_a_readable_error():
    with pytest.raises(ApiError, match="cannot reach the sd2 API"):
        ApiClient("http://127.0.0.1:9").health()


def test_error_message_shapes():
    assert error_message({"detail": "runs failed: x"}) == "runs failed: x"
    detail = [{"loc": ["body"], "msg": "Value error, prompt: give exactly one of prompt or messages"}]
    assert error_message({"detail": detail}) == "prompt: give exactly one of prompt or messages"
    assert error_message({"detail": [{"loc": ["query", "limit"], "msg": "too big"}]}) == "limit: too big"


def test_defaults_pick_the_sd2_drafter_and_one_method_per_recipe(client):
    methods, drafters = client.health()["methods"], client.drafters()
    assert views.default_method(methods, drafters) == "sd2"
    assert views.default_compare(methods, drafters)[:3] == ["pretrained", "distilled", "sd2"]
    assert views.default_method(["verifier", "self"], []) == "verifier"
    labels = dict((value, label) for label, value in views.method_choices(methods, drafters))
    assert labels["sd2"].startswith("sd2 — SD² (steered)") and labels["verifier"].startswith("verifier")


def test_the_status_line_says_how_a_run_drafted():
    fixed = {"config": {"k": 4}, "metrics": {"histogram": [1, 2], "drafted": 12}}
    assert views.drafting_label(fixed) == "k = 4"
    auto = {"config": {"k": "auto"}, "metrics": {"histogram": [3, 1, 0], "drafted": 9}}
    assert views.drafting_label(auto) == "k = auto (2.2 drafts per block)"
    assert (
        views.drafting_label({"config": {"k": "auto"}, "metrics": {"histogram": [], "drafted": 0}})
        == "k = auto"
    )


def test_decode_body_sends_history_as_messages():
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    body = views.decode_body("And then?", 4, 0.0, 0.0, 1.0, 32, 0, True, history)
    assert "prompt" not in body and body["messages"][-1] == {"role": "user", "content": "And then?"}
    assert views.decode_body("Hi", 4.0, 0, 0, 1, 32.0, None, False)["seed"] is None
    auto = views.decode_body("Hi", "auto", 0.4, 0, 1, 32, 0, True)
    assert auto["k"] == "auto" and auto["draft_threshold"] == 0.4
    assert views.decode_body("Hi", "8", 0, 0, 1, 32, 0, True)["k"] == 8  # the menu's choices are text
    unset = views.decode_body("Hi", None, None, None, None, None, None, True)  # before page load filled them
    assert unset == {"prompt": "Hi", "seed": None, "steering": True}


def test_the_decode_controls_start_at_the_apis_defaults(client, live_ui):
    """The UI keeps no copy of the decode defaults: page load sets each control from GET /defaults."""
    import gradio as gr

    from app.handlers import Handlers
    from sd2.config import DecodeConfig

    defaults = client.defaults()
    assert defaults["decode"]["max_new_tokens"] == DecodeConfig().max_new_tokens
    updates = Handlers(client).decode_defaults()
    assert len(updates) == 2 * len(views.DECODE_CONTROLS)
    generate = dict(zip(views.DECODE_CONTROLS, updates, strict=False))
    assert generate["k"]["value"] == str(DecodeConfig().k)
    assert generate["top_p"]["value"] == DecodeConfig().top_p
    assert generate["max_new"]["value"] == DecodeConfig().max_new_tokens
    assert generate["max_new"]["maximum"] == defaults["max_new_tokens_limit"] == 256
    assert updates[: len(views.DECODE_CONTROLS)] == updates[len(views.DECODE_CONTROLS) :]  # Compare alike
    down = Handlers(ApiClient("http://127.0.0.1:9")).decode_defaults()  # API unreachable: left as they are
    assert down == tuple(gr.skip() for _ in range(12))


def test_sd2_ui_command_is_wired():
    from launcher.cli import build_parser

    args = build_parser().parse_args(["ui", "--api", "http://127.0.0.1:8123", "--port", "7999"])
    assert (args.api, args.host, args.port) == ("http://127.0.0.1:8123", "127.0.0.1", 7999)
    assert callable(args.func)


def test_a_wrong_method_on_an_api_path_is_405_not_the_uis_404(live_ui):
    """With the UI mounted at `/`, `GET /generate` used to fall through to the UI's 404."""
    wrong = httpx.get(f"{live_ui}/generate")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["detail"][0]["loc"] == ["method"]
    assert httpx.delete(f"{live_ui}/health").headers["allow"] == "GET, HEAD"
    assert httpx.post(f"{live_ui}/runs/1").status_code == 405  # GET and DELETE only
    assert httpx.get(f"{live_ui}/runs/999999").status_code == 404  # a right method still routes
    assert httpx.get(f"{live_ui}/").status_code == 200  # the UI itself


def test_the_mounted_ui_takes_no_file_uploads(live_ui):
    """Gradio's upload endpoint wrote any client's files into the temp folder without the key."""
    import tempfile
    from pathlib import Path

    before = set(Path(tempfile.gettempdir()).rglob("evil.txt"))
    for path in ("/gradio_api/upload", "/gradio_api/upload/", "/upload"):
        response = httpx.post(f"{live_ui}{path}", files={"files": ("evil.txt", b"x" * 1000)})
        assert response.status_code == 404 and response.json()["detail"][0]["msg"].endswith("no file uploads")
    assert set(Path(tempfile.gettempdir()).rglob("evil.txt")) == before
    assert httpx.get(f"{live_ui}/").status_code == 200


OTHER_LOCAL_PAGE = "http://localhost:3000"  # another page on the same machine (a dev server, a local file)


@pytest.mark.parametrize("path", ["/gradio_api/info", "/config", "/runs", "/health"])
def test_another_local_page_cannot_read_the_ui_or_the_api(live_ui, path):
    """Gradio's own CORS policy let any localhost origin call the mounted UI's endpoints (which run
    generations and read every stored prompt through the API) with credentials."""
    response = httpx.get(f"{live_ui}{path}", headers={"Origin": OTHER_LOCAL_PAGE})
    assert "access-control-allow-origin" not in response.headers
    assert "access-control-allow-credentials" not in response.headers
    preflight = httpx.options(
        f"{live_ui}/gradio_api/queue/join",
        headers={"Origin": OTHER_LOCAL_PAGE, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


def test_the_counterfactual_switch_defaults_on_for_a_steered_drafter_and_is_sent_only_steered():
    drafters = [{"name": "sd2", "steering": True}, {"name": "distilled", "steering": False}]
    assert views.counterfactual_default("sd2", drafters) is True
    assert views.counterfactual_default("distilled", drafters) is False
    assert views.counterfactual_default("verifier", drafters) is False
    assert views.counterfactual_default(["distilled", "sd2"], drafters) is True  # Compare: any steered
    assert views.counterfactual_default([], drafters) is False
    asked = views.decode_body("Hi", 4, 0, 0, 1, 32, 0, True, counterfactual=True)
    assert asked["counterfactual"] is True
    assert "counterfactual" not in views.decode_body("Hi", 4, 0, 0, 1, 32, 0, True)
    assert "counterfactual" not in views.decode_body("Hi", 4, 0, 0, 1, 32, 0, False, counterfactual=True)
