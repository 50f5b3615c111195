"""The service warms the engine up before it serves: k = auto's cost profiles measured, kernels run."""

from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import LOOPBACK


def _engine(client: TestClient):
    return client.app.state.services.host.engine


def test_the_cost_profile_of_every_drafter_is_measured_before_the_first_request(settings):
    with TestClient(create_app(replace(settings, warm_up=True)), base_url=LOOPBACK) as client:
        assert _engine(client).measured_cost_profiles == ("self", "tiny")
        assert client.get("/health").status_code == 200
    with TestClient(create_app(replace(settings, warm_up=False)), base_url=LOOPBACK) as client:
        assert _engine(client).measured_cost_profiles == ()  # measured on first use instead


def test_warm_up_is_on_unless_the_environment_turns_it_off():
    assert Settings().warm_up and Settings.from_env({}).warm_up
    assert Settings.from_env({"SD2_WARM_UP": ""}).warm_up
    assert not Settings.from_env({"SD2_WARM_UP": "Off"}).warm_up
    assert not Settings.from_env({"SD2_WARM_UP": "0"}).warm_up
    assert Settings.from_env({"SD2_WARM_UP": "yes"}).warm_up
    with pytest.raises(ValueError, match="SD2_WARM_UP must be one of"):
        Settings.from_env({"SD2_WARM_UP": "maybe"})
