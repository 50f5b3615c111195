"""Run under `torchrun --nproc_per_node N` by test_multiprocess.py: one tiny distill run,
each rank writing the example ids of every batch it trained on, and its verifier's device, to
OUT_PREFIX.rank<r>.json.

    python -m torch.distributed.run --nproc_per_node 2 tests/sd2/train/rank_probe.py DATA OUT_PREFIX STEPS
"""

import json
import sys
from pathlib import Path

from accelerate import PartialState

from sd2.data.batches import ShardSet
from sd2.train.run import rank_placement
from sd2.train.trainer import TrainData, Trainer
from tests.sd2.train.tiny_runs import tiny_drafter, tiny_verifier, train_config


class RecordingShards(ShardSet):
    def __init__(self, folder):
        super().__init__(folder)
        self.drawn: list[list[str]] = []

    def rows(self, index, trim=False):
        batch = super().rows(index, trim)
        self.drawn.append(list(batch.ids))
        return batch


def main() -> None:
    data_dir, out_prefix, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    placement = rank_placement("fp32")  # starts this process's accelerate state
    state = PartialState()
    shards = RecordingShards(data_dir)
    data = TrainData(shards, None, eval_prompts=[], description={"kind": "test"})
    verifier = tiny_verifier().to(placement.device)
    config = train_config(Path(out_prefix).parent, "distill", steps=steps, batch_size=4, eval_prompts=0)
    Trainer(config, tiny_drafter(), verifier, data).run()
    report = {
        "rank": state.process_index,
        "ranks": state.num_processes,
        "batches": shards.drawn,
        "verifier_device": str(verifier.get_input_embeddings().weight.device),
    }
    out = Path(f"{out_prefix}.rank{state.process_index}.json")
    out.parent.mkdir(parents=True, exist_ok=True)  # only rank 0 saves the checkpoint that creates it
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
