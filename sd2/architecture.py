"""The one place that knows where a model family keeps its decoder layers and MLPs."""

from __future__ import annotations

from torch import nn

# Families whose decoder layers live at `model.model.layers[i]` with a SwiGLU MLP
# `mlp.{gate_proj, up_proj, down_proj}`. SmolLM2 and SmolLM3 report `llama` / `smollm3`.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3"})


class UnsupportedArchitectureError(ValueError):
    """The model's layout is not one the steering hooks know how to reach."""


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """Return the decoder layers of a supported causal LM, refusing other shapes with a clear error."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported; sd2 steers {sorted(SUPPORTED_MODEL_TYPES)}"
        )
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise UnsupportedArchitectureError(f"{type(model).__name__} has no `model.layers` ModuleList")
    return layers


def mlp(model: nn.Module, layer: int) -> nn.Module:
    """Return the SwiGLU MLP of decoder layer `layer`; it must have separate gate/up/down projections."""
    layers = decoder_layers(model)
    if not 0 <= layer < len(layers):
        raise IndexError(f"layer {layer} out of range for a model with {len(layers)} layers")
    block = getattr(layers[layer], "mlp", None)
    missing = [name for name in ("gate_proj", "up_proj", "down_proj") if not hasattr(block, name)]
    if block is None or missing:
        raise UnsupportedArchitectureError(
            f"layer {layer} of {type(model).__name__} has no SwiGLU MLP with gate_proj/up_proj/down_proj "
            f"(missing {missing or ['mlp']})"
        )
    return block


def num_layers(model: nn.Module) -> int:
    """Number of decoder layers."""
    return len(decoder_layers(model))
