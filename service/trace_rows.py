"""The trace's dataclasses (sd2.trace) ↔ their ORM rows: one mapping, derived from the dataclass fields.

A Block is stored as one `blocks` row (its scalar fields, its BlockTimings flattened into `*_ms`
columns, its Counterfactual as one JSON column) and one `token_events` row per draft and extra token
(their explainer lists of Candidates as JSON columns); reading a run back rebuilds exactly
`Block.to_dict()` (docs/trace.md). A field added to a dataclass reaches the store and the API through
here, and `tests/service/test_schema_coverage.py` fails until the ORM has its column.

A column added after rows were written holds NULL in those rows; it reads back as its field's default
(`counterfactual_ms` 0.0, `target_top` []), which is what the engine would have recorded without it.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, asdict, fields, is_dataclass
from enum import Enum

from sd2.trace import Block, BlockTimings, TokenEvent, counts_for_tau
from service.orm import BlockRow, TokenEventRow

NESTED = ("drafts", "extra", "timings")  # Block fields stored elsewhere: token_events rows, *_ms columns
BLOCK_FIELDS = tuple(f for f in fields(Block) if f.name not in NESTED)
TIMING_FIELDS = fields(BlockTimings)
EVENT_FIELDS = fields(TokenEvent)
BLOCK_COLUMNS = tuple(f.name for f in BLOCK_FIELDS)
TIMING_COLUMNS = tuple(f.name for f in TIMING_FIELDS)
EVENT_COLUMNS = tuple(f.name for f in EVENT_FIELDS)


def _plain(items: list[tuple[str, object]]) -> dict:
    """asdict's dict_factory: enums as their text, so a JSON column holds plain values only."""
    return {name: str(value) if isinstance(value, Enum) else value for name, value in items}


def _stored(value):
    """A column value: enums as their text, dataclasses (a Counterfactual, a Candidate) as plain dicts,
    sequences as lists (JSON columns)."""
    if isinstance(value, Enum):
        return str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value, dict_factory=_plain)
    if isinstance(value, (list, tuple)):
        return [_stored(item) for item in value]
    return value


def _read(row, field: Field):
    """A column as its field's value: NULL (a row stored before the column existed) is the default."""
    value = getattr(row, field.name)
    if value is not None:
        return value
    if field.default_factory is not MISSING:
        return field.default_factory()
    return None if field.default is MISSING else field.default


def block_params(run_id: int, block: Block) -> dict:
    """The `blocks` row of a Block (for a bulk insert)."""
    return {
        "run_id": run_id,
        **{name: _stored(getattr(block, name)) for name in BLOCK_COLUMNS},
        **{name: getattr(block.timings, name) for name in TIMING_COLUMNS},
    }


def event_params(run_id: int, block_id: int, block: Block) -> list[dict]:
    """The `token_events` rows of a Block: its drafts in order, then its extra token."""
    tokens = [*block.drafts, *([block.extra] if block.extra is not None else [])]
    return [
        {
            "block_id": block_id,
            "run_id": run_id,
            "position": position,
            "is_extra": token is block.extra,
            **{name: _stored(getattr(token, name)) for name in EVENT_COLUMNS},
        }
        for position, token in enumerate(tokens)
    ]


def block_dict(row: BlockRow) -> dict:
    """A stored block as `Block.to_dict()` gives it."""
    drafts = [event_dict(e) for e in row.events if not e.is_extra]
    extra = next((event_dict(e) for e in row.events if e.is_extra), None)
    n_accepted_drafts = sum(d["status"] == "accepted" for d in drafts)
    return {
        **{f.name: _read(row, f) for f in BLOCK_FIELDS},
        "drafts": drafts,
        "extra": extra,
        "timings": {f.name: _read(row, f) for f in TIMING_FIELDS},
        "n_emitted": n_accepted_drafts + (extra is not None),
        "counts_for_tau": counts_for_tau(row.kind, row.complete),
    }


def event_dict(row: TokenEventRow) -> dict:
    """A stored token event as `TokenEvent`'s dict."""
    return {f.name: _read(row, f) for f in EVENT_FIELDS}
