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
_CHECKOUT_ASSETS = Path(__file__).resolve().parents[1] / "assets"  # beside the package in a checkout


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
