"""Write `sd2-schema-v1.db`: a trace store made by sd2 at schema version 1, by that version's own code.

Run it with the tree of commit 6a89350 (the last with `SCHEMA_VERSION = 1`) first on the path, so every
import below is the old code (see README.md here):

    mkdir /tmp/sd2-old && git archive 6a89350 | tar -x -C /tmp/sd2-old
    PYTHONPATH=/tmp/sd2-old HF_HUB_OFFLINE=1 .venv/bin/python tests/service/data/make_schema_v1_db.py \
        tests/service/data/sd2-schema-v1.db

The old service starts on a new file (its own `migrate()` creates version 1), registers the tiny drafter,
and stores one speculative run (blocks, token events) and one comparison through its HTTP API.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from fastapi.testclient import TestClient

import service.db
from service.app import create_app
from service.settings import Settings
from tests.tiny import save_tiny_pair

PROMPT = "Tell me a short story about a cat."


def main(out: Path) -> None:
    assert service.db.SCHEMA_VERSION == 1, f"not the version-1 code: {service.db.__file__}"
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        verifier_dir, drafter_dir = save_tiny_pair(Path(tmp))
        settings = Settings(
            home=Path(tmp) / "home",
            database_url=f"sqlite:///{out.resolve()}",
            verifier=str(verifier_dir),
            drafters=(("tiny", str(drafter_dir)),),
            device="cpu",
        )
        with TestClient(create_app(settings)) as client:
            body = {"prompt": PROMPT, "k": 4, "max_new_tokens": 12, "seed": 0}
            run = client.post("/generate", json={**body, "method": "tiny"})
            assert run.status_code == 200, run.text
            compared = client.post("/compare", json={**body, "methods": ["verifier", "tiny"]})
            assert compared.status_code == 200, compared.text
    print(f"wrote {out}: run {run.json()['run_id']}, comparison {compared.json()['comparison_id']}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
