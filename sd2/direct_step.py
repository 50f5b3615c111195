"""The drafter's one-token step run directly on its modules' kernels, without transformers' call stack.

A small drafter's batch-1 step on a CPU is bound by Python, not arithmetic: the shipped 4-layer drafters
spend about 4 ms a step of which the kernels (linears, attention, norms) take well under half; the rest
is the model's call stack — module calls and hooks, mask and position bookkeeping, the cache's dispatch.
`DirectDraftStep` runs the same computation as a straight loop over the decoder layers, calling each
module's own `forward` (so a linear keeps its batch-invariant kernel and packed weight, attention the
engine's registered kernel) on the same rollback cache, and adds the steering bias where the eager step's
hook adds it. Every operation and its order are the model's own, so its logits equal the eager step's bit
for bit (tested): it changes how fast drafts come, never which — batched rows (sd2.batching, eager) and
solo rows still draft alike.

Forwards of several tokens (the prompt, a block's 2-token first step) and drafters of another shape run
eagerly: `supports_direct_step` says which drafters it takes (Llama-shaped decoders: no sliding window,
SwiGLU MLP, no norms inside attention; and no forward hooks, which its direct calls would skip — an
instrumented drafter runs eagerly).

Dims: D hidden, H heads, H_kv key/value heads, Dh head dim, F MLP width, V vocabulary (N reduced).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from sd2.draft_step import EagerDraftStep
from sd2.fused_linear import fused
from sd2.int8_weights import int8_fused
from sd2.steering import biased, steered

DIRECT_MODEL_TYPES = ("llama",)  # decoders whose layer is exactly the loop of `DirectDraftStep._layer`


def supports_direct_step(drafter: nn.Module) -> bool:
    """Whether `DirectDraftStep` computes exactly what this drafter's own forward computes."""
    return why_not_direct(drafter) is None


def why_not_direct(drafter: nn.Module) -> str | None:
    """Why the direct step would not compute what this drafter's own forward computes, or None."""
    config = drafter.config
    decoder = drafter.get_decoder()
    if config.model_type not in DIRECT_MODEL_TYPES:
        return f"its model type is {config.model_type!r}, not one of {', '.join(DIRECT_MODEL_TYPES)}"
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "sliding_window", None):
        return "it is not a SwiGLU decoder with full attention"
    if config._attn_implementation not in ALL_ATTENTION_FUNCTIONS or not hasattr(decoder, "rotary_emb"):
        return f"its attention ({config._attn_implementation!r}) is not a registered attention function"
    if len(decoder.layers) != config.num_hidden_layers:
        return "it runs fewer layers than it holds"
    if _hooked(drafter):
        return "a module of it has forward hooks (the direct step would skip them)"
    return None


def _hooked(model: nn.Module) -> bool:
    """Forward hooks anywhere on the model, or global ones: calls the direct step would bypass."""
    if module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks:
        return True
    return any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


class DirectDraftStep(EagerDraftStep):
    """An eager step whose one-token forwards skip the model's call stack (module docstring)."""

    def __init__(self, drafter: nn.Module, draft_head: nn.Module | None = None):
        reason = why_not_direct(drafter)
        if reason is not None:
            raise ValueError(
                f"the direct draft step cannot run this drafter: {reason}; use --draft-step eager"
            )
        super().__init__(drafter, draft_head)
        self._decoder = drafter.get_decoder()
        self._attention: Callable = ALL_ATTENTION_FUNCTIONS[drafter.config._attn_implementation]
        self._rotate = sys.modules[type(self._decoder.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self._biases: Mapping[int, torch.Tensor] = {}  # layer → [2, F] while steering
        self._qkv = [
            _projections(layer.self_attn, "q_proj", "k_proj", "v_proj") for layer in self._decoder.layers
        ]
        self._gate_up = [_projections(layer.mlp, "gate_proj", "up_proj") for layer in self._decoder.layers]

    @contextmanager
    def steering(self, biases: Mapping[int, torch.Tensor]) -> Iterator[None]:
        """The biases for the steps inside; an eager forward (2 tokens) gets them through sd2.steering's
        hooks, registered for that forward only."""
        self._biases = dict(biases)
        try:
            yield
        finally:
            self._biases = {}

    def logits(self, inputs) -> torch.Tensor:
        if len(inputs) != 1:
            with steered(self.model, self._biases):
                return super().logits(inputs)
        decoder = self._decoder
        ids = torch.tensor([list(inputs)], device=decoder.embed_tokens.weight.device)  # [1, 1]
        position = torch.tensor([[self.cache.get_seq_length()]], device=ids.device)  # [1, 1]
        hidden = decoder.embed_tokens.forward(ids)  # [1, 1, D]
        rotary = decoder.rotary_emb.forward(hidden, position_ids=position)  # cos, sin [1, 1, Dh]
        for index, layer in enumerate(decoder.layers):
            hidden = self._layer(index, layer, hidden, rotary)
        hidden = decoder.norm.forward(hidden)
        if self.draft_head is not None:
            return self.draft_head(hidden[0, -1])  # [N]
        return self.model.lm_head.forward(hidden[:, -1:, :])[0, -1]  # [V]

    def _layer(
        self, index: int, layer: nn.Module, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """One decoder layer on one token [1, 1, D] → [1, 1, D], in the model's own order of operations
        (transformers' LlamaDecoderLayer, LlamaAttention, LlamaMLP)."""
        attention, mlp = layer.self_attn, layer.mlp
        residual = hidden
        hidden = layer.input_layernorm.forward(hidden)
        shape = (1, 1, -1, attention.head_dim)
        query, key, value = (part.view(shape).transpose(1, 2) for part in self._qkv[index](hidden))
        # query [1, H, 1, Dh], key and value [1, H_kv, 1, Dh]
        query, key = self._rotate(query, key, *rotary)
        keys, values = self.cache.layers[index].update(key, value)
        out, _ = self._attention(attention, query, keys, values, None, dropout=0.0, scaling=attention.scaling)
        out = attention.o_proj.forward(out.reshape(1, 1, -1).contiguous())  # [1, 1, D]
        hidden = residual + out
        residual = hidden
        hidden = layer.post_attention_layernorm.forward(hidden)
        gate, up = self._gate_up[index](hidden)  # [1, 1, F] each
        bias = self._biases.get(index)
        if bias is not None:
            up = biased(up, bias)  # as sd2.steering's hook adds it
        hidden = mlp.down_proj.forward(mlp.act_fn(gate) * up)
        return residual + hidden


def _projections(module: nn.Module, *names: str) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """The named linears of a module, which read one input, as one call: a fused product where it keeps
    every bit (sd2.fused_linear, or sd2.int8_weights for int8 linears), else each linear's own forward."""
    linears = [getattr(module, name) for name in names]
    together = fused(linears) or int8_fused(linears)
    if together is not None:
        return together
    return lambda x: tuple(linear.forward(x) for linear in linears)
