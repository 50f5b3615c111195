"""Drafters that training jobs registered in the shared store, loaded into this server's Engine: at
start-up (after a restart), and on demand when a request names one this replica has not loaded yet
(another replica sharing the database and SD2_HOME trained it)."""

from __future__ import annotations

import logging
from pathlib import Path

from service import queries
from service.db import Database
from service.generation import ModelHost

log = logging.getLogger(__name__)


def load_trained_drafters(
    db: Database, host: ModelHost, drafters_dir: Path, only: str | None = None
) -> list[str]:
    """Load the registered training drafters this Engine lacks (just `only`, when given) whose folder
    lies in `drafters_dir` and exists; returns the names loaded. A broken checkpoint is logged and
    skipped: it must not keep the server down."""
    with db.read() as session:
        rows = [r for r in queries.drafter_rows(session).values() if r.source == "training"]
    candidates = [
        (row.name, Path(row.path))
        for row in rows
        if (only is None or row.name == only)
        and row.name not in host.engine.drafter_names()
        and Path(row.path).parent == drafters_dir
        and Path(row.path).is_dir()
    ]
    if not candidates:  # the common case of an unknown name: no lock taken
        return []
    loaded = []
    with host.lock:  # the Engine's registry changes; no decode may be choosing a drafter meanwhile
        for name, folder in candidates:
            if name in host.engine.drafter_names():  # another request loaded it meanwhile
                continue
            try:
                host.engine.load_drafter(name, folder)
                loaded.append(name)
            except Exception:
                log.exception("could not load trained drafter %r from %s", name, folder)
    return loaded
