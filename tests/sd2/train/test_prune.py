"""Drafters cut from the verifier (sd2.train.prune): block and channel importance on calibration text, the
cut model, its checkpoint and card, and the command."""

from __future__ import annotations

import torch

from sd2.architecture import decoder_layers, mlp
from sd2.train.build import load_trainable_drafter
from sd2.train.checkpoint import verify_checkpoint
from sd2.train.prune import channel_importance, cut, kept_layers, layer_importance, prune_checkpoint
from sd2.train.trainer import Trainer
from tests.sd2.train.tiny_runs import tiny_train_data, tiny_verifier, train_config
from tests.tiny import tiny_tokenizer

ROWS = [list(range(3, 40)), list(range(100, 130)), [7, 9, 11, 13, 200, 201]]


def _ids() -> torch.Tensor:
    return torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))


def _silence(model, layer: int) -> None:
    """Layer `layer` adds exactly 0 to the residual stream: its output projections zeroed."""
    with torch.no_grad():
        block = decoder_layers(model)[layer]
        block.self_attn.o_proj.weight.zero_()
        block.mlp.down_proj.weight.zero_()


def test_a_layer_that_adds_nothing_has_zero_importance_and_goes_first():
    verifier = tiny_verifier()
    _silence(verifier, 1)
    importance = layer_importance(verifier, ROWS)
    assert importance.shape == (verifier.config.num_hidden_layers,)
    assert importance[1] < 1e-6 < importance[[0, 2, 3]].min() and (importance <= 1).all()  # arccos rounding
    assert 1 not in kept_layers(importance, verifier.config.num_hidden_layers - 1)


def test_keeping_every_layer_and_channel_computes_the_same_logits():
    verifier = tiny_verifier().eval()
    every = list(range(verifier.config.num_hidden_layers))
    width = verifier.config.intermediate_size
    copy = cut(verifier, every, channel_importance(verifier, ROWS), ffn=width)
    with torch.no_grad():
        assert torch.equal(copy(_ids()).logits, verifier(_ids()).logits)
    tied = lambda m: m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()  # noqa: E731
    assert tied(copy) == tied(verifier)


def test_dead_channels_are_the_ones_cut_and_dropping_a_silent_layer_changes_nothing():
    verifier = tiny_verifier().eval()
    _silence(verifier, 2)
    dead = torch.arange(0, verifier.config.intermediate_size, 2)  # every other channel of each layer
    with torch.no_grad():
        for layer in range(verifier.config.num_hidden_layers):
            mlp(verifier, layer).up_proj.weight[dead] = 0  # act(gate) · 0 = 0: those channels never fire
    channels = channel_importance(verifier, ROWS)
    assert (channels[:, dead] == 0).all() and (channels[[0, 1, 3]][:, 1::2] > 0).all()
    half = verifier.config.intermediate_size // 2
    pruned = cut(verifier, [0, 1, 3], channels, ffn=half)
    assert pruned.config.num_hidden_layers == 3 and pruned.config.intermediate_size == half
    with torch.no_grad():
        torch.testing.assert_close(pruned(_ids()).logits, verifier(_ids()).logits)


def test_a_pruned_checkpoint_records_its_cut_and_trains(tmp_path):
    verifier = tiny_verifier()
    tokenizer = tiny_tokenizer()
    out = prune_checkpoint(verifier, "tiny", tokenizer, tmp_path / "cut", ROWS, "text:rows", layers=2, ffn=64)
    card = verify_checkpoint(out)
    pruned = card["pruned"]
    assert pruned["layers_of"] == verifier.config.num_hidden_layers and len(pruned["layers_kept"]) == 2
    assert pruned["ffn"] == 64 and pruned["calibration"] == {"source": "text:rows", "rows": 3, "tokens": 73}
    assert len(pruned["layer_importance"]) == verifier.config.num_hidden_layers
    assert card["recipe"]["objective"] == "prune" and card["steps"] == 0
    drafter = load_trainable_drafter(out)
    assert drafter.config.num_hidden_layers == 2 and drafter.config.intermediate_size == 64
    config = train_config(tmp_path, "distill", steps=2)
    result = Trainer(config, drafter, verifier, tiny_train_data(tmp_path / "shards"), None, tokenizer).run()
    assert verify_checkpoint(result)["steps"] == 2


def test_the_cli_prunes_from_a_verifier_folder_and_refuses_too_many_layers(tiny_pair_dir, tmp_path, capsys):
    from sd2.cli import main

    verifier_dir, _ = tiny_pair_dir
    text = tmp_path / "calibration.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    common = ["--verifier", str(verifier_dir), "--calibration", f"text:{text}", "--calibration-tokens", "64"]
    assert main(["train", "prune", "--out", str(tmp_path / "p"), "--layers", "1", *common]) == 0
    card = verify_checkpoint(tmp_path / "p")
    assert len(card["pruned"]["layers_kept"]) == 1 and card["pruned"]["calibration"]["rows"] > 1
    assert main(["train", "prune", "--out", str(tmp_path / "bad"), "--layers", "99", *common]) != 0
    assert "--layers must be in 1.." in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
