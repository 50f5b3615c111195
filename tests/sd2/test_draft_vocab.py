"""sd2.draft_vocab: choosing, storing and applying a reduced draft vocabulary."""

import json

import pytest
import torch

from sd2.draft_vocab import VOCAB_FILE, DraftVocab, ReducedHead, coverage, most_frequent


def test_most_frequent_ranks_by_count_then_id_and_keeps_the_forced_ids():
    streams = [[5, 5, 5, 7, 7, 9], [7, 3, 3, 5]]
    vocab = most_frequent(streams, size=3, always=[2], source="test")
    assert vocab.token_ids == (2, 5, 7)  # 2 forced (a stop id), then 5 (4×), 7 (3×); 3 (2×) cut
    assert vocab.coverage == pytest.approx(7 / 10)
    assert coverage(vocab, [[5, 3, 2, 1]]) == pytest.approx(2 / 4)


def test_a_vocabulary_round_trips_through_its_file(tmp_path):
    vocab = DraftVocab((4, 0, 9), source="answers", coverage=0.5)
    assert vocab.save(tmp_path).name == VOCAB_FILE
    assert DraftVocab.load(tmp_path) == vocab
    assert DraftVocab.load(tmp_path / "missing") is None


@pytest.mark.parametrize("ids", [[], [1, 1], [-1], [1.5]])
def test_a_malformed_vocabulary_file_is_refused(tmp_path, ids):
    (tmp_path / VOCAB_FILE).write_text(json.dumps({"token_ids": ids}))
    with pytest.raises(ValueError, match="distinct non-negative integers"):
        DraftVocab.load(tmp_path)


def test_the_reduced_head_computes_the_kept_rows_and_expands_with_a_fill():
    weight = torch.randn(10, 4)
    head = ReducedHead(weight, DraftVocab((7, 2)))
    hidden = torch.randn(4)
    torch.testing.assert_close(head(hidden), (weight @ hidden)[[7, 2]])
    full = head.expand(torch.tensor([0.25, 0.75]), 0.0)
    assert full.shape == (10,) and full[7] == 0.25 and full[2] == 0.75 and full.sum() == 1.0
    with pytest.raises(ValueError, match="vocab_size 10"):
        ReducedHead(weight, DraftVocab((3, 10)))


def test_a_blocks_reduced_rows_go_back_to_the_vocabulary_at_once():
    head = ReducedHead(torch.randn(10, 4), DraftVocab((7, 2, 5)))
    assert [head.vocabulary_id(i) for i in range(3)] == [7, 2, 5]
    logits = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # [K, N]
    probs = torch.softmax(logits, -1)
    full_logits, full_probs = head.to_vocabulary(logits, probs)  # [K, V] each
    assert full_logits.shape == full_probs.shape == (2, 10)
    assert torch.equal(full_logits[:, [7, 2, 5]], logits) and torch.equal(full_probs[:, [7, 2, 5]], probs)
    pruned = [0, 1, 3, 4, 6, 8, 9]
    assert torch.isneginf(full_logits[:, pruned]).all() and not full_probs[:, pruned].any()
    for row in range(2):  # a row expanded alone is the same row
        alone = head.to_vocabulary(logits[row], probs[row])
        assert torch.equal(alone[0], full_logits[row]) and torch.equal(alone[1], full_probs[row])
