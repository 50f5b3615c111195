"""The SD² steering head and its injection into a drafter (docs/math.md#the-steering-vector).

    g      = W_hml [h_low; h_mid; h_high] + b_hml        W_hml [D_v, 3·D_v], initialised to [I | I | I], b = 0
    u      = LayerNorm(g)                                (as in the official implementation)
    bias_l = W_s^(l) u                                   W_s^(l) [F_d, D_v], zero-initialised
    MLP_l(a) = down( silu(gate(a)) ⊙ (up(a) + bias_l) )  a forward hook on `mlp.up_proj`

h_i is the residual stream entering verifier decoder layer i (transformers' `hidden_states[i]`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from sd2.architecture import decoder_layers, mlp
from sd2.invariant import invariant_product

HEAD_WEIGHTS = "steering.safetensors"
HEAD_CONFIG = "steering.json"
DEFAULT_DEPTHS = (0.1, 0.5, 0.9)  # low/mid/high as a fraction of verifier depth (paper: 3, 16, 29 of 32)


def default_verifier_layers(n_layers: int, depths: Sequence[float] = DEFAULT_DEPTHS) -> tuple[int, ...]:
    """Depth-relative feature layers, e.g. (3, 15, 27) for 30 layers and (3, 16, 29) for 32."""
    return tuple(min(max(round(d * n_layers), 0), n_layers - 1) for d in depths)


@dataclass(frozen=True)
class SteeringConfig:
    """Shape of a steering head: which verifier states feed it and which drafter layers it steers."""

    verifier_hidden: int  # D_v
    drafter_ffn: int  # F_d, the width of the drafter's up_proj output
    verifier_layers: tuple[int, ...]  # hidden_states indices for [h_low; h_mid; h_high]
    drafter_layers: tuple[int, ...]  # drafter decoder layers that receive a bias (paper: all)
    layernorm_eps: float = 1e-5  # torch's LayerNorm default, as in the official head
    extra: dict = field(default_factory=dict)  # free-form provenance (k, recipe…), saved with the head

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SteeringConfig:
        raw = json.loads(text)
        raw["verifier_layers"] = tuple(raw["verifier_layers"])
        raw["drafter_layers"] = tuple(raw["drafter_layers"])
        return cls(**raw)


class SteeringHead(nn.Module):
    """Maps verifier features [..., n·D_v] to per-layer up_proj biases [..., L_s, F_d]."""

    def __init__(self, config: SteeringConfig):
        super().__init__()
        self.config = config
        d_v, n_feat = config.verifier_hidden, len(config.verifier_layers)
        # skip_init: Linear's random init would draw from (and advance) the process's global RNG, and
        # both of its tensors are set just below
        self.hml = nn.utils.skip_init(nn.Linear, n_feat * d_v, d_v)
        self.norm = nn.LayerNorm(d_v, eps=config.layernorm_eps)
        self.w_s = nn.Parameter(torch.zeros(len(config.drafter_layers), config.drafter_ffn, d_v))
        with torch.no_grad():  # g = h_low + h_mid + h_high at init
            self.hml.weight.copy_(torch.eye(d_v).repeat(1, n_feat))
            self.hml.bias.zero_()

    def steering_vector(self, features: torch.Tensor) -> torch.Tensor:
        """g = W_hml features + b. features: [..., n·D_v] → [..., D_v], in the head's dtype (a bf16
        verifier may feed an fp32 head, e.g. a training run's)."""
        return self.hml(features.to(self.hml.weight.dtype))

    def biases(self, vector: torch.Tensor) -> torch.Tensor:
        """Per-layer biases from a steering vector. vector: [..., D_v] → [..., L_s, F_d]."""
        normed = self.norm(vector)  # [..., D_v]
        layers, ffn, _ = self.w_s.shape
        # one product with every layer's W_s stacked: [..., L_s·F_d] (cheaper than an einsum per call)
        return F.linear(normed, self.w_s.flatten(0, 1)).unflatten(-1, (layers, ffn))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Per-layer biases. features: [..., n·D_v] → [..., L_s, F_d]."""
        return self.biases(self.steering_vector(features))

    def steer_rows(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoding's steering: the vectors [R, D_v] and biases [R, L_s, F_d] of R anchor states
        [R, n·D_v] (R ≤ MAX_ROWS), each row the same bit for bit whatever the others are
        (sd2.invariant's probed products), so several requests' heads run as one product
        (sd2.batching). The same values as `forward` up to rounding."""
        rows = features.to(self.hml.weight.dtype)
        vectors = invariant_product(rows, self.hml.weight, self.hml.bias)  # [R, D_v]
        biases = invariant_product(self.norm(vectors), self.w_s)  # [R, L_s·F_d]
        return vectors, biases.unflatten(-1, tuple(self.w_s.shape[:2]))

    def save(self, folder: str | Path) -> None:
        """Write `steering.safetensors` + `steering.json` into folder (callers stage folders atomically)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: t.detach().float().contiguous().cpu() for name, t in self.state_dict().items()}
        save_file(tensors, folder / HEAD_WEIGHTS)
        (folder / HEAD_CONFIG).write_text(self.config.to_json())

    @classmethod
    def load(cls, folder: str | Path) -> SteeringHead:
        """Load a head saved by `save`; refuses missing or mismatched files with a clear error."""
        folder = Path(folder)
        for name in (HEAD_WEIGHTS, HEAD_CONFIG):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"steering head incomplete: {folder / name} is missing")
        head = cls(SteeringConfig.from_json((folder / HEAD_CONFIG).read_text()))
        try:
            head.load_state_dict(load_file(folder / HEAD_WEIGHTS))
        except (RuntimeError, OSError) as err:  # shape mismatch or a corrupt file
            raise ValueError(f"steering head in {folder} does not match {HEAD_CONFIG}: {err}") from err
        return head


def has_steering_head(folder: str | Path) -> bool:
    return (Path(folder) / HEAD_CONFIG).is_file()


def new_head_for(verifier: nn.Module, drafter: nn.Module, **extra) -> SteeringHead:
    """A fresh (zero-steering) head sized for this verifier/drafter pair, with default layer choice."""
    layers = decoder_layers(drafter)
    config = SteeringConfig(
        verifier_hidden=verifier.config.hidden_size,
        drafter_ffn=mlp(drafter, 0).up_proj.out_features,
        verifier_layers=default_verifier_layers(len(decoder_layers(verifier))),
        drafter_layers=tuple(range(len(layers))),
        extra=extra,
    )
    return SteeringHead(config)


def _add_bias(bias: torch.Tensor) -> Callable:
    """A forward hook adding `bias` ([F], [T_max, F] or [B, T, F]) to up_proj's output [B, T, F].

    With a [T_max, F] bias the last T rows line up with the T positions fed in this call, so one
    registration serves a 2-token first draft step (old and new anchors) and later 1-token steps.
    """

    def hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        return biased(output, bias)

    return hook


def biased(output: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """up_proj's output [B, T, F] plus a bias [F], [T_max, F] (its last T rows) or [B, T, F]."""
    rows = bias[-output.shape[1] :] if bias.dim() == 2 else bias
    return output + rows.to(output.dtype)  # the drafter keeps its dtype whatever the head's


@contextmanager
def steered(drafter: nn.Module, biases: dict[int, torch.Tensor]) -> Iterator[nn.Module]:
    """Add biases[l] to the output of up_proj in drafter layer l: down(silu(gate(a)) * (up(a) + b)).

    Hooks are removed on exit, also when the body raises.
    """
    handles = [mlp(drafter, layer).up_proj.register_forward_hook(_add_bias(b)) for layer, b in biases.items()]
    try:
        yield drafter
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def captured_states(verifier: nn.Module, layers: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Record the residual stream entering each listed verifier layer (= transformers' hidden_states[i]).

    Yields a dict filled during forwards: {layer: [B, T, D_v]} (the latest call's inputs).
    """
    store: dict[int, torch.Tensor] = {}
    modules = decoder_layers(verifier)
    handles = [modules[i].register_forward_pre_hook(_record(store, i), with_kwargs=True) for i in set(layers)]
    try:
        yield store
    finally:
        for handle in handles:
            handle.remove()


def _record(store: dict[int, torch.Tensor], layer: int) -> Callable:
    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        store[layer] = args[0] if args else kwargs["hidden_states"]

    return hook


def stack_features(states: dict[int, torch.Tensor], layers: Sequence[int]) -> torch.Tensor:
    """Concatenate captured states in the head's layer order: {i: [B, T, D]} → [B, T, n·D]."""
    return torch.cat([states[i] for i in layers], dim=-1)


def anchored_biases(
    head: SteeringHead, features: torch.Tensor, anchors: torch.Tensor
) -> dict[int, torch.Tensor]:
    """Teacher-forced steering: input position s is steered by the verifier features at anchors[b, s].

    features: [B, T, n·D_v] verifier states of the same sequence; anchors: [B, T] long, −1 = unsteered
    (prompt positions). Returns {drafter layer: [B, T, F]} for `steered`. Training draws
    anchors = s − δ with δ ∈ 1..k, which is what decoding does at draft step δ of a block.
    """
    index = anchors.clamp(min=0).unsqueeze(-1).expand(-1, -1, features.shape[-1])  # [B, T, n·D_v]
    biases = head(features.gather(1, index))  # [B, T, L_s, F]
    biases = biases * (anchors >= 0).unsqueeze(-1).unsqueeze(-1).to(biases.dtype)
    return {layer: biases[:, :, i] for i, layer in enumerate(head.config.drafter_layers)}
