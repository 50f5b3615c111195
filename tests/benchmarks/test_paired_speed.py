"""benchmarks/paired_speed.py end to end on the tiny random pair: the rows it prints and the JSON it keeps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "paired_speed.py"


def test_paired_speed_prints_a_row_per_set_and_method_and_the_pooled_rows(tiny_pair_dir, tmp_path):
    verifier_dir, drafter_dir = tiny_pair_dir
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for name in ("chat", "code"):
        lines = [json.dumps({"id": f"{name}{i}", "prompt": f"{name} prompt {i}, go on"}) for i in range(3)]
        (prompts / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    out, per_prompt = tmp_path / "paired.md", tmp_path / "paired.json"
    command = [
        sys.executable, str(SCRIPT), "--verifier", str(verifier_dir),
        "--methods", "verifier", "a", "b", "--drafter", f"a={drafter_dir}", "--drafter", f"b={drafter_dir}",
        "--against", "a", "--prompts-dir", str(prompts), "--prompt-sets", "chat", "code",
        "--max-prompts", "3", "--max-new-tokens", "8", "--k", "3", "--dtype", "fp32",
        "--out", str(out), "--json", str(per_prompt),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [
        line.split(" | ")
        for line in out.read_text().splitlines()
        if line.startswith("| a ") or line.startswith("| b ")
    ]
    sets = ("chat", "code", "all sets")
    assert [(row[0], row[1]) for row in rows] == [
        (method, name) for name in sets for method in ("| a", "| b")
    ]
    by_method = {(row[0], row[1]): row for row in rows}
    assert by_method[("| a", "all sets")][-1] == "6/6 |"  # greedy: every output is the verifier's
    assert by_method[("| a", "chat")][7] == by_method[("| a", "chat")][8] == "–"  # a is --against itself
    # b is the same drafter as a: the same drafts, so the same τ on every prompt
    assert by_method[("| b", "all sets")][8] == "+0.000 [+0.000, +0.000] (0/6)"
    ratio = re.compile(r"\d+\.\d{3}× \[\d+\.\d{3}, \d+\.\d{3}\]( \*)? \((\d)/(\d)\)")
    for name, n in (("chat", "3"), ("all sets", "6")):
        for column in (6, 7):  # paired speed-up over the verifier; b against a
            match = ratio.fullmatch(by_method[("| b", name)][column])
            assert match and match.group(3) == n, by_method[("| b", name)][column]
    kept = json.loads(per_prompt.read_text())
    assert set(kept["sets"]) == {"chat", "code"}
    assert len(kept["sets"]["code"]["verifier"]["ms_per_token"]) == 3
    assert "--against a" in kept["command"]


def test_paired_speed_refuses_an_against_method_it_does_not_run(tmp_path):
    command = [sys.executable, str(SCRIPT), "--methods", "verifier", "sd2", "--against", "cut"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--against 'cut' is not one of --methods" in done.stderr
