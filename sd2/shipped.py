"""Drafters trained for the embedded verifier and shipped in `assets/drafters/` (see its README)."""

from __future__ import annotations

from pathlib import Path

from sd2.models import CARD_FILE

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "assets" / "drafters"
PREFERRED_ORDER = ("sd2", "distilled", "pretrained", "sd2-frozen")  # what a demo should show first


def shipped_drafters(root: Path | None = None) -> dict[str, str]:
    """{name: folder} of every complete drafter checkpoint under assets/drafters, best demo first."""
    root = SHIPPED_DIR if root is None else root
    if not root.is_dir():
        return {}
    complete = [p for p in root.iterdir() if (p / CARD_FILE).is_file() and (p / "config.json").is_file()]
    found = {p.name: str(p) for p in complete}
    rank = {name: i for i, name in enumerate(PREFERRED_ORDER)}
    return {name: found[name] for name in sorted(found, key=lambda n: (rank.get(n, len(rank)), n))}
