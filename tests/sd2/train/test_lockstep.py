"""Fine-tunes in lockstep: the same results as separate runs, with one verifier forward per batch."""

import json

import pytest
import torch

from sd2.steering import new_head_for
from sd2.train.lockstep import lockstep_note, run_in_lockstep, share_verifier
from sd2.train.trainer import TrainData, Trainer
from tests.sd2.train.tiny_runs import tiny_drafter, tiny_verifier, train_config

RECIPES = {"distill": {}, "sd2": {}, "sd2-frozen": {"freeze_drafter": True}}


def _trainers(root, verifier, data, **overrides):
    """distill, sd2 and frozen-drafter sd2 from one base drafter, each in its own folder under root."""
    trainers = []
    for name, extra in RECIPES.items():
        objective = "distill" if name == "distill" else "sd2"
        drafter = tiny_drafter()
        head = new_head_for(verifier, drafter) if objective == "sd2" else None
        config = train_config(root, objective, out_dir=str(root / name), **(extra | overrides))
        trainers.append(Trainer(config, drafter, verifier, data, head))
    return trainers


def _state(folder):
    return torch.load(folder / "trainer_state.pt", weights_only=False)


def _same_weights(a, b) -> bool:
    files = [f.name for f in a.glob("*.safetensors")]
    return bool(files) and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def _count_verifier_forwards(verifier) -> list[int]:
    calls = [0]
    verifier.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_lockstep_equals_separate_runs_with_one_verifier_forward_per_batch(tmp_path, data, grad_accum):
    train_only = TrainData(data.train)  # no validation: every verifier forward below is a training one
    verifier = tiny_verifier()
    calls = _count_verifier_forwards(verifier)
    steps = 6
    for trainer in _trainers(tmp_path / "separate", verifier, train_only, steps=steps, grad_accum=grad_accum):
        trainer.run()
    assert calls[0] == 3 * steps * grad_accum
    calls[0] = 0
    together = _trainers(tmp_path / "lockstep", verifier, train_only, steps=steps, grad_accum=grad_accum)
    outs = run_in_lockstep(together)
    assert calls[0] == steps * grad_accum  # one forward per batch, shared by the three runs
    shared = together[0].unwrapped().targets
    assert (shared.computed, shared.shared) == (steps * grad_accum, 2 * steps * grad_accum)
    assert [o.name for o in outs] == list(RECIPES)
    for name in RECIPES:
        separate, lockstep = tmp_path / "separate" / name, tmp_path / "lockstep" / name
        assert _state(separate)["history"] == _state(lockstep)["history"], name
        assert _same_weights(separate, lockstep), name
        card = json.loads((lockstep / "sd2_card.json").read_text())
        assert card["steps"] == steps
        assert card["trainer"] == lockstep_note(list(RECIPES))
        assert "trainer" not in json.loads((separate / "sd2_card.json").read_text())


def test_lockstep_runs_resume_and_validate_like_separate_ones(tmp_path, data):
    """With validation, checkpoints and a resume in the middle, the lockstep runs still match."""
    verifier = tiny_verifier()
    schedule = dict(steps=6, eval_every=3, save_every=2)
    for trainer in _trainers(tmp_path / "separate", verifier, data, **schedule):
        trainer.run()
    interrupted = _trainers(tmp_path / "lockstep", verifier, data, **schedule)
    share_verifier(interrupted)
    for trainer in interrupted:  # stopped after 5 of 6 steps: the last checkpoint is step 4's
        trainer.start()
        for _ in range(5):
            trainer.advance()
    assert _state(tmp_path / "lockstep" / "sd2")["step"] == 4
    run_in_lockstep(_trainers(tmp_path / "lockstep", verifier, data, **schedule))
    for name in RECIPES:
        separate, lockstep = tmp_path / "separate" / name, tmp_path / "lockstep" / name
        assert _state(separate)["history"] == _state(lockstep)["history"], name
        assert _same_weights(separate, lockstep), name


def test_lockstep_runs_share_the_verifier_on_validation_batches_too(tmp_path, data):
    validated = TrainData(data.train, data.validation)  # 4 validation batches, no τ prompts
    trainers = _trainers(tmp_path, tiny_verifier(), validated, steps=3)  # validated once, at the end
    run_in_lockstep(trainers)
    shared = trainers[0].unwrapped().targets
    assert (shared.computed, shared.shared) == (3 + 4, 2 * (3 + 4))
    assert all("val_loss" in t.history[-1] for t in trainers)


def test_lockstep_refuses_runs_that_would_draw_different_batches(tmp_path, data):
    verifier = tiny_verifier()
    mixed = _trainers(tmp_path / "a", verifier, data)
    mixed[2] = _trainers(tmp_path / "b", verifier, data, seed=7)[2]
    with pytest.raises(ValueError, match=r"seed differs \(.*sd2-frozen: 7, .*distill: 0\)"):
        share_verifier(mixed)
    mixed[2] = _trainers(tmp_path / "c", verifier, TrainData(data.train))[2]
    with pytest.raises(ValueError, match="same verifier and data"):
        share_verifier(mixed)
    pretrain = Trainer(train_config(tmp_path, "pretrain"), tiny_drafter(), None, data)
    with pytest.raises(ValueError, match="pretraining runs no verifier"):
        share_verifier([pretrain])


def test_the_lockstep_command_builds_one_config_per_run(tmp_path, capsys):
    from sd2.cli import build_parser, main
    from sd2.train.run import lockstep_configs

    argv = ["train", "lockstep", "--from", "BASE", "--run", "distill=a", "--run", "sd2-frozen=b"]
    args = build_parser().parse_args([*argv, "--steps", "3", "--skip-batches", "2", "--precision", "bf16"])
    assert args.runs == [("distill", "a"), ("sd2-frozen", "b")] and args.bases == [(None, "BASE")]
    (distill, distill_base), (frozen, frozen_base) = lockstep_configs(args)
    assert distill_base == frozen_base == "BASE"
    assert (distill.objective, distill.freeze_drafter, distill.out_dir) == ("distill", False, "a")
    assert (frozen.objective, frozen.freeze_drafter, frozen.out_dir) == ("sd2", True, "b")
    assert (
        (frozen.steps, frozen.skip_batches, frozen.precision)
        == (3, 2, "bf16")
        == (distill.steps, distill.skip_batches, distill.precision)
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "lockstep", "--from", "BASE", "--run", "pretrain=a"])
    assert "RECIPE one of distill, sd2, sd2-frozen" in capsys.readouterr().err
    assert main(["train", "lockstep", "--from", "BASE", "--run", "sd2=x", "--run", "distill=./x"]) == 2
    assert "each --run needs its own OUT folder" in capsys.readouterr().err


def test_the_lockstep_command_can_start_each_run_from_its_own_checkpoint(capsys):
    """Continuing every shipped fine-tune by one more equal stage: --from RECIPE=PATH per run, a plain
    --from PATH for the rest; a run left without a base, or a base for a recipe with no run, is refused."""
    from sd2.cli import build_parser, main
    from sd2.train.run import lockstep_configs

    runs = ["--run", "distill=a", "--run", "sd2=b", "--run", "sd2-frozen=c"]
    own = ["--from", "distill=D", "--from", "sd2=S", "--from", "sd2-frozen=F"]
    args = build_parser().parse_args(["train", "lockstep", *runs, *own])
    assert [base for _, base in lockstep_configs(args)] == ["D", "S", "F"]
    args = build_parser().parse_args(["train", "lockstep", *runs, "--from", "sd2=S", "--from", "BASE"])
    assert [base for _, base in lockstep_configs(args)] == ["BASE", "S", "BASE"]
    args = build_parser().parse_args(["train", "lockstep", *runs, "--from", "./x=y"])  # a path with "="
    assert [base for _, base in lockstep_configs(args)] == ["./x=y"] * 3
    for extra, message in (
        (["--from", "sd2=S"], "no base for the distill, sd2-frozen run"),
        (["--from", "B1", "--from", "B2"], "--from PATH is given 2 times"),
        (["--from", "sd2=S", "--from", "sd2=T", "--from", "B"], "--from sd2=… is given twice"),
    ):
        assert main(["train", "lockstep", *runs, *extra]) == 2
        assert message in capsys.readouterr().err
    assert main(["train", "lockstep", "--run", "distill=a", "--from", "B", "--from", "sd2=S"]) == 2
    assert "--from sd2=S names a recipe with no --run sd2=OUT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "lockstep", *runs, "--from", "sd2="])
    assert "names no checkpoint after sd2=" in capsys.readouterr().err
