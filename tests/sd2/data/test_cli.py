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
