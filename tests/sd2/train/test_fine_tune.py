"""The service's short fine-tunes (sd2.train.fine_tune) of a drafter an Engine has loaded."""

from __future__ import annotations

import shutil

from sd2.draft_vocab import DraftVocab
from sd2.engine import Engine
from sd2.train.checkpoint import verify_checkpoint
from sd2.train.fine_tune import FineTune, fine_tune_trainer


def test_a_fine_tune_of_a_loaded_drafter_keeps_its_draft_vocabulary(tmp_path, tiny_pair_dir):
    """A job's drafter drafts over the same reduced vocabulary as the drafter it started from."""
    verifier_dir, drafter_dir = tiny_pair_dir
    base = tmp_path / "base"
    shutil.copytree(drafter_dir, base)
    vocab = DraftVocab(tuple(range(2, 200)), source="test: the first ids", coverage=0.9)
    vocab.save(base)
    engine = Engine.load(str(verifier_dir), {"base": str(base)}, device="cpu", dtype="fp32", shipped=False)
    job = FineTune(
        objective="sd2",
        base="base",
        out_dir=tmp_path / "tuned",
        steps=2,
        batch_size=2,
        lr=1e-3,
        k=2,
        seq_len=16,
        seed=0,
    )
    out = fine_tune_trainer(engine, job, tmp_path / "scratch").run()
    assert DraftVocab.load(out) == vocab and "draft_vocab.json" in verify_checkpoint(out)["files"]
    tuned = Engine.load(str(verifier_dir), {"tuned": str(out)}, device="cpu", dtype="fp32", shipped=False)
    assert tuned.drafter("tuned").draft_head is not None  # and it drafts over it
