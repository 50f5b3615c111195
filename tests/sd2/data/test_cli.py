import argparse

from sd2.data.cli import add_data_parser, prompt_sets_main, shards_main, synth_main


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="sd2")
    add_data_parser(root.add_subparsers(dest="command", required=True))
    return root


def test_data_subcommands_are_registered_with_config_defaults():
    synth = parser().parse_args(["data", "synth", "--limit", "10", "--temperature", "0"])
    assert (
        synth.func is synth_main and synth.limit == 10 and synth.temperature == 0.0 and synth.split == "train"
    )
    sets = parser().parse_args(["data", "prompt-sets", "--set", "code", "--count", "64"])
    assert sets.func is prompt_sets_main and sets.sets == ["code"] and sets.count == 64
    shards = parser().parse_args(["data", "shards", "x.jsonl"])
    assert shards.func is shards_main and shards.seq_len == 512


def test_synth_refuses_the_test_split():
    import pytest

    with pytest.raises(SystemExit):
        parser().parse_args(["data", "synth", "--split", "test"])


def test_synth_prompt_window_covers_disjoint_stretches():
    import pytest

    from sd2.data.synth import SynthPrompt, prompt_window

    prompts = [SynthPrompt(f"c{i}", (i,)) for i in range(10)]
    first, second = prompt_window(prompts, 0, 4), prompt_window(prompts, 4, 4)
    assert [p.id for p in first] == ["c0", "c1", "c2", "c3"]
    assert [p.id for p in second] == ["c4", "c5", "c6", "c7"]
    assert [p.id for p in prompt_window(prompts, 8, None)] == ["c8", "c9"]
    assert parser().parse_args(["data", "synth", "--skip", "800"]).skip == 800
    with pytest.raises(ValueError, match="skip must be ≥ 0, got -1"):
        prompt_window(prompts, -1, 4)
    with pytest.raises(ValueError, match="skip 10 leaves nothing: there are only 10 prompts"):
        prompt_window(prompts, 10, None)


def test_synth_refuses_several_greedy_samples_before_loading_a_model():
    import pytest

    args = parser().parse_args(["data", "synth", "--temperature", "0", "--samples", "3"])
    with pytest.raises(ValueError, match="--samples > 1 needs --temperature > 0"):
        synth_main(args)
    with pytest.raises(SystemExit):
        parser().parse_args(["data", "synth", "--turns", "last"])


def test_synth_with_an_answerer_writes_the_drafters_own_answers(tiny_pair_dir, tmp_path):
    """--answerer: the drafter answers the training prompts (its greedy answers here, checked against its
    own generate), and the file's settings name it, so a resume with another answerer is refused."""
    import json

    import pytest
    import torch
    from transformers import AutoModelForCausalLM

    verifier_dir, drafter_dir = tiny_pair_dir
    out = tmp_path / "onpolicy.jsonl"
    common = ["data", "synth", "--source", "sharegpt", "--verifier", str(verifier_dir), "--dtype", "fp32"]
    settings = ["--limit", "2", "--max-new-tokens", "5", "--temperature", "0", "--no-progress"]
    args = parser().parse_args([*common, *settings, "--answerer", str(drafter_dir), "--out", str(out)])
    assert synth_main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and any(row["response_ids"] for row in rows)
    assert json.loads((tmp_path / "onpolicy.jsonl.meta.json").read_text())["answerer"] == str(drafter_dir)
    drafter = AutoModelForCausalLM.from_pretrained(drafter_dir, dtype=torch.float32)
    for row in rows:
        prompt = torch.tensor([row["prompt_ids"]])
        with torch.inference_mode():
            expected = drafter.generate(
                prompt, max_new_tokens=5, do_sample=False, eos_token_id=2, pad_token_id=2
            )
        assert row["response_ids"] == expected[0, prompt.shape[1] :].tolist()[: len(row["response_ids"])]
    by_verifier = parser().parse_args([*common, *settings, "--out", str(out)])
    with pytest.raises(ValueError, match="answerer"):
        synth_main(by_verifier)
