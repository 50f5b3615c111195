"""Drafters trained for the embedded verifier and shipped in `assets/drafters/` (see its README and
docs/drafters.md)."""

from __future__ import annotations

from pathlib import Path

from sd2.models import CARD_FILE
from sd2.paths import assets_dir

PREFERRED_ORDER = ("sd2", "distilled", "pretrained", "sd2-frozen")  # what a demo should show first


def shipped_drafters(root: Path | None = None) -> dict[str, str]:
    """{name: folder} of every complete drafter checkpoint under `root` (default: the assets' drafters/,
    `sd2.paths`), best demo first; empty when there is none."""
    if root is None:
        assets = assets_dir()
        root = assets / "drafters" if assets is not None else None
    if root is None or not root.is_dir():
        return {}
    complete = [p for p in root.iterdir() if (p / CARD_FILE).is_file() and (p / "config.json").is_file()]
    found = {p.name: str(p) for p in complete}
    rank = {name: i for i, name in enumerate(PREFERRED_ORDER)}
    return {name: found[name] for name in sorted(found, key=lambda n: (rank.get(n, len(rank)), n))}
