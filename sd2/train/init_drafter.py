"""A fresh small Llama drafter sharing the verifier's tokenizer, embeddings projected from the verifier's."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True, kw_only=True)
class DrafterShape:
    """Architecture of a new drafter. 4 × 256 costs ≈ 1/12 of a SmolLM2-135M step on 2 CPU cores."""

    layers: int = 4
    hidden: int = 256
    ffn: int = 1024  # SwiGLU inner size (4× hidden)
    heads: int = 4
    kv_heads: int = 2


def new_drafter(verifier: nn.Module, shape: DrafterShape = DrafterShape(), seed: int = 0) -> LlamaForCausalLM:
    """Random transformer layers; tied embeddings = the verifier's, projected onto their top principal axes.

    The projection keeps the geometry of the verifier's token space, so the drafter starts with
    meaningful token similarities instead of noise (its layers still learn everything else). The random
    layers come from `seed` alone, and the process's global RNG is left as it was.
    """
    v_config = verifier.config
    config = LlamaConfig(
        vocab_size=v_config.vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=v_config.max_position_embeddings,
        rope_parameters=getattr(v_config, "rope_parameters", None),
        rms_norm_eps=v_config.rms_norm_eps,
        bos_token_id=v_config.bos_token_id,
        eos_token_id=v_config.eos_token_id,
        pad_token_id=getattr(v_config, "pad_token_id", None),
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):  # transformers initialises from the global RNG: seed a fork
        torch.manual_seed(seed)
        drafter = LlamaForCausalLM(config)
    with torch.no_grad():
        drafter.get_input_embeddings().weight.copy_(project_embeddings(verifier, shape.hidden))
    return drafter


@torch.no_grad()
def project_embeddings(verifier: nn.Module, hidden: int) -> torch.Tensor:
    """PCA of the verifier's input embeddings [V, D_v] → [V, hidden], rescaled to the init std 0.02."""
    embeddings = verifier.get_input_embeddings().weight.float().cpu()  # [V, D_v]
    centred = embeddings - embeddings.mean(0, keepdim=True)
    _, _, right = torch.linalg.svd(centred, full_matrices=False)  # right: [D_v, D_v]
    projected = centred @ right[:hidden].T  # [V, hidden]
    return projected * (0.02 / projected.std())
