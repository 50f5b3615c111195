"""`sd2 serve`: settings from the environment and flags, and a real start on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sd2.paths import sd2_home
from service.settings import Settings, serve_settings


def test_flags_override_environment_and_add_drafters(tmp_path):
    env = {"SD2_HOME": str(tmp_path), "SD2_DRAFTERS": "a=/p/a", "SD2_PORT": "9001"}
    s = serve_settings(None, None, {"b": "/p/b"}, env)
    assert (s.host, s.port, s.drafters) == ("127.0.0.1", 9001, (("a", "/p/a"), ("b", "/p/b")))
    s = serve_settings("0.0.0.0", 0, {"a": "/q/a"}, env)
    assert (s.host, s.port, s.drafters) == ("0.0.0.0", 0, (("a", "/q/a"),))
    with pytest.raises(ValueError, match="--drafter"):
        serve_settings(None, None, {"../x": "/p"}, env)


def test_the_models_flags_override_the_environment(tmp_path):
    env = {
        "SD2_HOME": str(tmp_path),
        "SD2_VERIFIER": "env/verifier",
        "SD2_DEVICE": "cpu",
        "SD2_DTYPE": "fp32",
    }
    kept = serve_settings(None, None, {}, env, verifier=None, device=None, dtype=None)
    assert (kept.verifier, kept.device, kept.dtype) == ("env/verifier", "cpu", "fp32")
    chosen = serve_settings(None, None, {}, env, verifier="Qwen/Qwen3-8B", device="cuda", dtype="bf16")
    assert (chosen.verifier, chosen.device, chosen.dtype) == ("Qwen/Qwen3-8B", "cuda", "bf16")


def test_sd2_serve_refuses_a_device_it_cannot_use_before_starting(tmp_path):
    env = {**os.environ, "SD2_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "launcher", "serve", "--no-ui", "--port", "0", "--device", "cuda:7"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "sd2: error: --device 'cuda:7' was requested" in done.stderr
    assert not (tmp_path / "sd2.db").exists()  # nothing was started or written


def test_sd2_serve_starts_the_service_on_loopback(tmp_path, tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "SD2_HOME": str(tmp_path), "SD2_VERIFIER": str(verifier_dir), "SD2_DEVICE": "cpu"}
    command = [
        sys.executable,
        "-m",
        "launcher",
        "serve",
        "--port",
        str(port),
        "--drafter",
        f"tiny={drafter_dir}",
    ]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        health = None
        deadline = time.time() + 90
        while time.time() < deadline and server.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert health is not None, server.stderr.read().decode() if server.poll() is not None else "no answer"
        assert health["methods"] == ["verifier", "self", "tiny"] and health["database"] is True
        assert (tmp_path / "sd2.db").is_file()
    finally:
        server.terminate()
        server.wait(30)


def test_settings_read_the_library_home():
    assert Settings.from_env({"SD2_HOME": "/srv/sd2"}).home == Path("/srv/sd2")
    assert Settings.from_env({}).home == sd2_home({})
