"""The Trainer runs inside the serving process: it leaves torch's threads and global RNG as it found
them, its randomness comes from its seed alone, and `build_trainer` is how `sd2 train` builds it."""

import torch
from transformers import LlamaForCausalLM

from sd2.steering import SteeringHead, new_head_for
from sd2.train.build import StartingPoint, build_trainer
from sd2.train.init_drafter import DrafterShape, new_drafter
from sd2.train.trainer import TrainCallback
from tests.sd2.train.tiny_runs import tiny_drafter, tiny_verifier, train_config
from tests.tiny import save_tiny_pair


def _dropout_drafter(p: float = 0.1):
    """The tiny drafter with attention dropout: its training forwards draw from torch's global RNG."""
    drafter = tiny_drafter()
    drafter.config.attention_dropout = p
    for layer in drafter.model.layers:
        layer.self_attn.attention_dropout = p
    return drafter


class _StopAfter(TrainCallback):
    def __init__(self, steps: int):
        self.steps, self.seen = steps, 0

    def on_metric(self, step: int, name: str, value: float) -> None:
        self.seen = step

    def should_stop(self) -> bool:
        return self.seen >= self.steps


def _train(out, data, seed: int, global_seed: int, dropout: float = 0.1, callbacks=()):
    """An sd2 run (new head, validation and checkpoints on the way) under a given global RNG state;
    returns its trained weights."""
    verifier, drafter = tiny_verifier(), _dropout_drafter(dropout)
    torch.manual_seed(global_seed)  # the process's RNG, which must not matter
    config = train_config(out.parent, "sd2", out_dir=str(out), steps=4, seed=seed, eval_every=2, save_every=2)
    trainer = build_trainer(config, verifier, data, StartingPoint(drafter, None, {}), callbacks=callbacks)
    trainer.run()
    recipe = trainer.unwrapped()
    return {**recipe.drafter.state_dict(), **{f"head.{n}": t for n, t in recipe.head.state_dict().items()}}


def _identical(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_a_training_run_leaves_threads_and_the_global_rng_alone(tmp_path, data):
    verifier, drafter = tiny_verifier(), _dropout_drafter()
    probe = _dropout_drafter().train()
    before = torch.get_rng_state()
    probe(input_ids=torch.tensor([[1, 40, 17, 99, 3]]))
    assert not torch.equal(torch.get_rng_state(), before)  # dropout does draw from the global RNG

    threads = torch.get_num_threads()
    torch.manual_seed(1234)
    rng, initial = torch.get_rng_state(), torch.initial_seed()
    # threads set: a Trainer that applied them would change the process's count
    config = train_config(tmp_path, "sd2", steps=4, eval_every=2, save_every=2, threads=threads + 1)
    trainer = build_trainer(config, verifier, data, StartingPoint(drafter, None, {}))
    trainer.run()
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), rng) and torch.initial_seed() == initial
    assert not torch.equal(trainer.rng.cpu_state, torch.Generator().manual_seed(0).get_state())  # it drew


def test_the_seed_alone_decides_the_trained_weights(tmp_path, data):
    first = _train(tmp_path / "first", data, seed=3, global_seed=1)
    again = _train(tmp_path / "again", data, seed=3, global_seed=2)
    assert _identical(first, again)  # bit-identical, whatever the process's RNG held
    assert not _identical(first, _train(tmp_path / "other", data, seed=4, global_seed=1))
    # the dropout draws do shape the weights: the equality above is not for want of randomness
    assert not _identical(first, _train(tmp_path / "no-dropout", data, seed=3, global_seed=1, dropout=0.0))


def test_a_resumed_run_continues_its_own_dropout_draws(tmp_path, data):
    straight = _train(tmp_path / "straight", data, seed=3, global_seed=1)
    _train(tmp_path / "resumed", data, seed=3, global_seed=1, callbacks=[_StopAfter(2)])  # checkpointed
    resumed = _train(tmp_path / "resumed", data, seed=3, global_seed=99)  # another process state
    assert _identical(straight, resumed)


def test_new_drafter_follows_its_seed_and_leaves_the_global_rng_alone():
    verifier, shape = tiny_verifier(), DrafterShape(layers=1, hidden=32, ffn=64)
    torch.manual_seed(99)
    before = torch.get_rng_state()
    first = new_drafter(verifier, shape, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(7)
    assert _identical(first.state_dict(), new_drafter(verifier, shape, seed=5).state_dict())
    assert not _identical(first.state_dict(), new_drafter(verifier, shape, seed=6).state_dict())
    torch.manual_seed(5)  # the weights a globally seeded build gives: earlier runs' drafters reproduce
    reference = LlamaForCausalLM(first.config).state_dict()
    layers = [name for name in reference if ".layers." in name]
    assert layers and all(torch.equal(reference[name], first.state_dict()[name]) for name in layers)


def test_steering_heads_are_built_and_loaded_without_the_global_rng(tmp_path):
    verifier, drafter = tiny_verifier(), tiny_drafter()
    torch.manual_seed(11)
    before = torch.get_rng_state()
    head = new_head_for(verifier, drafter)
    head.save(tmp_path)
    loaded = SteeringHead.load(tmp_path)
    assert torch.equal(torch.get_rng_state(), before)
    d_v, n = head.config.verifier_hidden, len(head.config.verifier_layers)
    assert torch.equal(head.hml.weight, torch.eye(d_v).repeat(1, n)) and not head.hml.bias.any()
    assert not head.w_s.any() and torch.equal(loaded.hml.weight, head.hml.weight)


def test_sd2_train_builds_its_trainers_with_build_trainer_and_sets_the_threads(tmp_path, data, monkeypatch):
    """The command's process owns its threads: `--threads` is applied by `sd2 train`, and the single
    and lockstep runs both go through `build_trainer`."""
    import sd2.train.run as run
    from sd2.cli import main

    verifier_dir, _ = save_tiny_pair(tmp_path / "pair")
    monkeypatch.setattr(run, "training_data", lambda *args, **kwargs: data)
    built = []

    def spy(config, *args, **kwargs):
        built.append((config.objective, torch.get_num_threads()))
        return build_trainer(config, *args, **kwargs)

    monkeypatch.setattr(run, "build_trainer", spy)
    before = torch.get_num_threads()
    wanted = 1 if before > 1 else 2
    common = ["--verifier", str(verifier_dir), "--steps", "1", "--warmup-steps", "0", "--eval-every", "0"]
    common += ["--save-every", "0", "--eval-prompts", "1", "--threads", str(wanted)]
    try:
        base = tmp_path / "base"
        pretrain = ["train", "pretrain", "--out", str(base), "--layers", "1", "--hidden", "32", "--ffn", "64"]
        assert main([*pretrain, *common]) == 0
        runs = ["--run", f"distill={tmp_path / 'distill'}", "--run", f"sd2={tmp_path / 'sd2'}"]
        assert main(["train", "lockstep", "--from", str(base), *runs, *common]) == 0
    finally:
        torch.set_num_threads(before)
    assert built == [("pretrain", wanted), ("distill", wanted), ("sd2", wanted)]
    assert (tmp_path / "sd2" / "steering.safetensors").exists()  # build_trainer gave it a new head
