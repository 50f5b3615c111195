"""Where sd2 keeps its state and finds its assets: the one source of both (docs/embedded.md).

- **Home** (`$SD2_HOME`, default `~/.cache/sd2`): converted models, the trace database, training
  checkpoints, data shards, bench results. Written by sd2.
- **Assets** (`$SD2_ASSETS`, default the `assets/` folder of the checkout the package runs from): the
  shipped drafters, the held-out prompt sets, committed bench results. Read-only, too large for a
  wheel (the drafters are ≈135 MB), so an installed copy is pointed at a checkout's `assets/`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

HOME_ENV = "SD2_HOME"
ASSETS_ENV = "SD2_ASSETS"
DEFAULT_HOME = "~/.cache/sd2"
_CHECKOUT = Path(__file__).resolve().parents[1]  # the repository root, when the package runs from a checkout
_CHECKOUT_ASSETS = _CHECKOUT / "assets"  # beside the package in a checkout


class AssetsNotFoundError(FileNotFoundError):
    """An asset was asked for but no assets folder is known (an install outside a checkout)."""


def sd2_home(env: Mapping[str, str] | None = None) -> Path:
    """Root of sd2's on-disk state: `$SD2_HOME`, else `~/.cache/sd2`."""
    env = os.environ if env is None else env
    return Path(env.get(HOME_ENV) or DEFAULT_HOME).expanduser()


def assets_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """The assets folder: `$SD2_ASSETS`, else the checkout's `assets/`; None when neither exists."""
    env = os.environ if env is None else env
    if env.get(ASSETS_ENV):
        return Path(env[ASSETS_ENV]).expanduser()
    return _CHECKOUT_ASSETS if _CHECKOUT_ASSETS.is_dir() else None


def asset_path(*parts: str, env: Mapping[str, str] | None = None) -> Path:
    """A path inside the assets folder (it need not exist); AssetsNotFoundError if there is no folder."""
    root = assets_dir(env)
    if root is None:
        raise AssetsNotFoundError(
            f"sd2's assets ({'/'.join(parts)}) are not installed with the package: set ${ASSETS_ENV} "
            "to the assets/ folder of a checkout of the repository"
        )
    return root.joinpath(*parts)


def prompts_dir(env: Mapping[str, str] | None = None) -> Path:
    """The held-out prompt sets (`sd2 data prompt-sets` writes them, `sd2 bench` reads them)."""
    return asset_path("prompts", env=env)


def repo_root() -> Path | None:
    """The checkout the package runs from (pyproject.toml beside sd2/), else None (an installed copy)."""
    return _CHECKOUT if (_CHECKOUT / "pyproject.toml").is_file() else None


def repo_relative(path: str | Path, root: Path | None = None) -> str:
    """How a record names a file: relative to the repository root (`root`, default `repo_root()`) when
    it lies inside it, e.g. "assets/prompts/chat.jsonl", so a committed record reads the same on every
    machine; absolute when it lies outside. A relative path that names nothing on disk (a hub id) is
    kept as given."""
    given = Path(path)
    if not given.is_absolute() and not given.exists():
        return str(path)
    absolute = Path(os.path.abspath(given))
    return inside_repo(absolute, root) or str(absolute)


def inside_repo(path: Path, root: Path | None = None) -> str | None:
    """An absolute `path` relative to the repository root (`root`, default `repo_root()`), or None when it
    lies outside (or there is no checkout). Symbolic links in `path` are tried resolved too."""
    root = repo_root() if root is None else root
    if root is None or not path.is_absolute():
        return None
    for candidate in dict.fromkeys((path, path.resolve())):
        if candidate.is_relative_to(root):
            return candidate.relative_to(root).as_posix()
    return None
