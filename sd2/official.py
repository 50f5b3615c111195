"""Import the SD² authors' released checkpoints (ETH-DISCO/SD-square layout) into an sd2 drafter folder.

Their `pytorch_model.bin` is a Lightning state dict without the verifier:
    d_base.*                              the drafter, with an extra `.l.` inside each wrapped layer
    guidance_embd_layer.orig.{weight,bias} W_hml [D_v, 3·D_v] and b [D_v]; column blocks follow the
                                          *sorted* `v_layer` indices (transformers' hidden_states[i])
    latent_mod_prep.norm.{weight,bias}     the LayerNorm (eps 1e-5)
    latent_mod_prep.w_guide.weight         W_s stacked [L·F, D_v]; block l steers the l-th steered layer
and `config.json` holds the hyper-parameters (`verifier`, `drafter`, `v_layer`, `d_layer`, `ngram`, …).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from sd2.steering import SteeringConfig, SteeringHead
from sd2.train.checkpoint import save_checkpoint

_WRAPPED_LAYER = re.compile(r"^model\.layers\.(\d+)\.l\.")
SUPPORTED_GUIDE_METHODS = ("merged",)  # the paper's SD²; "simple" and "advanced" are its ablations


def convert_official(source: str | Path, target: str | Path, drafter_config: str | None = None) -> Path:
    """Write an sd2 checkpoint (HF drafter + steering head + card) from an official checkpoint folder.

    drafter_config: hub id or folder of the base drafter's config (default: the `drafter` hparam).
    """
    source = Path(source)
    hparams = json.loads((source / "config.json").read_text())
    method = hparams.get("guide_method", "merged")
    if method not in SUPPORTED_GUIDE_METHODS:
        raise ValueError(
            f"{source}: guide_method {method!r} is an ablation sd2 does not implement (only "
            f"{', '.join(SUPPORTED_GUIDE_METHODS)}: the SD² bias on the up-projection)"
        )
    state = torch.load(source / "pytorch_model.bin", map_location="cpu", weights_only=True)
    drafter_state = {
        _WRAPPED_LAYER.sub(r"model.layers.\1.", key.removeprefix("d_base.")): value
        for key, value in state.items()
        if key.startswith("d_base.")
    }
    config = AutoConfig.from_pretrained(drafter_config or hparams["drafter"])
    drafter = AutoModelForCausalLM.from_config(config)
    missing, unexpected = drafter.load_state_dict(drafter_state, strict=False)
    tied = drafter.config.tie_word_embeddings  # only a tied head may be absent: it is the embedding
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        raise ValueError(
            f"{source} does not fit {config.model_type}: missing {missing}, unexpected {unexpected}"
        )
    head = _head(state, hparams, config) if "latent_mod_prep.w_guide.weight" in state else None
    card = {
        "imported_from": str(source),
        "official_hparams": hparams,
        "base_verifier": hparams.get("verifier"),
    }
    return save_checkpoint(target, drafter, head, card)


def _head(state: dict, hparams: dict, drafter_config) -> SteeringHead:
    w_hml = state["guidance_embd_layer.orig.weight"]  # [D_v, 3·D_v]
    w_guide = state["latent_mod_prep.w_guide.weight"]  # [L·F, D_v]
    d_v, ffn = w_hml.shape[0], drafter_config.intermediate_size
    layers = _steered_layers(hparams.get("d_layer", "all"), drafter_config.num_hidden_layers)
    head = SteeringHead(
        SteeringConfig(
            verifier_hidden=d_v,
            drafter_ffn=ffn,
            verifier_layers=tuple(sorted(hparams["v_layer"])),
            drafter_layers=layers,
            extra={"k": hparams.get("ngram", 8), "source": "official"},
        )
    )
    head.load_state_dict(
        {
            "hml.weight": w_hml,
            "hml.bias": state["guidance_embd_layer.orig.bias"],
            "norm.weight": state["latent_mod_prep.norm.weight"],
            "norm.bias": state["latent_mod_prep.norm.bias"],
            "w_s": w_guide.view(len(layers), ffn, d_v),
        }
    )
    return head


def _steered_layers(d_layer, n_layers: int) -> tuple[int, ...]:
    if d_layer == "all":
        return tuple(range(n_layers))
    return (d_layer,) if isinstance(d_layer, int) else tuple(d_layer)
