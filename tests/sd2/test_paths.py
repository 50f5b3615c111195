"""sd2's home and assets folders (sd2.paths): one source, overridable, and honoured by every reader."""

from pathlib import Path

import pytest

from sd2.bench.prompts import DEMO_SET, load_prompt_sets
from sd2.embedded import EMBEDDED_VERIFIER, embedded_verifier_path
from sd2.models import resolve_model_path
from sd2.paths import (
    AssetsNotFoundError,
    asset_path,
    assets_dir,
    prompts_dir,
    repo_relative,
    repo_root,
    sd2_home,
)
from sd2.shipped import shipped_drafters

CHECKOUT_ASSETS = Path(__file__).resolve().parents[2] / "assets"


def test_home_comes_from_the_environment_else_the_user_cache():
    assert sd2_home({"SD2_HOME": "/srv/sd2"}) == Path("/srv/sd2")
    assert sd2_home({"SD2_HOME": "~/lab"}) == Path.home() / "lab"
    assert sd2_home({}) == Path.home() / ".cache" / "sd2"
    assert sd2_home({"SD2_HOME": ""}) == Path.home() / ".cache" / "sd2"  # empty = unset, as in compose


def test_assets_default_to_the_checkout_and_follow_the_environment(tmp_path):
    assert assets_dir({}) == CHECKOUT_ASSETS
    assert prompts_dir({}) == CHECKOUT_ASSETS / "prompts"
    assert assets_dir({"SD2_ASSETS": str(tmp_path)}) == tmp_path
    assert asset_path("drafters", "sd2", env={"SD2_ASSETS": str(tmp_path)}) == tmp_path / "drafters" / "sd2"


def test_a_path_inside_the_checkout_is_named_relative_to_it_and_one_outside_absolutely(tmp_path, monkeypatch):
    root = CHECKOUT_ASSETS.parent
    assert repo_root() == root
    assert repo_relative(root / "assets" / "prompts" / "chat.jsonl") == "assets/prompts/chat.jsonl"
    assert repo_relative(str(root / "assets" / "drafters" / "sd2")) == "assets/drafters/sd2"
    assert repo_relative(tmp_path / "chat.jsonl") == str(tmp_path / "chat.jsonl")
    assert repo_relative("some/hub-id") == "some/hub-id"  # names nothing on disk: kept as given
    monkeypatch.chdir(root)
    assert repo_relative("assets/prompts") == "assets/prompts"
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert repo_relative("mine") == str(tmp_path / "mine")  # relative to a folder outside: made absolute


def test_an_installed_copy_has_no_checkout_and_keeps_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.setattr("sd2.paths._CHECKOUT", tmp_path / "site-packages")
    assert repo_root() is None
    assert repo_relative(CHECKOUT_ASSETS / "prompts") == str(CHECKOUT_ASSETS / "prompts")


def test_readers_follow_sd2_assets(tmp_path, monkeypatch):
    monkeypatch.setenv("SD2_ASSETS", str(tmp_path))
    assert shipped_drafters() == {}  # no drafters/ there
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "mine.jsonl").write_text('{"id": "a", "prompt": "Hello"}\n')
    [only] = load_prompt_sets()
    assert only.name == "mine" and only.prompts[0].prompt == "Hello"


def test_without_assets_the_demo_set_still_runs_and_a_named_set_says_what_is_missing(monkeypatch):
    monkeypatch.setattr("sd2.paths._CHECKOUT_ASSETS", Path("/nonexistent/assets"))
    monkeypatch.delenv("SD2_ASSETS", raising=False)
    assert assets_dir() is None
    assert shipped_drafters() == {}
    assert [s.name for s in load_prompt_sets()] == [DEMO_SET]
    with pytest.raises(AssetsNotFoundError, match=r"prompts.*set \$SD2_ASSETS"):
        load_prompt_sets(names=["chat"])


def test_the_embedded_verifier_is_found_under_the_given_home(tmp_path):
    """`Settings(home=…)` moves the converted model too: a home holding a converted copy is used as is."""
    real = embedded_verifier_path()  # the shared conversion (≈20 s once per machine)
    folder = tmp_path / "models" / EMBEDDED_VERIFIER
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(real / name)
    assert resolve_model_path(None, tmp_path) == str(folder)
    assert resolve_model_path(EMBEDDED_VERIFIER, tmp_path) == str(folder)
    assert resolve_model_path("some/hub-id", tmp_path) == "some/hub-id"
