"""Training: each objective learns, δ alignment matches decoding, resume is exact, checkpoints are checked."""

import json

import pytest
import torch
import torch.nn.functional as F

from sd2.config import DecodeConfig
from sd2.data.batches import ShardSet, batches
from sd2.decoding import SpeculativeDecoder
from sd2.official import convert_official
from sd2.proposer import Proposer
from sd2.steering import SteeringHead, anchored_biases, captured_states, new_head_for, stack_features, steered
from sd2.train.checkpoint import CheckpointError, save_checkpoint, verify_checkpoint
from sd2.train.objectives import distill_step, pretrain_step, steered_logits
from sd2.train.offsets import prompt_lengths, sample_anchors, trained_positions
from sd2.train.trainer import TrainCallback, TrainData, Trainer
from tests.sd2.train.tiny_runs import tiny_drafter as _drafter
from tests.sd2.train.tiny_runs import tiny_verifier as _verifier
from tests.sd2.train.tiny_runs import train_config as _config
from tests.tiny import tiny_llama, tiny_tokenizer


def _losses(out_dir):
    state = torch.load(out_dir / "trainer_state.pt", weights_only=False)
    return [h["loss"] for h in state["history"] if "loss" in h]


@pytest.mark.parametrize(
    "objective,loss", [("pretrain", "kl"), ("distill", "kl"), ("sd2", "kl"), ("sd2", "tvd")]
)
def test_a_few_steps_lower_the_loss(tmp_path, data, objective, loss):
    verifier, drafter = _verifier(), _drafter()
    head = new_head_for(verifier, drafter) if objective == "sd2" else None
    out = Trainer(_config(tmp_path, objective, loss=loss), drafter, verifier, data, head).run()
    losses = _losses(out)
    assert sum(losses[-3:]) / 3 < 0.9 * sum(losses[:3]) / 3
    card = verify_checkpoint(out)
    assert card["steps"] == 12 and card["tokens_seen"] > 0 and card["recipe"]["objective"] == objective
    assert card["recipe"]["loss"] == loss
    assert card["final_metrics"]["val_tau"] >= 1.0
    assert (out / "steering.safetensors").exists() == (objective == "sd2")


def test_sd2_moves_the_head_and_frozen_ablation_keeps_the_drafter(tmp_path, data):
    verifier, drafter = _verifier(), _drafter()
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    head = new_head_for(verifier, drafter)
    Trainer(_config(tmp_path, "sd2", freeze_drafter=True), drafter, verifier, data, head).run()
    assert all(torch.equal(before[k], v) for k, v in drafter.state_dict().items())
    assert torch.count_nonzero(head.w_s) > 0


def test_pretrain_loss_is_the_cross_entropy_of_the_full_logits_on_trained_positions(data):
    drafter = _drafter()
    batch = next(batches(data.train, 8, seed=0, trim=True))
    out = pretrain_step(drafter, batch)  # the LM head runs only on the trained positions
    logits = drafter(input_ids=batch.input_ids).logits[:, :-1]  # [B, T-1, V], every position
    mask = trained_positions(batch.loss_mask)[:, :-1]
    per_position = F.cross_entropy(logits.transpose(1, 2), batch.input_ids[:, 1:], reduction="none")
    assert 0 < mask.sum() < mask.numel()  # prompts and padding are left out
    assert torch.allclose(out.loss, per_position[mask].mean(), rtol=1e-5)
    assert out.metrics["tokens"] == mask.sum()
    out.loss.backward()
    assert drafter.get_output_embeddings().weight.grad.abs().sum() > 0


@pytest.mark.parametrize("steering", [False, True])
def test_distill_loss_is_the_kl_of_the_full_logits_on_trained_positions(data, steering):
    verifier, drafter = _verifier(), _drafter()
    head = new_head_for(verifier, drafter) if steering else None
    if head is not None:
        with torch.no_grad():
            head.w_s.normal_(0, 0.05)
    batch = next(batches(data.train, 8, seed=0, trim=True))
    out = distill_step(drafter, verifier, batch, head, k=4, generator=torch.Generator().manual_seed(7))
    mask = trained_positions(batch.loss_mask)  # [B, T]
    layers = head.config.verifier_layers if head is not None else ()
    with torch.no_grad(), captured_states(verifier, layers) as states:
        target = verifier(input_ids=batch.input_ids).logits  # [B, T, V], every position
        if head is None:
            draft = drafter(input_ids=batch.input_ids).logits
        else:
            anchors = sample_anchors(batch.loss_mask, 4, torch.Generator().manual_seed(7))
            biases = anchored_biases(head, stack_features(states, layers), anchors)
            with steered(drafter, biases):
                draft = drafter(input_ids=batch.input_ids).logits
    p_log, q_log = target.log_softmax(-1), draft.log_softmax(-1)
    kl = (p_log.exp() * (p_log - q_log)).sum(-1)  # [B, T]
    assert torch.allclose(out.loss, kl[mask].mean(), rtol=1e-5)
    agree = (target.argmax(-1) == draft.argmax(-1))[mask].float().mean()
    assert out.metrics["agreement"] == pytest.approx(float(agree))


@pytest.mark.parametrize("loss", ["tvd", "mixed"])
def test_distill_loss_can_be_the_tv_distance_and_logs_the_tau_proxies(data, loss):
    verifier, drafter = _verifier(), _drafter()
    batch = next(batches(data.train, 8, seed=0, trim=True))
    out = distill_step(drafter, verifier, batch, k=4, loss_name=loss)
    mask = trained_positions(batch.loss_mask)  # [B, T]
    with torch.no_grad():
        p = verifier(input_ids=batch.input_ids).logits.softmax(-1)  # [B, T, V], every position
        q = drafter(input_ids=batch.input_ids).logits.softmax(-1)
    tv = 0.5 * (p - q).abs().sum(-1)  # [B, T]
    kl = (p * (p.log() - q.log())).sum(-1)
    expected = tv[mask].mean() if loss == "tvd" else (tv[mask].mean() + kl[mask].mean()) / 2
    assert torch.allclose(out.loss, expected, rtol=1e-4)
    # the proxies from the same positions, sequence by sequence: windows of k = 4 consecutive ones
    alpha, match = torch.minimum(p, q).sum(-1), (p.argmax(-1) == q.argmax(-1)).float()  # [B, T]
    for name, values in (("tau_proxy", alpha), ("tau_proxy_greedy", match)):
        windows = [values[b][mask[b]].unfold(0, 4, 1) for b in range(len(mask))]
        proxy = torch.cat([1 + w.cumprod(-1).sum(-1) for w in windows]).mean()
        assert out.metrics[name] == pytest.approx(float(proxy), rel=1e-4)
    assert 1.0 <= out.metrics["tau_proxy_greedy"] <= 5.0


def test_a_loss_other_than_kl_is_refused_for_pretraining(tmp_path):
    with pytest.raises(ValueError, match="loss is for distill and sd2"):
        _config(tmp_path, "pretrain", loss="tvd")


def test_sampled_offsets_stay_in_range_and_never_steer_the_prompt():
    loss_mask = torch.zeros(3, 20, dtype=torch.bool)
    loss_mask[0, 5:18] = True
    loss_mask[1, 2:20] = True
    loss_mask[2, 10:12] = True
    anchors = sample_anchors(loss_mask, k=4, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(20).expand(3, 20)
    steered = anchors >= 0
    assert torch.equal(steered, trained_positions(loss_mask))
    offsets = (positions - anchors)[steered]
    assert offsets.min() >= 1 and offsets.max() <= 4
    assert (anchors[steered] >= (prompt_lengths(loss_mask) - 1)[:, None].expand(3, 20)[steered]).all()
    draws = sample_anchors(loss_mask.repeat(500, 1), k=4, generator=torch.Generator().manual_seed(1))
    late = (torch.arange(20) - draws)[:, 12][draws[:, 12] >= 0]  # far from the prompt: δ uniform on 1..4
    assert set(late.tolist()) == {1, 2, 3, 4}


def test_training_forward_equals_inference_drafts_at_matching_offsets():
    """The teacher-forced steered forward used in training reproduces what the engine drafted when
    each position is anchored δ = j back, as in block step j (also pinned in tests/sd2/test_alignment.py)."""
    from tests.sd2.test_alignment import _anchors_from_trace, _judged_draft_probs

    verifier, drafter = _verifier(), tiny_llama(hidden=64, layers=4, ffn=128, seed=0)
    head = new_head_for(verifier, drafter)
    with torch.no_grad():
        head.w_s.normal_(0, 0.05)
    prompt = [1, 40, 17, 99, 3]
    blocks = list(
        SpeculativeDecoder(
            verifier, Proposer(drafter, head), DecodeConfig(k=4, max_new_tokens=30), frozenset()
        ).run(prompt)
    )
    tokens = prompt + [t.token_id for b in blocks for t in b.emitted]
    anchors = _anchors_from_trace(blocks, len(prompt), len(tokens))
    ids = torch.tensor([tokens])
    with torch.no_grad(), captured_states(verifier, head.config.verifier_layers) as states:
        verifier(ids)
    features = stack_features(states, head.config.verifier_layers)
    with torch.no_grad():
        every = torch.ones_like(ids, dtype=torch.bool)
        probs = torch.softmax(steered_logits(drafter, head, ids, features, anchors[None], every), dim=-1)
    recorded, recomputed = _judged_draft_probs(blocks, len(prompt), probs)
    assert torch.allclose(recorded, recomputed, atol=1e-5)


class _StopAfter(TrainCallback):
    def __init__(self, step: int):
        self.step, self.seen = step, 0

    def on_metric(self, step, name, value):
        self.seen = step

    def should_stop(self):
        return self.seen >= self.step


def test_resume_continues_bit_identically(tmp_path, data):
    verifier = _verifier()

    def run(out, callbacks=()):
        drafter = _drafter()
        head = new_head_for(verifier, drafter)
        config = _config(tmp_path, "sd2", out_dir=str(out), steps=10, eval_every=0, save_every=3)
        Trainer(config, drafter, verifier, data, head, callbacks=callbacks).run()
        return drafter, head

    straight_drafter, straight_head = run(tmp_path / "straight")
    run(tmp_path / "resumed", callbacks=[_StopAfter(5)])  # cancelled at step 5, checkpointed
    assert json.loads((tmp_path / "resumed" / "sd2_card.json").read_text())["steps"] == 5
    resumed_drafter, resumed_head = run(tmp_path / "resumed")
    for a, b in zip(
        straight_drafter.state_dict().values(), resumed_drafter.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    assert torch.equal(straight_head.w_s, resumed_head.w_s)
    assert _losses(tmp_path / "straight") == _losses(tmp_path / "resumed")


def test_partial_or_corrupt_checkpoints_are_refused(tmp_path):
    drafter = _drafter()
    folder = save_checkpoint(tmp_path / "ckpt", drafter, None, {"recipe": "test"})
    assert verify_checkpoint(folder)["recipe"] == "test"
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CheckpointError, match=r"corrupt: model\.safetensors"):
        verify_checkpoint(folder)
    folder = save_checkpoint(tmp_path / "ckpt2", drafter, None, {})
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"partial: config\.json is missing"):
        verify_checkpoint(folder)
    (folder / "sd2_card.json").unlink()
    with pytest.raises(CheckpointError, match=r"sd2_card\.json is missing"):
        verify_checkpoint(folder)
    assert not list(tmp_path.glob(".*staging*"))  # no staging folders left behind


def test_resume_refuses_a_different_run(tmp_path, data):
    verifier = _verifier()
    Trainer(_config(tmp_path, "distill", steps=2), _drafter(), verifier, data).run()
    with pytest.raises(ValueError, match="different run"):
        Trainer(_config(tmp_path, "distill", steps=3), _drafter(), verifier, data).run()


def _official_folder(tmp_path, drafter, head, drop=(), **hparams):
    """A tiny checkpoint in the authors' layout (state keys in `drop` left out)."""
    official = tmp_path / "official"
    official.mkdir()
    state = {}
    for key, value in drafter.state_dict().items():
        key = key.replace("model.layers.", "model.layers.").replace(".self_attn", ".l.self_attn")
        key = key.replace(".mlp.", ".l.mlp.").replace(".input_layernorm", ".l.input_layernorm")
        key = key.replace(".post_attention_layernorm", ".l.post_attention_layernorm")
        state[f"d_base.{key}"] = value
    state["guidance_embd_layer.orig.weight"] = head.hml.weight.detach()
    state["guidance_embd_layer.orig.bias"] = head.hml.bias.detach()
    state["latent_mod_prep.norm.weight"] = head.norm.weight.detach()
    state["latent_mod_prep.norm.bias"] = head.norm.bias.detach()
    state["latent_mod_prep.w_guide.weight"] = head.w_s.detach().reshape(-1, 64)
    torch.save({k: v for k, v in state.items() if k not in drop}, official / "pytorch_model.bin")
    drafter.config.save_pretrained(tmp_path / "drafter_config")
    config = {
        "verifier": "tiny-verifier",
        "drafter": str(tmp_path / "drafter_config"),
        "ngram": 4,
        "v_layer": list(reversed(head.config.verifier_layers)),
        "d_layer": "all",
        "guide_method": "merged",
    }
    (official / "config.json").write_text(json.dumps(config | hparams))
    return official


def test_official_checkpoint_round_trips(tmp_path):
    """Build a tiny checkpoint in the authors' layout, import it, and compare every tensor."""
    verifier, drafter = _verifier(), _drafter()
    head = new_head_for(verifier, drafter)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    official = _official_folder(tmp_path, drafter, head)
    out = convert_official(official, tmp_path / "imported")
    verify_checkpoint(out)
    loaded = SteeringHead.load(out)
    assert loaded.config.verifier_layers == tuple(sorted(head.config.verifier_layers))
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    from transformers import AutoModelForCausalLM

    imported = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(imported.state_dict()[name], tensor), name


@pytest.mark.parametrize("method", ["simple", "advanced"])
def test_an_official_ablation_checkpoint_is_refused_naming_its_guide_method(tmp_path, method):
    verifier, drafter = _verifier(), _drafter()
    official = _official_folder(tmp_path, drafter, new_head_for(verifier, drafter), guide_method=method)
    with pytest.raises(ValueError, match=f"guide_method '{method}' is an ablation sd2 does not implement"):
        convert_official(official, tmp_path / "imported")


def test_an_untied_official_drafter_without_its_lm_head_is_refused(tmp_path):
    verifier, drafter = _verifier(), _drafter()
    drafter.config.tie_word_embeddings = False  # its head is its own weight: an import needs it
    official = _official_folder(
        tmp_path, drafter, new_head_for(verifier, drafter), drop={"d_base.lm_head.weight"}
    )
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        convert_official(official, tmp_path / "imported")


def test_export_writes_a_bf16_copy_without_trainer_state(tmp_path, data):
    from sd2.train.checkpoint import export_checkpoint

    verifier, drafter = _verifier(), _drafter()
    head = new_head_for(verifier, drafter)
    out = Trainer(_config(tmp_path, "sd2", steps=2), drafter, verifier, data, head).run()
    shipped = export_checkpoint(out, tmp_path / "shipped")
    from sd2.cli import main

    assert main(["train", "export", str(out), "--out", str(tmp_path / "via-cli")]) == 0
    assert verify_checkpoint(tmp_path / "via-cli")["dtype"] == "bfloat16"
    card = verify_checkpoint(shipped)
    assert card["dtype"] == "bfloat16" and card["steps"] == 2 and not (shipped / "trainer_state.pt").exists()
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(shipped).dtype == torch.bfloat16
    assert SteeringHead.load(shipped).w_s.dtype == torch.float32  # heads stay fp32 (small, exact)


def test_fine_tuning_from_a_shipped_bf16_drafter_trains_fp32_master_weights(tmp_path, data):
    """Shipped drafters are stored in bf16; `--from` one must not train (or steer) in bf16."""
    from sd2.train.build import load_trainable_drafter
    from sd2.train.checkpoint import export_checkpoint

    verifier, drafter = _verifier(), _drafter()
    out = Trainer(_config(tmp_path, "pretrain", steps=1), drafter, verifier, data).run()
    shipped = export_checkpoint(out, tmp_path / "shipped")
    reloaded = load_trainable_drafter(shipped)
    assert {p.dtype for p in reloaded.parameters()} == {torch.float32}
    head = new_head_for(verifier, reloaded)
    out = Trainer(_config(tmp_path / "sd2", "sd2", steps=1), reloaded, verifier, data, head).run()
    assert verify_checkpoint(out)["steps"] == 1


def test_a_frozen_drafter_run_ships_as_a_steering_only_checkpoint(tmp_path, data):
    """--share-drafter-with: the head alone is stored, the drafter weights are read (checksummed) from
    the base's export; a changed base or a run that moved the drafter is refused."""
    from sd2.cli import main
    from sd2.devices import Placement
    from sd2.models import SHARED_WEIGHTS, load_drafter

    verifier = _verifier()
    base_run = Trainer(_config(tmp_path, "pretrain", steps=2), _drafter(), verifier, data).run()
    assert main(["train", "export", str(base_run), "--out", str(tmp_path / "ship" / "base")]) == 0
    frozen_start = load_trainable_drafter_from(base_run)
    head = new_head_for(verifier, frozen_start)
    config = _config(tmp_path / "frozen", "sd2", steps=2, freeze_drafter=True)
    frozen_run = Trainer(config, frozen_start, verifier, data, head).run()
    target = tmp_path / "ship" / "frozen"
    args = ["train", "export", str(frozen_run), "--out", str(target)]
    assert main([*args, "--share-drafter-with", str(tmp_path / "ship" / "base")]) == 0

    card = verify_checkpoint(target)
    assert card[SHARED_WEIGHTS]["folder"] == "../base" and not (target / "model.safetensors").exists()
    placement = Placement(torch.device("cpu"), torch.float32)
    shipped = load_drafter("frozen", str(target), placement, verifier, tiny_tokenizer())
    base = load_drafter("base", str(tmp_path / "ship" / "base"), placement, verifier, tiny_tokenizer())
    for name, tensor in base.model.state_dict().items():
        assert torch.equal(shipped.model.state_dict()[name], tensor), name
    assert (
        torch.equal(shipped.head.w_s, SteeringHead.load(frozen_run).w_s) and shipped.head.w_s.abs().sum() > 0
    )

    moved = Trainer(_config(tmp_path / "moved", "sd2", steps=2), load_trainable_drafter_from(base_run),
                    verifier, data, new_head_for(verifier, _drafter())).run()  # fmt: skip
    with pytest.raises(CheckpointError, match="drafter weights differ"):
        export_from(moved, tmp_path / "ship" / "moved", tmp_path / "ship" / "base")
    weights = tmp_path / "ship" / "base" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(CheckpointError, match="has changed since"):
        verify_checkpoint(target)


def load_trainable_drafter_from(folder):
    from sd2.train.build import load_trainable_drafter

    return load_trainable_drafter(folder)


def export_from(source, target, base):
    from sd2.train.checkpoint import export_checkpoint

    return export_checkpoint(source, target, share_drafter_with=base)


def test_pretrain_from_a_checkpoint_continues_its_weights(tmp_path, data):
    from sd2.train.build import starting_point
    from sd2.train.init_drafter import DrafterShape

    verifier = _verifier()
    first = Trainer(_config(tmp_path, "pretrain", steps=2), _drafter(), verifier, data).run()
    shape = DrafterShape(layers=9, hidden=8, ffn=8)  # a fresh drafter's shape is ignored with a base
    drafter, head, card, vocab = starting_point(
        str(first), _config(tmp_path / "more", "pretrain"), verifier, shape
    )
    saved = load_trainable_drafter_from(first).state_dict()
    assert head is None and vocab is None and card["initialised_from"] == str(first)
    first_card = verify_checkpoint(first)
    [stage] = card["lineage"]  # the base had no lineage of its own: one stage
    assert stage["objective"] == "pretrain" and stage["steps"] == 2
    assert stage["tokens_seen"] == first_card["tokens_seen"] > 0
    assert stage["final_metrics"] == first_card["final_metrics"]
    assert all(torch.equal(saved[name], t) for name, t in drafter.state_dict().items())
    fresh, _, fresh_card, _ = starting_point(
        None, _config(tmp_path / "new", "pretrain"), verifier, DrafterShape(layers=2, hidden=32, ffn=64)
    )
    assert "architecture" in fresh_card and not torch.equal(fresh.lm_head.weight, drafter.lm_head.weight)
    second = Trainer(
        _config(tmp_path, "pretrain", out_dir=str(tmp_path / "second"), steps=1),
        drafter,
        verifier,
        data,
        card=card,
    ).run()
    _, _, third_card, _ = starting_point(str(second), _config(tmp_path / "x", "distill"), verifier)
    assert [s["steps"] for s in third_card["lineage"]] == [1, 2]  # most recent stage first


def test_a_fine_tune_ships_the_draft_vocabulary_of_its_base(tmp_path, data):
    """The reduced draft vocabulary describes the verifier's output, not the drafter's weights: every
    checkpoint of a run from a base that has one, and every export of those, carries it unchanged."""
    from sd2.draft_vocab import DraftVocab
    from sd2.train.build import build_trainer, starting_point
    from sd2.train.checkpoint import export_checkpoint

    verifier = _verifier()
    base = Trainer(
        _config(tmp_path, "pretrain", out_dir=str(tmp_path / "base"), steps=1), _drafter(), verifier, data
    ).run()
    vocab = DraftVocab((5, 2, 9, 0), source="test counts", coverage=0.5)
    vocab.save(base)
    config = _config(tmp_path, "sd2", out_dir=str(tmp_path / "tuned"), steps=2)
    start = starting_point(str(base), config, verifier)
    assert start.draft_vocab == vocab
    tuned = build_trainer(config, verifier, data, start).run()
    assert DraftVocab.load(tuned) == vocab and "draft_vocab.json" in verify_checkpoint(tuned)["files"]
    shipped = export_checkpoint(tuned, tmp_path / "shipped")
    assert DraftVocab.load(shipped) == vocab and "draft_vocab.json" in verify_checkpoint(shipped)["files"]
    plain = Trainer(
        _config(tmp_path, "pretrain", out_dir=str(tmp_path / "plain"), steps=1), _drafter(), verifier, data
    ).run()
    assert DraftVocab.load(export_checkpoint(plain, tmp_path / "plain-shipped")) is None


class _ForwardDtypes(TrainCallback):
    """Records the dtype of the drafter's logits in every forward (a hook on its output head)."""

    def __init__(self, drafter):
        self.dtypes: set[torch.dtype] = set()
        head = drafter.get_output_embeddings()
        head.register_forward_hook(lambda module, args, out: self.dtypes.add(out.dtype))


def test_bf16_precision_trains_in_bf16_with_fp32_master_weights(tmp_path, data):
    verifier, drafter = _verifier(), _drafter()
    head = new_head_for(verifier, drafter)
    seen = _ForwardDtypes(drafter)
    config = _config(tmp_path, "sd2", precision="bf16")
    out = Trainer(config, drafter, verifier, data, head, callbacks=[seen]).run()
    assert torch.bfloat16 in seen.dtypes  # the training forwards ran under bf16 autocast
    losses = _losses(out)
    assert sum(losses[-3:]) / 3 < 0.9 * sum(losses[:3]) / 3
    assert all(p.dtype == torch.float32 for p in drafter.parameters())
    assert head.w_s.dtype == torch.float32
    assert verify_checkpoint(out)["recipe"]["precision"] == "bf16"


def test_fp32_precision_keeps_forwards_in_fp32_and_precision_is_part_of_the_run(tmp_path, data):
    verifier, drafter = _verifier(), _drafter()
    seen = _ForwardDtypes(drafter)
    Trainer(_config(tmp_path, "distill", steps=2, precision="fp32"), drafter, verifier, data).run()
    assert seen.dtypes == {torch.float32}
    with pytest.raises(ValueError, match="different run"):
        Trainer(_config(tmp_path, "distill", steps=2, precision="bf16"), _drafter(), verifier, data).run()
    with pytest.raises(ValueError, match=r"precision must be one of .* got 'fp16'"):
        _config(tmp_path, "distill", precision="fp16")


class _RecordingShards(ShardSet):
    """The real shard set, noting the example ids of every batch the trainer draws."""

    def __init__(self, folder):
        super().__init__(folder)
        self.drawn: list[tuple[str, ...]] = []

    def rows(self, index, trim=False):
        batch = super().rows(index, trim)
        self.drawn.append(batch.ids)
        return batch


def test_skip_batches_continues_an_earlier_runs_data_order(tmp_path, data):
    def drawn(name, callbacks=(), **overrides):
        shards = _RecordingShards(data.train.folder)
        config = _config(tmp_path, "pretrain", out_dir=str(tmp_path / name), seed=5, **overrides)
        Trainer(config, _drafter(), None, TrainData(shards), callbacks=callbacks).run()
        return shards.drawn

    straight = drawn("straight", steps=5)
    assert drawn("skipped", steps=2, skip_batches=2) == straight[2:4]
    # a cancelled skipping run resumes from its own position, not from skip_batches again
    first = drawn("resumed", steps=3, skip_batches=2, save_every=1, callbacks=[_StopAfter(1)])
    assert first + drawn("resumed", steps=3, skip_batches=2, save_every=1) == straight[2:5]
    with pytest.raises(ValueError, match="skip_batches 6 is not below the 6 batches of one epoch"):
        drawn("too-far", steps=1, skip_batches=6)
    with pytest.raises(ValueError, match="skip_batches must be ≥ 0"):
        _config(tmp_path, "pretrain", skip_batches=-1)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("objective", ["distill", "sd2"])
def test_a_bf16_verifier_trains_an_fp32_drafter_through_validation(tmp_path, data, objective, precision):
    """What every GPU run does (the placement loads the verifier in bf16, the drafter and head stay
    fp32): training, validation (outside autocast) and the final checkpoint must all go through."""
    verifier, drafter = _verifier().to(torch.bfloat16), _drafter()
    head = new_head_for(verifier, drafter) if objective == "sd2" else None
    config = _config(tmp_path, objective, steps=3, eval_every=2, precision=precision)
    out = Trainer(config, drafter, verifier, data, head).run()
    card = verify_checkpoint(out)
    assert card["steps"] == 3 and card["final_metrics"]["val_tau"] >= 1.0
    assert all(p.dtype == torch.float32 for p in drafter.parameters())
    assert head is None or head.w_s.dtype == torch.float32


@pytest.mark.gpu
def test_a_job_beside_a_cpu_engine_leaves_the_shared_verifier_on_the_cpu(tmp_path, data):
    """On a GPU host a service with a CPU engine trains beside it: the verifier must stay put."""
    verifier, drafter = _verifier(), _drafter()
    Trainer(_config(tmp_path, "distill", steps=2), drafter, verifier, data).run()
    assert verifier.get_input_embeddings().weight.device.type == "cpu"
    assert next(drafter.parameters()).device.type == "cpu"


@pytest.mark.gpu
def test_a_cuda_verifier_trains_on_cuda(tmp_path, data):
    verifier, drafter = _verifier().to("cuda", torch.bfloat16), _drafter()
    head = new_head_for(verifier, drafter)
    out = Trainer(_config(tmp_path, "sd2", steps=3, eval_every=2), drafter, verifier, data, head).run()
    assert verify_checkpoint(out)["steps"] == 3
    assert verifier.get_input_embeddings().weight.device.type == "cuda"
