"""One schema, three spellings: the trace and metrics dataclasses (sd2), the API's pydantic models and the
ORM's columns must cover exactly the same fields, so a field added in one place and forgotten in another
fails here rather than vanishing from a response or the store."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from sqlalchemy import inspect

from sd2.config import DecodeConfig
from sd2.engine import GenerationResult
from sd2.metrics import GenerationMetrics, SteeringGain, summarize
from sd2.trace import (
    Block,
    BlockKind,
    BlockTimings,
    Candidate,
    Counterfactual,
    CounterfactualToken,
    SteeringOutcome,
    TokenEvent,
    TokenStatus,
)
from service import schemas, trace_rows
from service.orm import BlockRow, Run, TokenEventRow


def _names(dataclass) -> set[str]:
    return {f.name for f in fields(dataclass)}


def _columns(row) -> set[str]:
    return {c.key for c in inspect(row).columns}


def _a_block() -> Block:
    """A speculative block with every optional record filled: explainer lists and a counterfactual."""
    top = [Candidate(7, 0.8, "a"), Candidate(9, 0.1, "c")]
    drafts = [
        TokenEvent(7, TokenStatus.ACCEPTED, 0.9, 0.8, "a", target_rank=1, target_top=top, draft_top=top),
        TokenEvent(8, TokenStatus.REJECTED, 0.5, 0.1, target_rank=3, target_top=top, draft_top=top[:1]),
    ]
    extra = TokenEvent(9, TokenStatus.RESAMPLED, None, 0.7, "c", 2, top, residual_top=[Candidate(9, 1.0)])
    counterfactual = Counterfactual(
        drafts=[
            CounterfactualToken(7, 0.6, 0.8, 1.0, TokenStatus.ACCEPTED, "a", 1, top, top),
            CounterfactualToken(9, 0.3, 0.1, 0.0, TokenStatus.REJECTED, "c", 2),
        ],
        accepted=1,
        expected_accepted=1.0,
        steered_expected_accepted=1.0,
        outcome=SteeringOutcome.TIED,
    )
    timings = BlockTimings(1.0, 2.0, 0.5, 3.5, counterfactual_ms=2.5)
    block = Block(1, BlockKind.SPECULATIVE, drafts, extra, k=2, n_accepted=1, complete=True, timings=timings)
    block.counterfactual = counterfactual
    return block


def test_the_api_models_have_exactly_the_dataclasses_fields():
    block = _a_block()
    assert set(schemas.TokenEventOut.model_fields) == _names(TokenEvent)
    assert set(schemas.TimingsOut.model_fields) == _names(BlockTimings)
    assert set(schemas.BlockOut.model_fields) == set(block.to_dict())  # fields + n_emitted, counts_for_tau
    assert set(block.to_dict()) == _names(Block) | {"n_emitted", "counts_for_tau"}
    assert set(schemas.MetricsOut.model_fields) == _names(GenerationMetrics)
    # the nested records, each with its own model
    assert set(schemas.CandidateOut.model_fields) == _names(Candidate)
    assert set(schemas.CounterfactualOut.model_fields) == _names(Counterfactual)
    assert set(schemas.CounterfactualTokenOut.model_fields) == _names(CounterfactualToken)
    assert set(schemas.SteeringGainOut.model_fields) == _names(SteeringGain)
    schemas.BlockOut.model_validate(block.to_dict())  # every nested value fits its model
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
    """block → row params → a row object → block_dict equals Block.to_dict() (no database needed); the
    nested records are stored as plain JSON values (no enum or dataclass reaches a JSON column)."""
    block = _a_block()
    params = trace_rows.block_params(1, block)
    events = trace_rows.event_params(1, 1, block)
    assert json.loads(json.dumps(params["counterfactual"])) == params["counterfactual"]
    assert type(params["counterfactual"]["outcome"]) is str
    assert type(params["counterfactual"]["drafts"][0]["status"]) is str
    assert events[0]["target_top"] == [
        {"token_id": 7, "prob": 0.8, "text": "a"},
        asdict(Candidate(9, 0.1, "c")),
    ]
    row = BlockRow(**params)
    row.events = [TokenEventRow(**p) for p in events]
    assert trace_rows.block_dict(row) == block.to_dict()
    metrics = summarize([block], 2)
    assert set(metrics.to_dict()) == set(schemas.MetricsOut.model_fields)
    assert metrics.steering_gain is not None  # the block's counterfactual reaches the metrics
    schemas.MetricsOut.model_validate(metrics.to_dict())


def test_a_row_stored_before_the_new_columns_reads_back_as_the_defaults():
    """Rows written before schema v6 hold NULL in its columns: they read back as what a block without
    a counterfactual and explainer gives (Block.to_dict() of the same block without them)."""
    block = _a_block()
    params = trace_rows.block_params(1, block)
    params.update(counterfactual=None, counterfactual_ms=None)
    row = BlockRow(**params)
    events = trace_rows.event_params(1, 1, block)
    for event in events:
        event.update(target_rank=None, target_top=None, draft_top=None, residual_top=None)
    row.events = [TokenEventRow(**p) for p in events]
    old = Block(1, BlockKind.SPECULATIVE, [], None, k=2, n_accepted=1, complete=True)
    old.drafts = [TokenEvent(t.token_id, t.status, t.draft_prob, t.target_prob, t.text) for t in block.drafts]
    extra = block.extra
    old.extra = TokenEvent(extra.token_id, extra.status, extra.draft_prob, extra.target_prob, extra.text)
    old.timings = BlockTimings(1.0, 2.0, 0.5, 3.5)
    assert trace_rows.block_dict(row) == old.to_dict()
    assert trace_rows.block_dict(row)["timings"]["counterfactual_ms"] == 0.0
    assert trace_rows.block_dict(row)["drafts"][0]["target_top"] == []
