"""Two CPU processes (gloo; torchrun, which `accelerate launch --multi_gpu` uses too): each rank trains
on its own batches, with its own verifier on its own device."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from sd2.data.batches import batches
from tests.sd2.train.tiny_runs import tiny_train_data

ROOT = Path(__file__).resolve().parents[3]
STEPS = 5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_train_on_disjoint_batches_of_the_shared_order(tmp_path):
    data = tiny_train_data(tmp_path / "data")
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
        str(ROOT / "tests" / "sd2" / "train" / "rank_probe.py"),
        str(tmp_path / "data"), str(tmp_path / "run" / "probe"), str(STEPS),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((tmp_path / "run" / f"probe.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["ranks"] for r in reports] == [2, 2]
    drawn = [[tuple(b) for b in r["batches"]] for r in reports]
    assert len(drawn[0]) == len(drawn[1]) == STEPS  # one batch per step per rank, in lockstep
    assert not set(drawn[0]) & set(drawn[1])  # the ranks never train on the same batch
    # together they are the first 2·STEPS batches of the single-process order, interleaved
    order = [tuple(b.ids) for b in batches(data.train, 4, seed=0, trim=True)][: 2 * STEPS]
    assert drawn[0] == order[0::2] and drawn[1] == order[1::2]
    assert all(r["verifier_device"] == "cpu" for r in reports)
