import json

import pytest

from sd2.bench.aggregate import aggregate, best_k
from sd2.bench.forward import ForwardTimes
from sd2.bench.harness import BenchResult
from sd2.bench.measure import GenerationStats, Measurement
from sd2.bench.plan import BenchPlan, resolve_methods
from sd2.bench.prompts import BenchPrompt, PromptSet


def _stats(wall_ms: float, judged=(9, 9), **extra) -> GenerationStats:
    return GenerationStats(tuple(range(10)), 50.0, wall_ms, judged[0], judged[1], **extra)


@pytest.fixture
def synthetic_result() -> BenchResult:
    """A two-set, three-method result built by hand (no models): verifier, hf-generate, self at k=4."""
    plan = BenchPlan(methods=resolve_methods(["verifier", "hf-generate", "self"], []), ks=(4,), repeats=2)
    sets = [
        PromptSet(name, (BenchPrompt(f"{name}-0", prompt="x"),), f"{name}.jsonl", False, 1, "0" * 64)
        for name in ("chat", "code")
    ]
    rows = []
    for prompt_set, spec_wall in (("chat", 300.0), ("code", 450.0)):
        for repeat in range(2):
            key = (prompt_set, f"{prompt_set}-0", 0.0)
            rows.append(Measurement("verifier", *key, None, repeat, _stats(950.0)))
            rows.append(Measurement("hf-generate", *key, None, repeat, _stats(1000.0)))
            rows.append(
                Measurement(
                    "self",
                    *key,
                    4,
                    repeat,
                    _stats(
                        spec_wall,
                        judged=(2, 10),
                        accepted=8,
                        drafted=8,
                        histogram=(0, 0, 0, 0, 2),
                        overlap_sum=8.0,
                        overlap_count=8,
                        draft_ms=8.0,
                        draft_steps=8,
                        verify_ms=20.0,
                        verify_count=2,
                    ),
                )
            )
    forwards = {s.name: ForwardTimes(s.name, {1: 60.0, 5: 90.0}, {"self": 60.0}) for s in sets}
    summaries = aggregate(plan.cells(), rows, forwards)
    profiles = {"self": {"draft_cost": 1.0, "verify_ratio": [1.0, 1.2, 1.5]}}  # what k = auto weighed
    return BenchResult(plan, sets, rows, forwards, summaries, best_k(summaries), profiles)


@pytest.fixture
def chat_prompts_dir(tmp_path):
    """A prompts folder holding a three-prompt `chat` set, for end-to-end `sd2 bench` runs."""
    folder = tmp_path / "prompts"
    folder.mkdir()
    lines = [json.dumps({"id": f"p{i}", "prompt": f"Hello! Tell me story {i}."}) for i in range(3)]
    (folder / "chat.jsonl").write_text("\n".join(lines) + "\n")
    return folder
