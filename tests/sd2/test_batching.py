"""Batched decoding (sd2.batching, sd2.ragged): every request's output is exactly its solo run's, whatever
shares the batch — rows of several requests in one ragged forward equal their solo forwards bit for bit."""

import copy
from collections import Counter

import pytest
import torch

from sd2.batching import Batch
from sd2.config import DecodeConfig
from sd2.decoding import SpeculativeDecoder, VerifierDecoder
from sd2.draft_vocab import DraftVocab, reduced_head_for
from sd2.invariant import MAX_ROWS, make_batch_invariant
from sd2.kv_cache import cached_forward, rollback_cache
from sd2.proposer import Proposer
from sd2.ragged import Segment, ragged_forward
from sd2.steering import new_head_for
from sd2.trace import BlockKind
from tests.sd2.test_decoding import SMALL_PROMPT, SMALL_V, _bound, _exact_law, _tv
from tests.tiny import peaky_llama, tiny_llama

NO_STOP = frozenset()
PROMPTS = [[5, 17, 42, 9, 100, 7], [1, 2], [250, 3, 99, 14, 14, 14, 80, 6, 7, 31, 200], [11, 12, 13, 14]]


@pytest.fixture(scope="module")
def models():
    """An fp32 verifier and drafter on invariant kernels, a steering head and a reduced draft head."""
    verifier = make_batch_invariant(tiny_llama(hidden=64, layers=4, ffn=128, seed=0))
    drafter = make_batch_invariant(tiny_llama(hidden=32, layers=2, ffn=64, seed=1))
    head = new_head_for(verifier, drafter)
    with torch.no_grad():
        head.w_s.normal_(0, 0.3)
    draft_head = reduced_head_for(drafter, DraftVocab(tuple(range(0, 320, 3))))
    return verifier, drafter, head, draft_head


@torch.inference_mode()
def _solo_forwards(model, prompts, news):
    out = []
    for prompt, new in zip(prompts, news, strict=True):
        cache = rollback_cache(model)
        cached_forward(model, prompt, cache, last_only=True)
        out.append(cached_forward(model, new, cache, last_only=False))
    return out


@torch.inference_mode()
def _ragged(model, prompts, news):
    caches = []
    for prompt in prompts:
        caches.append(rollback_cache(model))
        cached_forward(model, prompt, caches[-1], last_only=True)
    logits, _ = ragged_forward(model, [Segment(new, cache) for new, cache in zip(news, caches, strict=True)])
    return logits, caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_requests", [1, 2, 5, 8])
def test_each_requests_rows_equal_its_solo_forward_bit_for_bit(dtype, n_requests):
    model = make_batch_invariant(tiny_llama(hidden=64, layers=3, ffn=128, seed=2).to(dtype))
    with torch.inference_mode():
        _check_rows_equal_solo(model, n_requests)


def _check_rows_equal_solo(model, n_requests: int) -> None:
    generator = torch.Generator().manual_seed(n_requests)
    prompts = [
        torch.randint(3, 320, (int(n),), generator=generator).tolist() for n in torch.randint(1, 90, (8,))
    ]
    news = [torch.randint(3, 320, (int(n),), generator=generator).tolist() for n in torch.randint(1, 9, (8,))]
    prompts, news = prompts[:n_requests], news[:n_requests]
    solo = _solo_forwards(model, prompts, news)
    batched, caches = _ragged(model, prompts, news)
    for one, many, prompt, new, cache in zip(solo, batched, prompts, news, caches, strict=True):
        assert torch.equal(one, many)
        assert cache.get_seq_length() == len(prompt) + len(new)  # each cache holds its own rows only


def _decoders(models, settings):
    """One decoder per request: (kind, DecodeConfig overrides)."""
    verifier, drafter, head, draft_head = models
    made = []
    for kind, config in settings:
        config = DecodeConfig(**config)
        if kind == "verifier":
            made.append(VerifierDecoder(verifier, config, NO_STOP))
            continue
        parts = {
            "self": (copy.deepcopy(verifier), None, None),
            "plain": (drafter, None, None),
            "steered": (drafter, head, None),
            "reduced": (drafter, head, draft_head),
            "counterfactual": (drafter, head, None),
        }[kind]
        model, steering, reduced = parts
        made.append(
            SpeculativeDecoder(
                verifier,
                Proposer(model, steering, reduced),
                config,
                NO_STOP,
                counterfactual=kind == "counterfactual",
            )
        )
    return made


MIXED = [
    ("steered", {"k": 4, "temperature": 0.0, "max_new_tokens": 30, "seed": 0}),
    ("verifier", {"temperature": 1.0, "max_new_tokens": 17, "seed": 1}),
    ("plain", {"k": 2, "temperature": 1.0, "max_new_tokens": 25, "seed": 2}),
    ("reduced", {"k": 3, "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 33, "seed": 3}),
    ("self", {"k": 5, "temperature": 0.0, "max_new_tokens": 20, "seed": 4}),
    ("steered", {"k": 6, "temperature": 1.0, "max_new_tokens": 40, "seed": 5, "draft_threshold": 0.2}),
    ("reduced", {"k": 1, "temperature": 0.0, "max_new_tokens": 12, "seed": 6}),
    ("counterfactual", {"k": 3, "temperature": 1.0, "max_new_tokens": 28, "seed": 7}),
]


def _trace(blocks):
    return [(b.kind, b.k, b.n_accepted, [t.token_id for t in b.drafts], b.extra.token_id) for b in blocks]


def _run_batch(
    batch: Batch, cancel: dict | None = None, join: dict | None = None, pooled: list | None = None
):
    """Step the batch to its end; `join` {round: [(key, program)]}, `cancel` {round: [key]}; `pooled`
    gets the number of caches in the batch's KV pools after each round."""
    blocks, rounds, sizes = {}, 0, []
    while len(batch) or (join and any(r >= rounds for r in join)):
        for key, program in (join or {}).get(rounds, []):
            batch.add(key, program)
        for key in (cancel or {}).get(rounds, []):
            batch.cancel(key)
        report = batch.step()
        if pooled is not None:
            pooled.append(sum(len(pool._slots) for pool in batch._pools.values()))
        sizes += report.verify_rows
        for key, block in report.blocks:
            blocks.setdefault(key, []).append(block)
        rounds += 1
    return blocks, sizes


def test_mixed_requests_decode_together_exactly_as_alone(models):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(MIXED))]
    solo = [list(d.run(p)) for d, p in zip(_decoders(models, MIXED), prompts, strict=True)]
    batch = Batch()
    for i, (decoder, prompt) in enumerate(zip(_decoders(models, MIXED), prompts, strict=True)):
        batch.add(i, decoder.program(prompt))
    blocks, sizes = _run_batch(batch)
    for i, alone in enumerate(solo):
        assert _trace(blocks[i]) == _trace(alone), MIXED[i]
        assert [b.counterfactual for b in blocks[i]] == [b.counterfactual for b in alone]
    assert any(b.counterfactual is not None for b in blocks[7])
    assert max(sizes) == len(MIXED)  # every request in one verifier forward at first
    shared = [b.batch_size for rows in blocks.values() for b in rows]
    assert max(shared) == len(MIXED)
    assert all(rows[0].batch_size == len(MIXED) for rows in blocks.values())  # the prefills share one forward
    assert all(b.batch_size == 1 for alone in solo for b in alone)  # a solo run runs alone


def test_rows_join_and_leave_mid_run_and_a_cancelled_row_leaves_the_others_untouched(models):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(MIXED))]
    solo = [list(d.run(p)) for d, p in zip(_decoders(models, MIXED), prompts, strict=True)]
    programs = [d.program(p) for d, p in zip(_decoders(models, MIXED), prompts, strict=True)]
    batch = Batch()
    for i in (0, 1, 2):
        batch.add(i, programs[i])
    join = {
        2: [(3, programs[3]), (4, programs[4])],
        5: [(5, programs[5]), (6, programs[6]), (7, programs[7])],
    }
    pooled = []
    blocks, _ = _run_batch(batch, cancel={4: [2]}, join=join, pooled=pooled)
    assert max(pooled) >= 6  # verifier and drafter caches of the rows sharing forwards, in the KV pools
    assert all(pool.capacity == 0 for pool in batch._pools.values())  # each left its pool with its row
    assert 0 < len(blocks[2]) < len(solo[2])  # cancelled mid-run
    assert _trace(blocks[2]) == _trace(solo[2][: len(blocks[2])])  # what it had was its own
    for i in (0, 1, 3, 4, 5, 6, 7):
        assert _trace(blocks[i]) == _trace(solo[i])


def test_a_small_row_limit_splits_the_forward_and_stays_exact(models):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(MIXED))]
    solo = [list(d.run(p)) for d, p in zip(_decoders(models, MIXED), prompts, strict=True)]
    batch = Batch(max_rows=9)
    for i, (decoder, prompt) in enumerate(zip(_decoders(models, MIXED), prompts, strict=True)):
        batch.add(i, decoder.program(prompt))
    blocks, sizes = _run_batch(batch)
    assert all(_trace(blocks[i]) == _trace(solo[i]) for i in range(len(MIXED)))
    assert max(sizes) < len(MIXED)


def test_a_prompt_longer_than_the_invariant_row_limit_prefills_alone_and_stays_exact(models):
    """Alone, a prompt of more than MAX_ROWS tokens runs its prefill on the stock kernels: batched, it
    must not share a forward (its rows would then take the invariant ones); the short ones still do."""
    settings = [MIXED[0], MIXED[1], MIXED[3]]
    prompts = [[(7 * i) % 300 + 3 for i in range(MAX_ROWS + 20)], PROMPTS[0], PROMPTS[2]]
    solo = [list(d.run(p)) for d, p in zip(_decoders(models, settings), prompts, strict=True)]
    batch = Batch()
    for i, (decoder, prompt) in enumerate(zip(_decoders(models, settings), prompts, strict=True)):
        batch.add(i, decoder.program(prompt))
    blocks, _ = _run_batch(batch)
    assert all(_trace(blocks[i]) == _trace(solo[i]) for i in range(len(settings)))
    assert [blocks[i][0].batch_size for i in range(len(settings))] == [1, 2, 2]


@pytest.mark.slow
@pytest.mark.statistical
def test_the_sampled_law_holds_per_row_when_batched():
    """The statistical exactness test with 8 rows per batch: emitted tokens 2 and 3 follow the verifier's
    law (steered, T = 1), over 4 000 seeds decoded 8 at a time."""
    verifier = make_batch_invariant(peaky_llama(SMALL_V, 0, hidden=16, layers=2))
    drafter = make_batch_invariant(peaky_llama(SMALL_V, 1, hidden=16, layers=1))
    head = new_head_for(verifier, drafter)
    with torch.no_grad():
        head.w_s.normal_(0, 2.0)
    n, counts, speculative = 4_000, torch.zeros(SMALL_V, SMALL_V), Counter()
    for first in range(0, n, 8):
        batch = Batch()
        for seed in range(first, first + 8):
            config = DecodeConfig(k=2, max_new_tokens=3, temperature=1.0, seed=seed)
            batch.add(
                seed,
                SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP).program(SMALL_PROMPT),
            )
        blocks, sizes = _run_batch(batch)
        assert max(sizes) == 8
        for rows in blocks.values():
            ids = [t.token_id for b in rows for t in b.emitted]
            counts[ids[1], ids[2]] += 1
            speculative.update(b.kind for b in rows)
    assert speculative[BlockKind.SPECULATIVE] >= n
    exact = _exact_law(verifier)
    assert _tv(counts / n, exact) < _bound(exact, n)
