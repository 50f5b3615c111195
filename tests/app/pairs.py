"""Tiny drafters with different acceptance for the UI tests: pretrained, distilled and SD² stand-ins.

The tiny verifier is random, so "training" is faked by construction: the distilled and SD² drafters
are noisy copies of the verifier (the less noise, the higher the acceptance), and the SD² one carries
a steering head with non-zero weights, so its steering plot has data. Each has an sd2 card naming its
recipe, which is what the UI reads to pick defaults.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from sd2.models import CARD_FILE
from sd2.steering import new_head_for

NOISE = {"distilled": 0.35, "sd2": 0.2}  # noise std relative to each weight tensor's own std


def _noisy_copy(verifier_dir: Path, target: Path, std: float, seed: int) -> LlamaForCausalLM:
    model = LlamaForCausalLM.from_pretrained(verifier_dir).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * std * param.std())
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (verifier_dir / name).exists():
            shutil.copy(verifier_dir / name, target / name)
    return model


def save_ui_drafters(root: Path, verifier_dir: Path, drafter_dir: Path) -> dict[str, Path]:
    """Write `pretrained`, `distilled` and `sd2` drafter folders under root; return name → folder."""
    pretrained = root / "pretrained"
    shutil.copytree(drafter_dir, pretrained)
    folders = {"pretrained": pretrained}
    for seed, (name, std) in enumerate(NOISE.items()):
        model = _noisy_copy(verifier_dir, root / name, std, seed)
        folders[name] = root / name
        if name == "sd2":
            head = new_head_for(LlamaForCausalLM.from_pretrained(verifier_dir), model)
            with torch.no_grad():
                head.w_s.normal_(0, 0.02, generator=torch.Generator().manual_seed(7))
            head.save(root / name)
    recipes = {"pretrained": "pretrain", "distilled": "distill", "sd2": "sd2"}
    for name, folder in folders.items():
        (folder / CARD_FILE).write_text(json.dumps({"recipe": recipes[name], "note": "UI test fixture"}))
    return folders
