"""One schema, three spellings: the trace and metrics dataclasses (sd2), the API's pydantic models and the
ORM's columns must cover exactly the same fields, so a field added in one place and forgotten in another
fails here rather than vanishing from a response or the store."""

from __future__ import annotations

from dataclasses import asdict, fields

from sqlalchemy import inspect

from sd2.config import DecodeConfig
from sd2.engine import GenerationResult
from sd2.metrics import GenerationMetrics, summarize
from sd2.trace import Block, BlockKind, BlockTimings, TokenEvent, TokenStatus
from service import schemas, trace_rows
from service.orm import BlockRow, Run, TokenEventRow


def _names(dataclass) -> set[str]:
    return {f.name for f in fields(dataclass)}


def _columns(row) -> set[str]:
    return {c.key for c in inspect(row).columns}


def _a_block() -> Block:
    drafts = [
        TokenEvent(7, TokenStatus.ACCEPTED, 0.9, 0.8, "a"),
        TokenEvent(8, TokenStatus.REJECTED, 0.5, 0.1),
    ]
    extra = TokenEvent(9, TokenStatus.RESAMPLED, None, 0.7, "c")
    return Block(1, BlockKind.SPECULATIVE, drafts, extra, k=2, n_accepted=1, complete=True)


def test_the_api_models_have_exactly_the_dataclasses_fields():
    block = _a_block()
    assert set(schemas.TokenEventOut.model_fields) == _names(TokenEvent)
    assert set(schemas.TimingsOut.model_fields) == _names(BlockTimings)
    assert set(schemas.BlockOut.model_fields) == set(block.to_dict())  # fields + n_emitted, counts_for_tau
    assert set(block.to_dict()) == _names(Block) | {"n_emitted", "counts_for_tau"}
    assert set(schemas.MetricsOut.model_fields) == _names(GenerationMetrics)
    assert set(schemas.ConfigOut.model_fields) == _names(DecodeConfig)
    assert set(schemas.DecodeDefaultsOut.model_fields) == _names(DecodeConfig)


def test_the_request_schema_takes_every_decode_field_with_decode_configs_default():
    settings = schemas.DecodeSettings.model_fields
    for name, value in asdict(DecodeConfig()).items():
        assert name in settings, f"POST /generate cannot set DecodeConfig.{name}"
        assert settings[name].default == value, f"{name}: the API's default differs from DecodeConfig's"


def test_a_generation_response_is_the_result_plus_its_run_id(client):
    response = client.post("/generate", json={"prompt": "Hi", "method": "tiny", "k": 2, "max_new_tokens": 6})
    body = response.json()
    assert set(schemas.GenerationOut.model_fields) == set(body)
    assert set(body) - {"run_id"} == _names(GenerationResult)
    schemas.GenerationOut.model_validate(body)  # and every value fits the documented model
    stored = client.get(f"/runs/{body['run_id']}").json()
    assert stored["blocks"] == body["blocks"]  # the ORM round trip rebuilds Block.to_dict() exactly


def test_the_orm_stores_every_trace_field():
    assert _columns(BlockRow) == (_names(Block) - set(trace_rows.NESTED)) | _names(BlockTimings) | {
        "id",
        "run_id",
    }
    assert _columns(TokenEventRow) == _names(TokenEvent) | {
        "id",
        "block_id",
        "run_id",
        "position",
        "is_extra",
    }
    result_fields = {"text", "token_ids", "method", "steering", "prompt_tokens", "finish_reason", "precision"}
    assert result_fields | {"config", "metrics"} <= _columns(Run)
    metric_columns = _columns(Run) & _names(GenerationMetrics)  # the ones /stats aggregates in SQL
    assert metric_columns == {"n_tokens", "tau", "acceptance_rate", "alpha_hat", "tokens_per_s"}


def test_a_block_survives_the_row_mapping_whole():
    """block → row params → a row object → block_dict equals Block.to_dict() (no database needed)."""
    block = _a_block()
    row = BlockRow(**trace_rows.block_params(1, block))
    row.events = [TokenEventRow(**params) for params in trace_rows.event_params(1, 1, block)]
    assert trace_rows.block_dict(row) == block.to_dict()
    metrics = summarize([block], 2)
    assert set(metrics.to_dict()) == set(schemas.MetricsOut.model_fields)
