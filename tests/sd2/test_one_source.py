"""One source per fact: the decode defaults live in DecodeConfig alone, and the configs are built by
keyword everywhere, so reordering a dataclass's fields cannot silently swap two values."""

from __future__ import annotations

from dataclasses import asdict, fields

import pytest

from sd2.cli import build_parser
from sd2.config import DECODE_DEFAULTS, DecodeConfig
from sd2.data.shards import ShardConfig
from sd2.engine import GenerateRequest
from sd2.train.config import TrainConfig
from sd2.train.fine_tune import FineTune
from sd2.train.init_drafter import DrafterShape

KEYWORD_ONLY = (DecodeConfig, GenerateRequest, TrainConfig, FineTune, ShardConfig, DrafterShape)


@pytest.mark.parametrize("config", KEYWORD_ONLY, ids=lambda c: c.__name__)
def test_configs_take_keywords_only_so_a_field_reorder_changes_no_caller(config):
    assert all(f.kw_only for f in fields(config))
    with pytest.raises(TypeError, match="positional"):
        config(*[None] * len([f for f in fields(config) if f.init]))


def test_top_k_and_top_p_cannot_be_swapped_by_position():
    """The bug a positional call had: DecodeConfig(k, temperature, top_k, top_p) after a reorder."""
    with pytest.raises(TypeError):
        DecodeConfig(4, 0.0, 0.9, 40)
    config = DecodeConfig(k=4, top_p=0.9, top_k=40)
    assert (config.top_k, config.top_p) == (40, 0.9)


def test_sd2_generate_flags_default_to_decode_config():
    args = build_parser().parse_args(["generate", "--prompt", "Hi"])
    flags = {name: getattr(args, name) for name in asdict(DECODE_DEFAULTS)}
    assert flags == asdict(DecodeConfig())
