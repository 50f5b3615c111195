"""Cross-origin policy, the CORS half of keeping other pages on this machine out (the Host check against
DNS rebinding is the other): no other origin by default; SD2_CORS_ORIGINS lets named ones in, without
credentials. The mounted UI's side is in tests/app/test_client_and_mount.py."""

from __future__ import annotations

from dataclasses import replace

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import LOOPBACK

TOOL = "https://tool.example:8443"


def _preflight(client, origin: str):
    return client.options(
        "/generate",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, x-api-key",
        },
    )


def test_no_other_origin_is_answered_by_default(client):
    response = client.get("/health", headers={"Origin": "http://localhost:3000"})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers
    assert "access-control-allow-origin" not in _preflight(client, "http://localhost:3000").headers


def test_a_configured_origin_may_call_the_api_without_credentials(settings):
    with TestClient(create_app(replace(settings, cors_origins=(TOOL,))), base_url=LOOPBACK) as client:
        response = client.get("/health", headers={"Origin": TOOL})
        assert response.headers["access-control-allow-origin"] == TOOL
        assert "access-control-allow-credentials" not in response.headers
        preflight = _preflight(client, TOOL)
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == TOOL
        assert "x-api-key" in preflight.headers["access-control-allow-headers"].lower()
        other = client.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        assert _preflight(client, "https://evil.example").status_code == 400


def test_origins_come_from_the_environment():
    assert Settings().cors_origins == ()
    env = {"SD2_CORS_ORIGINS": f"{TOOL}, http://localhost:5173 ,"}
    assert Settings.from_env(env).cors_origins == (TOOL, "http://localhost:5173")
