"""Block expansion (sd2.train.grow): a deeper drafter that starts out computing exactly the same."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from sd2.steering import (
    SteeringHead,
    anchored_biases,
    captured_states,
    new_head_for,
    stack_features,
    steered,
)
from sd2.train.build import load_trainable_drafter
from sd2.train.checkpoint import save_checkpoint, verify_checkpoint
from sd2.train.grow import deepen, deepen_head, grow_checkpoint, layer_plan
from sd2.train.trainer import Trainer
from tests.sd2.train.tiny_runs import tiny_drafter, tiny_train_data, tiny_verifier, train_config
from tests.tiny import tiny_tokenizer


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(seed))


def _trained_head(verifier, drafter) -> SteeringHead:
    """A head with non-zero W_s rows, as after training (a fresh one steers by exactly 0)."""
    head = new_head_for(verifier, drafter, k=4)
    with torch.no_grad():
        head.w_s.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return head


def _steered_logits(verifier, drafter, head, ids) -> torch.Tensor:
    with torch.no_grad(), captured_states(verifier, head.config.verifier_layers) as states:
        verifier(ids)
        features = stack_features(states, head.config.verifier_layers)
        anchors = (torch.arange(ids.shape[1]) - 1).expand(ids.shape[0], -1)
        with steered(drafter, anchored_biases(head, features, anchors)):
            return drafter(ids).logits


def test_layer_plan_inserts_each_copy_behind_its_source():
    assert layer_plan(4, (1, 3)) == [(0, False), (1, False), (1, True), (2, False), (3, False), (3, True)]
    assert layer_plan(2, (0, 0)) == [(0, False), (0, True), (0, True), (1, False)]
    with pytest.raises(ValueError, match=r"0\.\.3"):
        layer_plan(4, (4,))
    with pytest.raises(ValueError, match=r"0\.\.3"):
        layer_plan(4, ())


def test_a_deepened_drafter_computes_the_same_logits_bit_for_bit():
    drafter = tiny_drafter()
    grown, plan = deepen(drafter, (0, 1))
    assert grown.config.num_hidden_layers == 4 == len(plan)
    with torch.no_grad():
        assert torch.equal(grown(_ids()).logits, drafter(_ids()).logits)
    # the copies are real layers: their inputs' weights are the source's, and they can learn
    source = drafter.model.layers[1].mlp.up_proj.weight
    assert torch.equal(grown.model.layers[3].mlp.up_proj.weight, source)
    assert grown.model.layers[3].mlp.up_proj.weight.data_ptr() != source.data_ptr()
    assert not grown.model.layers[3].mlp.down_proj.weight.any()
    assert grown.model.layers[3].self_attn.layer_idx == 3  # its own KV-cache slot


def test_a_tied_drafter_stays_tied():
    """The shipped drafters tie their LM head to their embeddings (the tiny ones do not)."""
    config = tiny_drafter().config
    config.tie_word_embeddings = True
    drafter = LlamaForCausalLM(config).eval()
    grown, _ = deepen(drafter, (1,))
    assert grown.lm_head.weight.data_ptr() == grown.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(grown(_ids()).logits, drafter(_ids()).logits)


def test_a_deepened_drafter_decodes_the_same_with_a_kv_cache():
    drafter = tiny_drafter()
    grown, _ = deepen(drafter, (1,))
    with torch.no_grad():
        out = grown.generate(_ids()[:1], max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(
            out, drafter.generate(_ids()[:1], max_new_tokens=8, do_sample=False, pad_token_id=0)
        )


def test_a_grown_head_steers_the_grown_drafter_exactly_as_before():
    verifier, drafter = tiny_verifier(), tiny_drafter()
    head = _trained_head(verifier, drafter)
    grown, plan = deepen(drafter, (0, 1))
    grown_head = deepen_head(head, plan)
    assert grown_head.config.drafter_layers == (0, 1, 2, 3)
    assert torch.equal(grown_head.w_s[0], head.w_s[0]) and torch.equal(grown_head.w_s[2], head.w_s[1])
    assert not grown_head.w_s[1].any() and not grown_head.w_s[3].any()
    plain = _steered_logits(verifier, drafter, head, _ids())
    assert not torch.equal(plain, drafter(_ids()).logits)  # the head does steer
    assert torch.equal(_steered_logits(verifier, grown, grown_head, _ids()), plain)


def test_grow_checkpoint_writes_a_checkpoint_that_trains(tmp_path):
    verifier, drafter = tiny_verifier(), tiny_drafter()
    tokenizer = tiny_tokenizer()
    source = save_checkpoint(
        tmp_path / "base",
        drafter,
        _trained_head(verifier, drafter),
        {"recipe": {"objective": "sd2"}},
        tokenizer=tokenizer,
    )
    out = grow_checkpoint(source, tmp_path / "grown", (1,))
    card = verify_checkpoint(out)
    assert card["grown"] == {"after": [1], "layers": [0, 1, 1], "new": [False, False, True]}
    assert card["lineage"][0]["objective"] == "sd2"
    grown = load_trainable_drafter(out)
    with torch.no_grad():
        assert torch.equal(grown(_ids()).logits, drafter(_ids()).logits)
    head = SteeringHead.load(out)
    assert head.config.drafter_layers == (0, 1, 2)
    config = train_config(tmp_path, "sd2", steps=3)
    result = Trainer(config, grown, verifier, tiny_train_data(tmp_path / "shards"), head, tokenizer).run()
    assert verify_checkpoint(result)["steps"] == 3
    assert SteeringHead.load(result).w_s[2].any()  # the copy's rows left zero


def test_the_cli_grows_a_checkpoint_and_refuses_a_layer_it_does_not_have(tmp_path, capsys):
    from sd2.cli import main

    source = save_checkpoint(tmp_path / "base", tiny_drafter(), None, {}, tokenizer=tiny_tokenizer())
    assert main(["train", "grow", str(source), "--out", str(tmp_path / "g"), "--after", "0,1"]) == 0
    assert verify_checkpoint(tmp_path / "g")["grown"]["layers"] == [0, 0, 1, 1]
    assert main(["train", "grow", str(source), "--out", str(tmp_path / "bad"), "--after", "2"]) != 0
    assert "0..1" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
