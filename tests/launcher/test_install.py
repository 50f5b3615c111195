"""The project installed as a package (not a checkout) runs `sd2 generate` on the embedded pair from
another directory, its assets found through `$SD2_ASSETS` (sd2.paths).

The fresh venv reuses this environment's third-party packages through a `.pth` line (no network, no
copies of torch); the project itself is built from a copy of its sources and installed as a wheel, so
nothing resolves back to this checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sd2.embedded import embedded_verifier_path
from sd2.paths import sd2_home

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "sd2", "service", "app", "launcher")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv holding the project as an installed wheel."""
    base = tmp_path_factory.mktemp("install")
    source = base / "src"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(
        subprocess.run(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (purelib / "_outer_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "-q", str(source)], check=True, timeout=600, cwd=base)
    shutil.rmtree(source)  # the installed copy must not need its sources
    return venv / "bin"


def _run(bin_dir: Path, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("SD2_ASSETS", "PYTHONPATH")}
    clean |= {"HF_HUB_OFFLINE": "1", "SD2_HOME": str(sd2_home()), **env}
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_installed_package_is_not_the_checkout(installed, tmp_path):
    code = "import sd2, service, app, launcher; print(sd2.__file__); print(launcher.__file__)"
    done = _run(installed, ["python", "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.split():
        assert Path(line).is_relative_to(installed.parent), line
        assert not Path(line).is_relative_to(ROOT)


def test_sd2_generate_runs_the_embedded_pair_from_elsewhere(installed, tmp_path):
    embedded_verifier_path()  # converted once into the shared home, which the installed copy reuses
    args = ["sd2", "generate", "--json", "--prompt", "Name a colour.", "--max-new-tokens", "8", "--k", "2"]
    done = _run(installed, args, tmp_path, SD2_ASSETS=str(ROOT / "assets"))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["method"] == "sd2"  # the shipped SD² drafter was found through $SD2_ASSETS
    assert result["text"].strip() and result["metrics"]["n_tokens"] == 8


def test_without_assets_generate_falls_back_to_the_verifier_and_bench_names_the_setting(installed, tmp_path):
    args = ["sd2", "generate", "--json", "--prompt", "Name a colour.", "--max-new-tokens", "4"]
    done = _run(installed, args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["method"] == "verifier"
    assert "SD2_ASSETS" in done.stderr  # says why no drafter ran
    bench = _run(installed, ["sd2", "bench", "--prompt-sets", "chat", "--out", str(tmp_path / "b")], tmp_path)
    assert bench.returncode != 0 and "SD2_ASSETS" in bench.stderr
