"""Drafters that borrow the verifier's token embeddings and LM head instead of storing a copy.

A drafter cut from the verifier (`sd2 train prune`) and fine-tuned with `--freeze-embeddings` keeps the
verifier's embedding matrix bit for bit: SmolLM2-135M's is 49 152 × 576, 57 MB in bf16, two thirds of a
4-layer cut. Its export (`sd2 train export --embeddings-from-verifier`) stores everything else and records
in its card (VERIFIER_EMBEDDINGS) the matrix's shape and the SHA-256 of its bf16 bytes; loading takes the
matrix from the verifier in hand and refuses a verifier whose matrix differs. SmolLM2 ties its LM head to
its embeddings, so one matrix serves both; an untied LM head is borrowed beside them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator

import torch
from torch import nn

# Card key: {"verifier": the name it was cut from, "tensors": {role: {"shape": [...], "sha256": digest of
# its bf16 bytes}}}; roles "input" (the token embeddings) and "output" (the LM head, where it is not tied).
VERIFIER_EMBEDDINGS = "embeddings_from_verifier"


def borrowed_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """role → weight of what a borrowing drafter takes from its verifier: the token embeddings, and the LM
    head where it is not tied to them."""
    weights = {"input": model.get_input_embeddings().weight}
    head = model.get_output_embeddings()
    if head is not None and head.weight is not weights["input"]:
        weights["output"] = head.weight
    return weights


def borrowed_keys(model: nn.Module) -> tuple[str, ...]:
    """The state-dict keys of `borrowed_weights` (a tied LM head's key included): what an export omits."""
    pointers = {weight.data_ptr() for weight in borrowed_weights(model).values()}
    return tuple(key for key, value in model.state_dict().items() if value.data_ptr() in pointers)


def embedding_digest(weight: torch.Tensor) -> str:
    """SHA-256 of a matrix's bf16 bytes: the same for a verifier loaded in fp32 or in bf16."""
    as_bf16 = weight.detach().to("cpu", torch.bfloat16).contiguous()
    return hashlib.sha256(as_bf16.view(torch.int16).numpy().tobytes()).hexdigest()


def card_entry(drafter: nn.Module, verifier: nn.Module, verifier_name: str) -> dict:
    """The VERIFIER_EMBEDDINGS card entry of `drafter`, after checking that what it would borrow is
    exactly the verifier's (in the drafter's dtype), tied alike."""
    mine, theirs = borrowed_weights(drafter), borrowed_weights(verifier)
    if mine.keys() != theirs.keys():
        raise ValueError(
            "the drafter and the verifier do not tie their LM head alike: the drafter cannot borrow them"
        )
    for role, weight in mine.items():
        other = theirs[role]
        # in the drafter's dtype: a bf16 export of a cut holds the verifier's matrix rounded to bf16
        if weight.shape != other.shape or not torch.equal(
            weight.detach().cpu(), other.detach().cpu().to(weight.dtype)
        ):
            raise ValueError(
                f"the drafter's {_NAMES[role]} are not the verifier's bit for bit ({_shape(weight)} "
                f"against {_shape(other)}): only a drafter cut from this verifier and trained with "
                "--freeze-embeddings can borrow them"
            )
    tensors = {
        role: {"shape": list(weight.shape), "sha256": embedding_digest(weight)}
        for role, weight in theirs.items()
    }
    return {"verifier": verifier_name, "tensors": tensors}


_NAMES = {"input": "token embeddings", "output": "LM head"}


def _shape(weight: torch.Tensor) -> str:
    return " × ".join(map(str, weight.shape))


def borrows_embeddings(card: dict) -> bool:
    return bool(card.get(VERIFIER_EMBEDDINGS))


@contextlib.contextmanager
def loading_weights(card: dict) -> Iterator[None]:
    """Around loading a drafter's weights: a borrowing drafter's file lacks its embeddings by design, so
    transformers' report of them as "missing, newly initialized" is silenced (attach fills them in)."""
    if not borrows_embeddings(card):
        yield
        return
    report = logging.getLogger("transformers.modeling_utils")
    level = report.level
    report.setLevel(logging.ERROR)
    try:
        yield
    finally:
        report.setLevel(level)


@torch.no_grad()
def attach_verifier_embeddings(model: nn.Module, card: dict, verifier: nn.Module | None, name: str) -> None:
    """Give a borrowing drafter (its card has VERIFIER_EMBEDDINGS) the verifier's embeddings and LM head,
    in the drafter's own device and dtype, after checking them against the card; a no-op for any other
    drafter."""
    entry = card.get(VERIFIER_EMBEDDINGS)
    if not entry:
        return
    if verifier is None:
        raise ValueError(
            f"{name} takes its token embeddings and LM head from its verifier ({entry['verifier']}): "
            "load it beside that verifier"
        )
    theirs, mine = borrowed_weights(verifier), borrowed_weights(model)
    for role, expected in entry["tensors"].items():
        weight = theirs.get(role)
        if (
            weight is None
            or list(weight.shape) != expected["shape"]
            or embedding_digest(weight) != expected["sha256"]
        ):
            raise ValueError(
                f"{name} takes its {_NAMES[role]} from the verifier it was cut from ({entry['verifier']}, "
                f"{' × '.join(map(str, expected['shape']))}), but this verifier's differ (checksum "
                "mismatch): pair it with that verifier"
            )
        mine[role].copy_(weight)
