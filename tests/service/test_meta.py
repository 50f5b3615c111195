"""/health, /version, /drafters, the OpenAPI document, and the package boundary
(docs/architecture.md#import-rules)."""

from __future__ import annotations

import subprocess
import sys

import torch

from sd2 import __version__
from sd2.devices import cpu_has_native_bf16
from sd2.int8_weights import int8_available
from sd2.invariant import packed_available

DTYPE_AUTO = torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def test_health_version_drafters(client):
    health = client.get("/health").json()
    assert health == {
        "status": "ok",
        "models_loaded": True,
        "verifier": health["verifier"],
        "methods": ["verifier", "self", "tiny"],
        "device": f"cpu/{'bf16' if cpu_has_native_bf16() else 'fp32'}",  # --dtype auto
        "batch_invariant": True,
        "draft_step": "direct",  # --draft-step auto on a CPU
        # --dtype auto: bf16 where the CPU has it natively, else fp32; packed where oneDNN packs that dtype
        "packed_weights": packed_available(
            torch.bfloat16 if cpu_has_native_bf16() else torch.float32, torch.device("cpu")
        ),
        # --draft-weights auto: int8 copies of the drafters' weights in bf16 on a CPU, where torch has them
        "draft_weights": "int8" if int8_available(DTYPE_AUTO, torch.device("cpu")) else "full",
        "database": True,
    }
    assert client.get("/version").json() == {"sd2": __version__, "schema_version": 7, "api": "1"}
    (drafter,) = client.get("/drafters").json()
    assert drafter == {
        "name": "tiny",
        "architecture": "LlamaForCausalLM",
        "recipe": None,
        "steering": False,
        "n_params": drafter["n_params"],
        "source": "config",
    }
    assert drafter["n_params"] > 10_000


def test_defaults_are_decode_configs_own_and_what_an_omitted_field_gets(client):
    from dataclasses import asdict

    from sd2.config import DecodeConfig

    body = client.get("/defaults").json()
    assert body == {"decode": asdict(DecodeConfig()), "max_new_tokens_limit": 256}
    run = client.post("/generate", json={"prompt": "Hi", "method": "tiny", "max_new_tokens": 4}).json()
    assert run["config"] == {**body["decode"], "max_new_tokens": 4}


def test_openapi_documents_every_endpoint_with_examples(client):
    spec = client.get("/openapi.json").json()
    expected = {
        ("post", "/generate"), ("post", "/compare"), ("get", "/runs"), ("get", "/runs/{run_id}"),
        ("get", "/runs/{run_id}/export"), ("delete", "/runs/{run_id}"), ("get", "/stats"),
        ("get", "/drafters"),
        ("get", "/health"), ("get", "/ready"), ("get", "/version"), ("get", "/defaults"), ("get", "/metrics"),
        ("post", "/train"), ("get", "/train/{job_id}"),
        ("get", "/train/{job_id}/stream"), ("post", "/train/{job_id}/cancel"),
        ("post", "/benchmarks"), ("get", "/benchmarks"), ("get", "/benchmarks/{benchmark_id}"),
        ("delete", "/benchmarks/{benchmark_id}"),
        ("get", "/v1/models"), ("post", "/v1/completions"), ("post", "/v1/chat/completions"),
    }  # fmt: skip
    assert {(m, p) for p, ops in spec["paths"].items() for m in ops} == expected
    schemas = spec["components"]["schemas"]
    assert (
        schemas["GenerateIn"]["examples"]
        and schemas["TrainIn"]["examples"]
        and schemas["CompareIn"]["examples"]
    )


def test_importing_sd2_loads_no_web_or_db_framework():
    code = (
        "import sd2, sd2.engine, sd2.decoding, sys; "
        "web = {'fastapi', 'starlette', 'gradio', 'sqlalchemy'}; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in web); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_loopback_server_refuses_other_host_headers(settings):
    """DNS rebinding: a page on evil.example re-pointed at 127.0.0.1 sends `Host: evil.example`;
    the loopback server refuses it in the API's JSON shape, over real HTTP, and serves loopback names."""
    import httpx

    from service.app import create_app
    from tests.service.conftest import live_server

    with live_server(create_app(settings)) as url:
        port = url.rsplit(":", 1)[1]
        evil = httpx.get(f"{url}/runs", headers={"Host": f"evil.example:{port}"})
        assert evil.status_code == 400
        assert evil.json()["detail"][0]["loc"] == ["header", "Host"]
        assert "SD2_ALLOWED_HOSTS" in evil.json()["detail"][0]["msg"]
        for name in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
            assert httpx.get(f"{url}/health", headers={"Host": name}).status_code == 200, name


def test_allowed_hosts_follow_the_bind_address_unless_configured():
    from service.hosts import allowed_hosts, host_name

    assert allowed_hosts("127.0.0.1", ()) == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("0.0.0.0", ()) is None  # exposed on purpose (a container): any Host
    assert allowed_hosts("0.0.0.0", ("backend", "lab.example:443")) == {"backend", "lab.example"}
    assert [host_name(h) for h in ("[::1]:8000", "Localhost:80", "::1", "backend")] == [
        "::1", "localhost", "::1", "backend",
    ]  # fmt: skip


def test_the_api_docs_need_nothing_from_the_internet(client):
    """/docs and /redoc reference only assets this server serves (FastAPI's defaults use a CDN)."""
    import re

    for page in ("/docs", "/redoc"):
        html = client.get(page)
        assert html.status_code == 200 and "text/html" in html.headers["content-type"]
        sources = re.findall(r'(?:src|href)="([^"]+)"', html.text)
        assert sources and all(s.startswith("/") for s in sources), sources
        for source in sources:
            asset = client.get(source)
            assert asset.status_code == 200 and len(asset.content) > 1000, source
    assert "/openapi.json" in client.get("/docs").text


def test_openapi_documents_the_errors_every_operation_can_give(client):
    """400 (Host) and 503 (store) on every operation, 413 where a body is read, 404 where the path
    names an id (or a /v1 body a model), each with the error body's schema."""
    spec = client.get("/openapi.json").json()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"400", "503"} <= codes, (method, path)
            assert ("413" in codes) == ("requestBody" in operation), (method, path)
            names_a_model = path.startswith("/v1/") and "requestBody" in operation  # 404: model_not_found
            assert ("404" in codes) == ("{" in path or names_a_model), (method, path)
    not_found = spec["paths"]["/runs/{run_id}"]["get"]["responses"]["404"]
    assert not_found["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
