"""k = auto under load (sd2.batch_costs, sd2.draft_length.DraftLength): a greedy row among several requests
drafts for the batch's costs and still emits its solo tokens; a sampled row keeps its solo draft lengths,
so its seed reproduces its solo run whatever decodes beside it."""

import pytest

from sd2.batch_costs import MAX_K, MAX_REQUESTS, DrafterParts, LoadCosts, load_size
from sd2.batching import Batch
from sd2.config import AUTO_MAX_K, DecodeConfig
from sd2.decoding import SpeculativeDecoder
from sd2.draft_length import BatchLoad, CostProfile, DraftLength
from sd2.engine import Engine, GenerateRequest
from sd2.invariant import make_batch_invariant
from sd2.trace import DraftStop
from tests.sd2.test_batching import PROMPTS, _run_batch, _trace, models  # noqa: F401 (a fixture)
from tests.tiny import tiny_llama

NO_STOP = frozenset()
LONG = CostProfile(draft_cost=0.01, verify_ratio=(1.0,) * (AUTO_MAX_K + 1))  # alone: long drafts pay
SHORT = CostProfile(draft_cost=0.5, verify_ratio=tuple(1.0 + 2.0 * k for k in range(AUTO_MAX_K + 1)))


def _under_load(requests: int) -> CostProfile:
    return SHORT


def test_load_sizes_are_powers_of_two_up_to_the_largest_measured():
    assert [load_size(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 40)] == [1, 2, 2, 4, 4, 8, 8, 16, MAX_REQUESTS]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_fixed_k_never_looks_at_the_load(temperature):
    load = BatchLoad(requests=8)
    config = DecodeConfig(k=5, temperature=temperature)
    policy = DraftLength.of(config, LONG, _under_load, load)
    assert policy.next(room=100) == (5, DraftStop.K) and policy.longest == 5
    assert policy.next(room=3) == (3, DraftStop.LENGTH)


def test_a_greedy_auto_row_drafts_for_the_batch_and_alone_for_itself():
    load = BatchLoad(requests=1)
    policy = DraftLength.of(DecodeConfig(k="auto", temperature=0.0), LONG, _under_load, load)
    alone, _ = policy.next(room=100)
    load.requests = 8
    under_load, _ = policy.next(room=100)
    assert alone > under_load == 1
    assert policy.profile() is SHORT
    load.requests = 1
    assert policy.next(room=100)[0] == alone


def test_a_sampled_auto_row_keeps_its_solo_profile_under_load():
    load = BatchLoad(requests=8)
    policy = DraftLength.of(DecodeConfig(k="auto", temperature=1.0, seed=3), LONG, _under_load, load)
    assert policy.profile() is LONG and policy.next(room=100)[0] > 1


def test_auto_needs_a_cost_profile():
    with pytest.raises(ValueError, match="cost profile"):
        DraftLength(None, AUTO_MAX_K, 0.0)


def _decoder(pair, temperature: float, seed: int, load: BatchLoad | None):
    verifier, drafter, head, draft_head = pair
    config = DecodeConfig(k="auto", temperature=temperature, seed=seed, max_new_tokens=30)
    length = DraftLength.of(config, LONG, _under_load if load else None, load)
    return SpeculativeDecoder(verifier, drafter, head, config, NO_STOP, draft_head=draft_head, length=length)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_under_load_emit_their_solo_tokens(models, temperature):  # noqa: F811 (the fixture)
    """Greedy rows draft shorter in the batch (SHORT picks k = 1) and still emit their solo tokens; sampled
    rows draft exactly as alone (same k, same drafts, same tokens)."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(6)]
    solo = [list(_decoder(models, temperature, i, None).run(p)) for i, p in enumerate(prompts)]
    batch = Batch()
    for i, prompt in enumerate(prompts):
        batch.add(i, _decoder(models, temperature, i, batch.load).program(prompt))
    blocks, _ = _run_batch(batch)
    for i, alone in enumerate(solo):
        tokens = [t.token_id for b in blocks[i] for t in b.emitted]
        assert tokens == [t.token_id for b in alone for t in b.emitted]
        if temperature > 0:
            assert _trace(blocks[i]) == _trace(alone)
    shared_ks = [b.k for rows in blocks.values() for b in rows if b.k and b.batch_size > 1]
    alone_ks = [b.k for rows in solo for b in rows if b.k]
    if temperature == 0:
        assert shared_ks and set(shared_ks) == {1} and max(alone_ks) > 1
    else:
        assert max(shared_ks) > 1


def test_measured_profiles_under_load_keep_the_solo_unit_and_shape():
    verifier = make_batch_invariant(tiny_llama(hidden=64, layers=4, ffn=128, seed=0))
    drafter = make_batch_invariant(tiny_llama(hidden=32, layers=2, ffn=64, seed=1))
    costs = LoadCosts(verifier)
    solo = CostProfile(draft_cost=0.2, verify_ratio=(1.0,) * (AUTO_MAX_K + 1))
    parts = DrafterParts(drafter, None, batched=True)
    assert costs.profile("d", parts, solo, step_ms=1.0, requests=1) is solo
    four = costs.profile("d", parts, solo, step_ms=1.0, requests=5)  # measured for 4 requests
    assert costs.measured_sizes == (4,)
    assert four.max_k == MAX_K and list(four.verify_ratio) == sorted(four.verify_ratio)
    assert four.draft_cost > 0 and four.verify_ratio[0] > 0
    unbatched = costs.profile("d", DrafterParts(drafter, None, batched=False), solo, 1.0, 4)
    assert unbatched.draft_cost == solo.draft_cost  # its steps run one by one: their solo cost
    costs.forget("d")
    assert ("d", 4) not in costs._draft


@pytest.mark.slow
def test_the_engine_batches_greedy_auto_rows_for_the_load(tiny_pair_dir):
    """Through the engine: greedy k = auto rows measured under load emit exactly their solo tokens."""
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = Engine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    engine.warm_up(max_batch=4)
    assert engine.measured_load_sizes == (2, 4)
    requests = [
        GenerateRequest(
            prompt=f"Request {i}", method="tiny", decode=DecodeConfig(k="auto", max_new_tokens=12)
        )
        for i in range(4)
    ]
    solo = [engine.generate(r).token_ids for r in requests]
    assert [r.token_ids for r in engine.generate_batch(requests)] == solo
