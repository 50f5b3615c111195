"""A drafter cut from the verifier, trained with frozen embeddings, ships without them and loads them back."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors import safe_open

from sd2.devices import default_placement
from sd2.models import load_drafter
from sd2.train.build import load_trainable_drafter
from sd2.train.checkpoint import export_checkpoint, verify_checkpoint
from sd2.train.config import TrainConfig
from sd2.train.prune import prune_checkpoint
from sd2.train.trainer import Trainer
from sd2.verifier_embeddings import VERIFIER_EMBEDDINGS
from tests.sd2.train.tiny_runs import tiny_train_data, tiny_verifier, train_config
from tests.tiny import tiny_tokenizer

ROWS = [[5, 9, 14, 3, 22, 7, 11], [30, 2, 8, 19, 4], [12, 6, 25, 17, 1, 9]]


def _cut_and_train(tmp_path, verifier, freeze: bool):
    tokenizer = tiny_tokenizer()
    cut = prune_checkpoint(verifier, "tiny", tokenizer, tmp_path / "cut", ROWS, "text:rows", layers=2)
    config = train_config(tmp_path, "distill", steps=3, freeze_embeddings=freeze)
    drafter = load_trainable_drafter(cut)
    before = copy.deepcopy(drafter.state_dict())
    run = Trainer(config, drafter, verifier, tiny_train_data(tmp_path / "shards"), None, tokenizer).run()
    return run, before, load_trainable_drafter(run).state_dict()


def _weight_keys(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        return set(weights.keys())


def test_frozen_embeddings_stay_the_verifiers_while_the_layers_train(tmp_path):
    verifier = tiny_verifier()
    _, before, after = _cut_and_train(tmp_path, verifier, freeze=True)
    for key in ("model.embed_tokens.weight", "lm_head.weight"):  # the tiny models do not tie them
        assert torch.equal(after[key], before[key])
    assert torch.equal(after["model.embed_tokens.weight"], verifier.model.embed_tokens.weight)
    assert not torch.equal(
        after["model.layers.0.mlp.up_proj.weight"], before["model.layers.0.mlp.up_proj.weight"]
    )


def test_freezing_embeddings_is_for_fine_tunes():
    with pytest.raises(ValueError, match="freeze_embeddings is for distill and sd2"):
        TrainConfig(objective="pretrain", out_dir="x", freeze_embeddings=True)


def test_an_export_borrowing_the_verifiers_embeddings_stores_none_and_loads_the_same_drafter(
    tmp_path, caplog
):
    verifier = tiny_verifier()
    run, _, _ = _cut_and_train(tmp_path, verifier, freeze=True)
    full = export_checkpoint(run, tmp_path / "full")
    lean = export_checkpoint(run, tmp_path / "lean", verifier=verifier, borrow_embeddings=True)
    entry = verify_checkpoint(lean)[VERIFIER_EMBEDDINGS]
    assert entry["verifier"] and set(entry["tensors"]) == {"input", "output"}
    assert _weight_keys(full) - _weight_keys(lean) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert (lean / "model.safetensors").stat().st_size < (full / "model.safetensors").stat().st_size
    tokenizer = tiny_tokenizer()
    placement = default_placement("cpu", "bf16")
    served_verifier = copy.deepcopy(verifier).to(torch.bfloat16)  # what `serve --dtype bf16` holds
    shipped = load_drafter("full", str(full), placement, served_verifier, tokenizer).model.state_dict()
    caplog.clear()
    borrowed = load_drafter("lean", str(lean), placement, served_verifier, tokenizer).model.state_dict()
    assert "MISSING" not in caplog.text  # by design: no "newly initialized" report to alarm anyone
    assert shipped.keys() == borrowed.keys()
    assert all(torch.equal(shipped[key], borrowed[key]) for key in shipped)
    trainable = load_trainable_drafter(lean, verifier)  # fp32, to train on: the verifier's fp32 matrix
    assert torch.equal(trainable.model.embed_tokens.weight, verifier.model.embed_tokens.weight)
    again = export_checkpoint(lean, tmp_path / "again", verifier=verifier, borrow_embeddings=True)
    assert verify_checkpoint(again)[VERIFIER_EMBEDDINGS] == entry


def test_a_borrowing_drafter_refuses_to_load_without_its_verifier_or_beside_another(tmp_path):
    verifier = tiny_verifier()
    run, _, _ = _cut_and_train(tmp_path, verifier, freeze=True)
    lean = export_checkpoint(run, tmp_path / "lean", verifier=verifier, borrow_embeddings=True)
    with pytest.raises(ValueError, match="load it beside that verifier"):
        load_trainable_drafter(lean)
    other = copy.deepcopy(verifier)
    with torch.no_grad():
        other.model.embed_tokens.weight[3] += 1
    with pytest.raises(
        ValueError, match=r"token embeddings from the verifier it was cut from.*checksum mismatch"
    ):
        load_drafter("lean", str(lean), default_placement("cpu", "fp32"), other, tiny_tokenizer())
    with pytest.raises(ValueError, match="load it beside"):
        export_checkpoint(lean, tmp_path / "orphan")


def test_embeddings_that_trained_cannot_be_borrowed(tmp_path):
    verifier = tiny_verifier()
    run, _, _ = _cut_and_train(tmp_path, verifier, freeze=False)
    with pytest.raises(ValueError, match=r"not the verifier's bit for bit.*--freeze-embeddings"):
        export_checkpoint(run, tmp_path / "lean", verifier=verifier, borrow_embeddings=True)
    assert not (tmp_path / "lean").exists()


def test_the_cli_exports_a_cut_borrowing_the_verifiers_embeddings(tiny_pair_dir, tmp_path):
    from sd2.cli import main

    verifier_dir, _ = tiny_pair_dir
    text = tmp_path / "calibration.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    prune = ["--verifier", str(verifier_dir), "--calibration", f"text:{text}", "--calibration-tokens", "64"]
    assert main(["train", "prune", "--out", str(tmp_path / "cut"), "--layers", "1", *prune]) == 0
    export = ["train", "export", str(tmp_path / "cut"), "--verifier", str(verifier_dir)]
    assert main([*export, "--out", str(tmp_path / "lean"), "--embeddings-from-verifier"]) == 0
    assert VERIFIER_EMBEDDINGS in verify_checkpoint(tmp_path / "lean")
    assert "model.embed_tokens.weight" not in _weight_keys(tmp_path / "lean")
