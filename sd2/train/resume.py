"""Loading a checkpoint's weights back into live training modules."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from sd2.steering import HEAD_WEIGHTS


def load_weights(recipe, folder: Path) -> None:
    """Copy model.safetensors (and steering.safetensors) from a verified checkpoint into the modules."""
    drafter_state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = recipe.drafter.load_state_dict(drafter_state, strict=False)
    tied = {"lm_head.weight"} if getattr(recipe.drafter.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"checkpoint {folder} does not fit the drafter: missing {missing}, unexpected {unexpected}"
        )
    if recipe.head is not None:
        recipe.head.load_state_dict(load_file(str(folder / HEAD_WEIGHTS)))
