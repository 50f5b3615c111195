"""The tiny-pair server, as a real `sd2 serve` subprocess, stays small and does not grow per request.

The 2.5 GB claim for the embedded pair comes from benchmarks/service_memory.py; this CPU test guards
the same harness and catches a server that balloons (e.g. loads something per request) or leaks.
"""

from __future__ import annotations

import httpx

from benchmarks.service_memory import GB, running_server, tree_rss
from tests.service.conftest import PROMPT

IDLE_LIMIT_GB = 1.5  # python + torch + transformers + fastapi with a tiny pair: ≈ 0.5 GB here
GROWTH_LIMIT_GB = 0.1  # over 12 runs after warm-up: their rows live in SQLite, not in memory


def test_tiny_pair_server_rss_is_bounded_and_does_not_grow_per_request(tmp_path, tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    env = {
        "SD2_HOME": str(tmp_path / "home"),
        "SD2_VERIFIER": str(verifier_dir),
        "SD2_DRAFTERS": f"tiny={drafter_dir}",
        "SD2_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
    }
    with running_server(env, timeout_s=120) as (url, process):
        idle = tree_rss(process)
        assert idle < IDLE_LIMIT_GB * GB, f"idle RSS {idle / GB:.2f} GB"

        def run(i: int) -> None:
            body = {"prompt": PROMPT, "method": ("tiny", "verifier", "self")[i % 3], "max_new_tokens": 32}
            assert httpx.post(f"{url}/generate", json=body, timeout=120).status_code == 200

        for i in range(3):  # warm-up: first forwards touch the weights and fill allocator pools
            run(i)
        warm = tree_rss(process)
        for i in range(12):
            run(i)
        grown = tree_rss(process) - warm
        assert grown < GROWTH_LIMIT_GB * GB, f"RSS grew {grown / 1e6:.0f} MB over 12 runs"
        assert httpx.get(f"{url}/runs", timeout=10).json()["total"] == 15
