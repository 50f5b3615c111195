"""Drafter checkpoints: HF model folder + optional steering head + a JSON card, written atomically.

A checkpoint is complete only when its card lists every file with its SHA-256; it is written into a
staging folder beside the target and renamed into place, so readers never see a partial folder.
Loading verifies the card and refuses anything missing, partial or corrupt with a clear error.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from sd2.draft_vocab import DraftVocab
from sd2.models import CARD_FILE, SHARED_WEIGHTS, drafter_vocab, drafter_weights_folder, file_sha256
from sd2.steering import SteeringHead
from sd2.verifier_embeddings import (
    VERIFIER_EMBEDDINGS,
    attach_verifier_embeddings,
    borrowed_keys,
    card_entry,
    loading_weights,
)

TRAINER_STATE = "trainer_state.pt"  # optimiser, schedule, RNG and data position, for resuming


class CheckpointError(ValueError):
    """A checkpoint folder is missing, partial or corrupt."""


def save_checkpoint(
    folder: str | Path,
    drafter: nn.Module,
    head: SteeringHead | None,
    card: dict,
    trainer_state: dict | None = None,
    tokenizer=None,
    dtype: torch.dtype | None = None,
    with_weights: bool = True,
    draft_vocab: DraftVocab | None = None,
    omit: tuple[str, ...] = (),
) -> Path:
    """Write the checkpoint atomically (staging folder + rename); `dtype` e.g. bf16 for shipping.
    `with_weights=False` writes the model's config only (a steering-only checkpoint whose card says
    where its drafter weights are). `draft_vocab`: the reduced draft vocabulary to ship with it.
    `omit`: state-dict keys left out of the weights (those the card says come from elsewhere)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.staging-", dir=folder.parent))
    try:
        if with_weights:
            model = drafter if dtype is None else _cast_copy(drafter, dtype)
            kept = {key: value for key, value in model.state_dict().items() if key not in omit}
            model.save_pretrained(staging, state_dict=kept if omit else None)
        else:
            drafter.config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if head is not None:
            head.save(staging)
        if draft_vocab is not None:
            draft_vocab.save(staging)
        if trainer_state is not None:
            torch.save(trainer_state, staging / TRAINER_STATE)
        files = {p.name: file_sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
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


def sweep_interrupted_saves(parent: str | Path, min_age_s: float = 900) -> list[Path]:
    """Clean up after saves a dead process left in `parent`: staging folders are removed, and a retired
    copy is put back where the swap had already moved the old checkpoint away (else removed). Only
    folders untouched for `min_age_s` are swept, so a save still under way elsewhere is left alone.
    Returns the folders removed or restored."""
    parent, swept = Path(parent), []
    if not parent.is_dir():
        return swept
    cutoff = time.time() - min_age_s
    for path in sorted(parent.glob(".*.staging-*")) + sorted(parent.glob(".*.retired")):
        if not path.is_dir() or path.stat().st_mtime > cutoff:
            continue
        target = parent / path.name[1:].removesuffix(".retired")
        if path.name.endswith(".retired") and not target.exists():
            path.rename(target)
        else:
            shutil.rmtree(path, ignore_errors=True)
        swept.append(path)
    return swept


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
        if file_sha256(path) != digest:
            raise CheckpointError(f"checkpoint {folder} is corrupt: {name} does not match its checksum")
    if "files" not in card or "config.json" not in card["files"]:
        raise CheckpointError(
            f"checkpoint {folder} is not a drafter checkpoint: its card lists no model files"
        )
    try:
        drafter_weights_folder(str(folder))
    except (OSError, ValueError) as err:
        raise CheckpointError(str(err)) from err
    return card


def load_trainer_state(folder: str | Path) -> dict | None:
    path = Path(folder) / TRAINER_STATE
    # on the CPU: a state saved on cuda:N loads on any machine; the optimiser moves it to its parameters
    return torch.load(path, map_location="cpu", weights_only=False) if path.is_file() else None


def checkpoint_tokenizer(folder: str | Path):
    """The tokenizer a checkpoint folder ships, or None when it has none."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder) if (Path(folder) / "tokenizer.json").is_file() else None


def export_checkpoint(
    source: str | Path,
    target: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    share_drafter_with: str | Path | None = None,
    verifier: nn.Module | None = None,
    verifier_name: str = "the verifier",
    borrow_embeddings: bool = False,
) -> Path:
    """A shippable copy of a verified checkpoint: drafter weights cast to `dtype` (the steering head
    stays fp32: it is small and steers every block), its draft vocabulary, no trainer state, the same
    card.

    `share_drafter_with` (a --freeze-drafter run): when the cast drafter weights equal those of that
    exported checkpoint, store only the head and point the card at its weights instead of a copy.

    `borrow_embeddings` (a --freeze-embeddings run of a drafter cut from `verifier`, which the card
    names `verifier_name`): when the drafter's token embeddings are exactly the verifier's, store no
    copy; loading takes them from the verifier (sd2.verifier_embeddings). A checkpoint that already
    borrows them needs `verifier` to be exported."""
    from transformers import AutoModelForCausalLM

    from sd2.steering import has_steering_head

    if borrow_embeddings and (verifier is None or share_drafter_with is not None):
        raise ValueError("borrowing the verifier's embeddings needs the verifier and no shared drafter")
    card = verify_checkpoint(source)
    with loading_weights(card):
        drafter = AutoModelForCausalLM.from_pretrained(drafter_weights_folder(str(source)))
    attach_verifier_embeddings(drafter, card, verifier, str(source))
    head = SteeringHead.load(source) if has_steering_head(source) else None
    tokenizer = checkpoint_tokenizer(source)
    dropped = ("files", SHARED_WEIGHTS, VERIFIER_EMBEDDINGS)  # what this export decides anew
    kept = {key: value for key, value in card.items() if key not in dropped}
    card = kept | {"exported_from": str(source), "dtype": str(dtype).removeprefix("torch.")}
    vocab = drafter_vocab(source)
    if borrow_embeddings:
        card[VERIFIER_EMBEDDINGS] = card_entry(drafter, verifier, verifier_name)
    if share_drafter_with is None:
        return save_checkpoint(
            target,
            drafter,
            head,
            card,
            tokenizer=tokenizer,
            dtype=dtype,
            draft_vocab=vocab,
            omit=borrowed_keys(drafter) if borrow_embeddings else (),
        )
    drafter.to(dtype)  # in place: compared in the shipped dtype, and config.json records it
    card[SHARED_WEIGHTS] = _shared_weights(drafter, Path(share_drafter_with), Path(target))
    return save_checkpoint(
        target, drafter, head, card, tokenizer=tokenizer, dtype=dtype, with_weights=False, draft_vocab=vocab
    )


def _same_tensor(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and a.dtype == b.dtype and torch.equal(a, b)


def _shared_weights(drafter: nn.Module, base: Path, target: Path) -> dict:
    """The SHARED_WEIGHTS card entry, after checking that `base` holds exactly these weights."""
    from transformers import AutoModelForCausalLM

    base_card = verify_checkpoint(base)
    if SHARED_WEIGHTS in base_card:
        raise CheckpointError(
            f"{base} itself borrows its drafter weights: share those of {base_card[SHARED_WEIGHTS]}"
        )
    theirs = AutoModelForCausalLM.from_pretrained(base).state_dict()
    mine = drafter.state_dict()
    differing = sorted(name for name, t in mine.items() if not _same_tensor(theirs.get(name), t))
    if differing:
        raise CheckpointError(
            f"the drafter weights differ from those of {base} ({len(differing)} tensors, e.g. "
            f"{differing[0]}): only a --freeze-drafter run from that checkpoint can share them"
        )
    weights = {name: digest for name, digest in base_card["files"].items() if name.startswith("model")}
    return {
        "folder": os.path.relpath(base.resolve(), target.resolve()),  # resolved against the checkpoint
        "files": weights,
    }
