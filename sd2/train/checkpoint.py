"""Drafter checkpoints: HF model folder + optional steering head + a JSON card, written atomically.

A checkpoint is complete only when its card lists every file with its SHA-256; it is written into a
staging folder beside the target and renamed into place, so readers never see a partial folder.
Loading verifies the card and refuses anything missing, partial or corrupt with a clear error.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from sd2.models import CARD_FILE
from sd2.steering import SteeringHead

TRAINER_STATE = "trainer_state.pt"  # optimiser, schedule, RNG and data position, for resuming


class CheckpointError(ValueError):
    """A checkpoint folder is missing, partial or corrupt."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_checkpoint(
    folder: str | Path,
    drafter: nn.Module,
    head: SteeringHead | None,
    card: dict,
    trainer_state: dict | None = None,
    tokenizer=None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the checkpoint atomically (staging folder + rename); `dtype` e.g. bf16 for shipping."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.staging-", dir=folder.parent))
    try:
        model = drafter if dtype is None else _cast_copy(drafter, dtype)
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if head is not None:
            head.save(staging)
        if trainer_state is not None:
            torch.save(trainer_state, staging / TRAINER_STATE)
        files = {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
        (staging / CARD_FILE).write_text(json.dumps({**card, "files": files}, indent=2, sort_keys=True))
        _swap_into_place(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    import copy

    return copy.deepcopy(model).to(dtype)


def _swap_into_place(staging: Path, folder: Path) -> None:
    """Replace `folder` by `staging`; the old copy is removed only once the new one is in place."""
    retired = folder.with_name(f".{folder.name}.retired")
    shutil.rmtree(retired, ignore_errors=True)
    if folder.exists():
        folder.rename(retired)
    staging.rename(folder)
    shutil.rmtree(retired, ignore_errors=True)


def verify_checkpoint(folder: str | Path) -> dict:
    """Return the card of a complete checkpoint; raise CheckpointError naming what is wrong."""
    folder = Path(folder)
    card_path = folder / CARD_FILE
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} does not exist")
    if not card_path.is_file():
        raise CheckpointError(f"checkpoint {folder} is partial: {CARD_FILE} is missing")
    try:
        card = json.loads(card_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint {folder} has a corrupt {CARD_FILE}: {err}") from err
    for name, digest in card.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder} is partial: {name} is missing")
        if _sha256(path) != digest:
            raise CheckpointError(f"checkpoint {folder} is corrupt: {name} does not match its checksum")
    if "files" not in card or "config.json" not in card["files"]:
        raise CheckpointError(
            f"checkpoint {folder} is not a drafter checkpoint: its card lists no model files"
        )
    return card


def load_trainer_state(folder: str | Path) -> dict | None:
    path = Path(folder) / TRAINER_STATE
    return torch.load(path, weights_only=False) if path.is_file() else None


def export_checkpoint(source: str | Path, target: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """A shippable copy of a verified checkpoint: drafter weights cast to `dtype` (the steering head
    stays fp32: it is small and steers every block), no trainer state, the same card."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sd2.steering import has_steering_head

    card = verify_checkpoint(source)
    drafter = AutoModelForCausalLM.from_pretrained(source)
    head = SteeringHead.load(source) if has_steering_head(source) else None
    tokenizer = AutoTokenizer.from_pretrained(source) if (Path(source) / "tokenizer.json").is_file() else None
    card = {key: value for key, value in card.items() if key != "files"} | {
        "exported_from": str(source),
        "dtype": str(dtype).removeprefix("torch."),
    }
    return save_checkpoint(target, drafter, head, card, tokenizer=tokenizer, dtype=dtype)
