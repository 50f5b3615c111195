"""The trace's vocabulary: block kinds and the one rule of which blocks τ averages over."""

import json

from sd2.trace import Block, BlockKind, TokenEvent, TokenStatus, counts_for_tau


def test_only_complete_decode_blocks_count_for_tau():
    assert counts_for_tau(BlockKind.SPECULATIVE, True) and counts_for_tau(BlockKind.VERIFIER, True)
    assert not counts_for_tau(BlockKind.PREFILL, True)  # the prompt's token is not a decode step
    assert not any(counts_for_tau(kind, False) for kind in BlockKind)  # cut by EOS or the length limit
    assert counts_for_tau("speculative", True) and not counts_for_tau("prefill", True)  # stored strings


def test_a_block_serialises_its_kind_as_a_plain_string_and_says_whether_it_counts():
    extra = TokenEvent(7, TokenStatus.BONUS, None, 0.9)
    block = Block(3, BlockKind.SPECULATIVE, [], extra, k=0, n_accepted=0, complete=False)
    data = json.loads(json.dumps(block.to_dict()))
    assert data["kind"] == "speculative" and data["counts_for_tau"] is False
    assert data["n_emitted"] == 1
