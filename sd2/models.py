"""Loading verifier/drafter pairs (hub id or local folder) and checking that they share a tokenizer."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from sd2.architecture import decoder_layers, mlp
from sd2.devices import Placement
from sd2.draft_vocab import DraftVocab, ReducedHead, reduced_head_for
from sd2.embedded import EMBEDDED_VERIFIER, embedded_verifier_path
from sd2.steering import SteeringHead, has_steering_head
from sd2.verifier_embeddings import attach_verifier_embeddings, loading_weights

CARD_FILE = "sd2_card.json"  # provenance of a drafter checkpoint: recipe, data, steps, metrics
# Card key of a steering-only checkpoint (a --freeze-drafter run): {"folder": path relative to the
# checkpoint, "files": {weight file: sha256}} naming where its unchanged drafter weights live.
SHARED_WEIGHTS = "drafter_weights_from"

log = logging.getLogger(__name__)


class TokenizerMismatchError(ValueError):
    """Drafter and verifier do not share a vocabulary, so their distributions cannot be compared."""


def resolve_model_path(name_or_path: str | None, home: Path | None = None) -> str:
    """`None` or the embedded name → the converted SmolLM2 folder (under `home`, default `sd2_home()`);
    anything else is passed through."""
    if name_or_path in (None, "", EMBEDDED_VERIFIER, f"embedded:{EMBEDDED_VERIFIER}"):
        return str(embedded_verifier_path(home))
    return name_or_path


def verifier_label(name_or_path: str | None) -> str:
    """How cards name a verifier: its hub id or folder as given, or the embedded one's name."""
    return str(name_or_path) if name_or_path else f"{EMBEDDED_VERIFIER} (embedded)"


def load_causal_lm(name_or_path: str, placement: Placement) -> nn.Module:
    """Load any HF causal LM by hub id or folder, in eval mode, on the placement's device and dtype."""
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=placement.dtype)
    except OSError as err:
        raise FileNotFoundError(f"cannot load a model from {name_or_path!r}: {err}") from err
    decoder_layers(model)  # refuse unsupported families early, with a clear error
    if placement.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(placement.device)
        check_fits(name_or_path, model_bytes(model), free, total, placement)
    return model.to(placement.device).eval()


def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and buffers as loaded (its dtype)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


FIT_MARGIN = 0.9  # weights may take this share of a device's free memory; the rest is KV cache and work


def check_fits(name: str, needed: int, free: int, total: int, placement: Placement) -> None:
    """Refuse a model whose weights would not leave room on its one device: sd2 places each model on a
    single device (no device_map sharding a verifier over several GPUs)."""
    if needed <= FIT_MARGIN * free:
        return
    gib = 2**30
    raise ValueError(
        f"{name} needs {needed / gib:.1f} GiB for its weights in {placement.precision}, but "
        f"{placement.device} has {free / gib:.1f} GiB free of {total / gib:.1f} GiB: sd2 runs each model "
        "on one device (it does not shard a model over several GPUs); pick a smaller model, "
        "--dtype bf16, or a GPU with more memory"
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def drafter_weights_folder(path: str) -> str:
    """Where a drafter's model weights live: `path` itself, or, for a steering-only checkpoint, the
    folder its card names (SHARED_WEIGHTS), after checking those files against the card's SHA-256."""
    card_path = Path(path) / CARD_FILE
    if not card_path.is_file():
        return path  # a hub id or a plain HF folder
    shared = json.loads(card_path.read_text()).get(SHARED_WEIGHTS)
    if not shared:
        return path
    base = (Path(path) / shared["folder"]).resolve()
    for name, digest in shared["files"].items():
        weights = base / name
        if not weights.is_file():
            raise FileNotFoundError(f"{path} takes its drafter weights from {base}, where {name} is missing")
        if file_sha256(weights) != digest:
            raise ValueError(
                f"{path} takes its drafter weights from {base}, but {name} there has changed since "
                "(checksum mismatch): re-export the steering-only checkpoint"
            )
    return str(base)


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(name_or_path)


def check_same_vocabulary(
    verifier: nn.Module,
    verifier_tokenizer: PreTrainedTokenizerBase,
    drafter: nn.Module,
    drafter_tokenizer: PreTrainedTokenizerBase | None,
    drafter_name: str = "drafter",
) -> None:
    """Refuse a pair whose logits do not index the same tokens (same vocabulary and ids)."""
    v_size, d_size = verifier.config.vocab_size, drafter.config.vocab_size
    if v_size != d_size:
        raise TokenizerMismatchError(
            f"{drafter_name} has vocab_size {d_size} but the verifier has {v_size}: "
            "they must share a tokenizer"
        )
    if drafter_tokenizer is None:
        return
    v_vocab, d_vocab = verifier_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
    if v_vocab != d_vocab:
        differing = sorted(set(v_vocab.items()) ^ set(d_vocab.items()), key=str)[:3]
        raise TokenizerMismatchError(
            f"{drafter_name}'s tokenizer differs from the verifier's ({len(d_vocab)} vs {len(v_vocab)} "
            f"entries; e.g. {differing}): drafter and verifier must share the same vocabulary and ids"
        )


@dataclass
class Drafter:
    """A named drafter checkpoint: an HF model folder, optionally with an SD² steering head."""

    name: str
    model: nn.Module
    head: SteeringHead | None
    path: str
    card: dict = field(default_factory=dict)
    draft_head: ReducedHead | None = None  # the LM head over a reduced draft vocabulary, when it has one

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def load_drafter(
    name: str,
    path: str,
    placement: Placement,
    verifier: nn.Module,
    verifier_tokenizer: PreTrainedTokenizerBase,
    draft_vocab: bool = True,
) -> Drafter:
    """Load a drafter folder (HF model + optional steering head + card) and check it fits the verifier.
    A steering-only folder takes its model weights from the folder its card names. With `draft_vocab`,
    a `draft_vocab.json` in the folder (or in the one its weights come from) restricts its LM head. A
    drafter whose card says it borrows the verifier's embeddings takes them from `verifier`."""
    weights = drafter_weights_folder(path)
    card = drafter_card(path)
    with loading_weights(card):
        model = load_causal_lm(weights, placement)
    attach_verifier_embeddings(model, card, verifier, name)
    drafter_tokenizer = _optional_tokenizer(path)
    check_same_vocabulary(verifier, verifier_tokenizer, model, drafter_tokenizer, drafter_name=name)
    head = (
        SteeringHead.load(path).to(placement.device, placement.dtype).eval()
        if has_steering_head(path)
        else None
    )
    if head is not None:
        _check_head_fits(head, verifier, model, name)
    vocab = drafter_vocab(path) if draft_vocab else None
    return Drafter(name, model, head, str(path), card, draft_head=reduced_head_for(model, vocab))


def drafter_card(path: str | Path) -> dict:
    """A drafter folder's card; {} for a hub id or a plain HF folder."""
    card_path = Path(path) / CARD_FILE
    return json.loads(card_path.read_text()) if card_path.is_file() else {}


def drafter_vocab(path: str | Path) -> DraftVocab | None:
    """The reduced draft vocabulary of a drafter folder: its own `draft_vocab.json`, else that of the
    folder its weights come from; None when neither has one (a hub id, a plain HF folder)."""
    if not Path(path).is_dir():
        return None
    return DraftVocab.load(path) or DraftVocab.load(drafter_weights_folder(str(path)))


def _optional_tokenizer(path: str) -> PreTrainedTokenizerBase | None:
    folder = Path(path)
    has_files = folder.is_dir() and any(
        (folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")
    )
    if folder.is_dir() and not has_files:
        return None  # a drafter folder may rely on the verifier's tokenizer
    return load_tokenizer(path)


def _check_head_fits(head: SteeringHead, verifier: nn.Module, drafter: nn.Module, name: str) -> None:
    cfg = head.config
    n_verifier = len(decoder_layers(verifier))
    problems = []
    if cfg.verifier_hidden != verifier.config.hidden_size:
        problems.append(
            f"verifier_hidden {cfg.verifier_hidden} ≠ verifier hidden {verifier.config.hidden_size}"
        )
    if any(not 0 <= i < n_verifier for i in cfg.verifier_layers):
        problems.append(f"verifier_layers {cfg.verifier_layers} outside 0..{n_verifier - 1}")
    if cfg.drafter_layers and cfg.drafter_ffn != mlp(drafter, cfg.drafter_layers[0]).up_proj.out_features:
        problems.append(f"drafter_ffn {cfg.drafter_ffn} ≠ the drafter's up_proj width")
    if problems:
        raise ValueError(f"steering head of drafter {name!r} does not fit this pair: " + "; ".join(problems))


def stop_token_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every EOS id the generation config or tokenizer declares (e.g. <|im_end|> for ChatML models)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list | tuple) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def context_length(model: nn.Module) -> int:
    return int(getattr(model.config, "max_position_embeddings", 2048))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
