"""A batch's KV pool (sd2.kv_pool): caches moved into slots of shared buffers keep their keys, stay zero
past their length, grow, and give the same logits bit for bit in ragged and solo forwards."""

import pytest
import torch
from transformers import DynamicCache

from sd2.invariant import make_batch_invariant
from sd2.kv_cache import CAPACITY_QUANTUM, cached_forward, crop_to, rollback_cache, zero_padded
from sd2.kv_pool import KVPool, shared_pool
from sd2.ragged import Segment, ragged_forward
from tests.tiny import tiny_llama


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def model(request):
    return make_batch_invariant(tiny_llama(hidden=64, layers=3, ffn=128, seed=4).to(request.param))


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 320, (int(t),), generator=generator).tolist() for t in torch.randint(1, 80, (n,))
    ]


def _filled(model, prompts) -> list[DynamicCache]:
    caches = []
    for prompt in prompts:
        caches.append(rollback_cache(model))
        cached_forward(model, prompt, caches[-1], last_only=True)
    return caches


def _ragged(model, news, caches) -> list[torch.Tensor]:
    return ragged_forward(model, [Segment(n, c) for n, c in zip(news, caches, strict=True)])[0]


def _snapshot(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def _same(cache: DynamicCache, snapshot) -> bool:
    return all(
        torch.equal(layer.keys, k) and torch.equal(layer.values, v)
        for layer, (k, v) in zip(cache.layers, snapshot, strict=True)
    )


def _zero_past_length(cache: DynamicCache) -> bool:
    return all(
        not buffer[..., layer._length :, :].any() for layer in cache.layers for buffer in layer._buffers
    )


@torch.inference_mode()
def test_adopted_caches_keep_their_keys_in_slots_that_grow_and_come_back_on_release(model):
    caches = _filled(model, _prompts(5))
    before = [_snapshot(cache) for cache in caches]
    pool = KVPool()
    for cache in caches:  # 1, 2, 4, 8 slots: the pool grows and re-points the caches already in it
        assert pool.adopt(cache) and pool.adopt(cache)  # a second adopt is a no-op
    assert sorted(pool.slot(cache) for cache in caches) == list(range(5))
    assert shared_pool(caches) is pool
    for cache, snapshot in zip(caches, before, strict=True):
        assert _same(cache, snapshot) and _zero_past_length(cache)
        layer = cache.layers[0]
        assert layer._buffers[0].untyped_storage().data_ptr() == pool._keys[0].untyped_storage().data_ptr()
        padded = zero_padded(layer.keys[0], 64)  # a slot's keys read padded as a view
        assert (
            padded is not None
            and padded.untyped_storage().data_ptr() == pool._keys[0].untyped_storage().data_ptr()
        )
    pool.release(caches[1])
    assert pool.slot(caches[1]) is None and caches[1].layers[0]._pool is None
    assert _same(caches[1], before[1]) and _zero_past_length(caches[1])
    assert shared_pool(caches) is None  # not every cache is in it any more
    reused = _filled(model, _prompts(1, seed=9))[0]
    snapshot = _snapshot(reused)
    assert pool.adopt(reused) and pool.slot(reused) == 1  # the freed slot, zeroed past the new keys
    assert _same(reused, snapshot) and _zero_past_length(reused)
    for cache in [*caches[:1], *caches[2:], reused]:
        pool.release(cache)
    assert pool.capacity == 0  # the last cache gone: the buffers go


@torch.inference_mode()
def test_a_cache_that_cannot_join_is_left_as_it_is(model):
    pool = KVPool()
    assert not pool.adopt(rollback_cache(model))  # nothing cached yet
    plain = DynamicCache(config=model.config)
    cached_forward(model, [5, 6, 7], plain, last_only=True)
    assert not pool.adopt(plain)  # transformers' own layers
    assert pool.capacity == 0


@torch.inference_mode()
def test_a_reset_cache_leaves_its_slot_zero_and_the_pool_untouched(model):
    caches = _filled(model, _prompts(2, seed=5))
    pool = KVPool()
    assert all(pool.adopt(cache) for cache in caches)
    slot = pool.slot(caches[0])
    caches[0].reset()
    assert caches[0].get_seq_length() == 0 and caches[0].layers[0]._pool is None
    assert not pool._keys[0][slot].any() and not pool._values[-1][slot].any()
    assert shared_pool(caches) is None  # a forward over it takes the unpooled path
    pool.grow(4 * CAPACITY_QUANTUM)  # a resize does not pull the reset layers back in
    assert caches[0].layers[0]._pool is None and caches[1].layers[0]._pool is pool
    plain = _filled(model, [[5, 6, 7]])[0]
    cached_forward(model, [5, 6, 7], caches[0], last_only=True)  # it refills on buffers of its own
    assert _same(caches[0], _snapshot(plain)) and caches[0].layers[0]._pool is None


@torch.inference_mode()
def test_pooled_ragged_and_solo_forwards_equal_unpooled_ones_bit_for_bit(model):
    prompts = _prompts(6, seed=1)
    plain, pooled = _filled(model, prompts), _filled(model, prompts)
    pool = KVPool()
    assert all(pool.adopt(cache) for cache in pooled)
    generator = torch.Generator().manual_seed(3)
    for step in range(6):
        news = [torch.randint(3, 320, (1 + (i + step) % 5,), generator=generator).tolist() for i in range(6)]
        outputs = [_ragged(model, news, caches) for caches in (plain, pooled)]
        assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))
        for cache, rejected in zip(plain + pooled, [step % 3] * 12, strict=True):  # a rollback of 0–2 drafts
            crop_to(cache, cache.get_seq_length() - rejected)
        one = [cached_forward(model, [7 + step], caches[2], last_only=False) for caches in (plain, pooled)]
        assert torch.equal(*one)  # a solo forward on a pooled cache writes through its slot
    for a, b in zip(plain, pooled, strict=True):
        assert _same(b, _snapshot(a)) and _zero_past_length(b)


@torch.inference_mode()
def test_a_pooled_forward_past_the_capacity_grows_every_slot(model):
    prompts = [[3 + i % 300 for i in range(CAPACITY_QUANTUM - 2)], [4, 5, 6]]
    plain, pooled = _filled(model, prompts), _filled(model, prompts)
    pool = KVPool()
    assert all(pool.adopt(cache) for cache in pooled)
    assert pool.capacity == CAPACITY_QUANTUM
    news = [[9, 10, 11, 12], [13]]
    outputs = [_ragged(model, news, caches) for caches in (plain, pooled)]
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))
    assert pool.capacity == 2 * CAPACITY_QUANTUM
    for a, b in zip(plain, pooled, strict=True):
        assert _same(b, _snapshot(a)) and _zero_past_length(b)
    long = [3 + i % 300 for i in range(2 * CAPACITY_QUANTUM)]
    one = [cached_forward(model, long, caches[1], last_only=True) for caches in (plain, pooled)]  # solo grow
    assert torch.equal(*one)
    assert pool.capacity == 4 * CAPACITY_QUANTUM  # doubled, as a layer's own buffer would
    assert pooled[1].layers[0]._pool is pool
    for a, b in zip(plain, pooled, strict=True):
        assert _same(b, _snapshot(a)) and _zero_past_length(b)
