"""The SD² head and its hooks: init, no-op at zero, removal, save/load, feature capture."""

import pytest
import torch

from sd2.architecture import mlp
from sd2.steering import (
    SteeringHead,
    captured_states,
    default_verifier_layers,
    new_head_for,
    stack_features,
    steered,
)
from tests.tiny import tiny_llama

IDS = torch.tensor([[5, 9, 40, 11, 3]])


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(hidden=64, layers=4, ffn=128, seed=0), tiny_llama(hidden=32, layers=2, ffn=64, seed=1)


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_default_layers_are_depth_relative():
    assert default_verifier_layers(32) == (3, 16, 29)  # the paper's choice for Llama-3.1-8B
    assert default_verifier_layers(30) == (3, 15, 27)  # SmolLM2-135M


def test_head_initialises_to_sum_of_features_and_zero_bias(pair):
    verifier, drafter = pair
    head = new_head_for(verifier, drafter)
    features = torch.randn(2, 3 * 64)
    g = head.steering_vector(features)
    assert torch.allclose(g, features[:, :64] + features[:, 64:128] + features[:, 128:], atol=1e-6)
    assert torch.count_nonzero(head(features)) == 0
    assert head(features).shape == (2, 2, 64)  # [B, L_s, F_d]


def test_zero_bias_is_a_no_op_and_nonzero_changes_logits(pair):
    _, drafter = pair
    with torch.no_grad():
        plain = drafter(IDS).logits
        with steered(drafter, {0: torch.zeros(64), 1: torch.zeros(64)}):
            zero = drafter(IDS).logits
        with steered(drafter, {1: torch.full((64,), 0.5)}):
            shifted = drafter(IDS).logits
    assert torch.equal(plain, zero)
    assert not torch.allclose(plain, shifted, atol=1e-4)


def test_bias_enters_up_proj_before_the_gate_product(pair):
    """down(silu(gate(a)) ⊙ (up(a) + b)): check on one MLP against the formula."""
    _, drafter = pair
    block = mlp(drafter, 0)
    a = torch.randn(1, 3, 32)
    bias = torch.randn(64)
    expected = block.down_proj(torch.nn.functional.silu(block.gate_proj(a)) * (block.up_proj(a) + bias))
    with torch.no_grad(), steered(drafter, {0: bias}):
        assert torch.allclose(block(a), expected, atol=1e-6)


def test_hooks_are_removed_after_exit_and_after_an_exception(pair):
    _, drafter = pair
    before = _hooks(drafter)
    with steered(drafter, {0: torch.ones(64)}):
        assert _hooks(drafter) == before + 1
    assert _hooks(drafter) == before
    with pytest.raises(RuntimeError), steered(drafter, {0: torch.ones(64), 1: torch.ones(64)}):
        raise RuntimeError("boom")
    assert _hooks(drafter) == before


def test_row_biases_line_up_with_the_last_positions(pair):
    """A [T_max, F] bias steers the last T positions fed: row −1 is the newest token."""
    _, drafter = pair
    rows = torch.stack([torch.zeros(64), torch.full((64,), 0.7)])
    with torch.no_grad():
        with steered(drafter, {0: rows}):
            two = drafter(IDS[:, :2]).logits
        with steered(drafter, {0: torch.stack([torch.zeros(64), torch.zeros(64)])}):
            plain = drafter(IDS[:, :2]).logits
    assert torch.allclose(two[:, 0], plain[:, 0], atol=1e-6)  # row 0 (zero) on position 0
    assert not torch.allclose(two[:, 1], plain[:, 1], atol=1e-4)


def test_captured_states_equal_transformers_hidden_states(pair):
    verifier, _ = pair
    with torch.no_grad():
        verifier(IDS, output_hidden_states=True)  # transformers installs its own recorder hooks once
    before = _hooks(verifier)
    with torch.no_grad(), captured_states(verifier, (1, 3)) as states:
        out = verifier(IDS, output_hidden_states=True)
    assert torch.equal(states[1], out.hidden_states[1])
    assert torch.equal(states[3], out.hidden_states[3])
    assert stack_features(states, (1, 3)).shape == (1, 5, 128)
    assert _hooks(verifier) == before


def test_save_and_load_round_trip(pair, tmp_path):
    verifier, drafter = pair
    head = new_head_for(verifier, drafter, k=4)
    with torch.no_grad():
        head.w_s.normal_()
        head.hml.bias.normal_()
    head.save(tmp_path)
    loaded = SteeringHead.load(tmp_path)
    assert loaded.config == head.config
    features = torch.randn(3 * 64)
    assert torch.allclose(loaded(features), head(features))


def test_load_refuses_missing_or_mismatched_files(pair, tmp_path):
    verifier, drafter = pair
    with pytest.raises(FileNotFoundError, match="steering head incomplete"):
        SteeringHead.load(tmp_path)
    new_head_for(verifier, drafter).save(tmp_path)
    other = new_head_for(verifier, tiny_llama(hidden=32, layers=3, ffn=48))
    other.save(tmp_path / "other")
    (tmp_path / "steering.json").write_text((tmp_path / "other" / "steering.json").read_text())
    with pytest.raises(ValueError, match="does not match"):
        SteeringHead.load(tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decodings_steering_rows_do_not_depend_on_the_other_rows(pair, dtype):
    """steer_rows gives each anchor the same vector and biases bit for bit whether it is alone or one of
    R rows (a batch's heads share one product), and the same values as forward up to rounding."""
    verifier, drafter = pair
    head = new_head_for(verifier, drafter)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        head.w_s.normal_(0, 0.3, generator=generator)
        head.hml.weight.add_(torch.randn(head.hml.weight.shape, generator=generator) * 0.1)
    head = head.to(dtype)
    features = torch.randn(9, 3 * 64, generator=generator).to(dtype)
    with torch.inference_mode():
        alone = [head.steer_rows(features[i : i + 1]) for i in range(9)]
        for rows in range(2, 10):
            vectors, biases = head.steer_rows(features[:rows])
            assert vectors.shape == (rows, 64) and biases.shape == (rows, 2, 64)
            for i in range(rows):
                assert torch.equal(vectors[i], alone[i][0][0]) and torch.equal(biases[i], alone[i][1][0])
        expected = head(features)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(biases, expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(vectors, head.steering_vector(features), rtol=tolerance, atol=tolerance)
