"""The rollback cache's bucketed layers (sd2.kv_cache): keys written in place at the front of a buffer
that stays zero past the cached length, so the invariant attention reads them padded without a copy and
computes the same logits as on transformers' own layers."""

import gc

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from sd2.invariant import make_batch_invariant
from sd2.kv_cache import (
    _ZERO_TAILED,
    CAPACITY_QUANTUM,
    BucketedLayer,
    cached_forward,
    crop_to,
    rollback_cache,
    zero_padded,
)
from tests.tiny import tiny_llama


def _kv(t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, t, 4, generator=g), torch.randn(1, 2, t, 4, generator=g)


def test_updates_and_crops_keep_the_buffer_zero_past_the_length():
    layer = BucketedLayer()
    k1, v1 = _kv(5)
    keys, values = layer.update(k1, v1)
    assert torch.equal(keys, k1) and torch.equal(values, v1) and layer.get_seq_length() == 5
    k2, v2 = _kv(3, seed=1)
    keys, _ = layer.update(k2, v2)
    assert torch.equal(keys, torch.cat([k1, k2], dim=-2))
    layer.crop(-4)
    assert layer.get_seq_length() == 4 and torch.equal(layer.keys, k1[..., :4, :])
    buffer = layer._buffers[0]
    assert buffer.shape[-2] == CAPACITY_QUANTUM and not buffer[..., 4:, :].any()
    padded = zero_padded(layer.keys[0], 64)
    assert padded is not None and torch.equal(padded, F.pad(k1[0, :, :4], (0, 0, 0, 60)))
    assert padded.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()  # a view, no copy


def test_the_buffer_grows_past_its_capacity_and_keeps_the_cached_rows():
    layer = BucketedLayer()
    k1, v1 = _kv(CAPACITY_QUANTUM - 1)
    layer.update(k1, v1)
    k2, v2 = _kv(10, seed=2)
    keys, values = layer.update(k2, v2)
    assert layer._buffers[0].shape[-2] == 2 * CAPACITY_QUANTUM
    assert torch.equal(keys, torch.cat([k1, k2], dim=-2)) and torch.equal(values, torch.cat([v1, v2], dim=-2))
    assert zero_padded(keys[0], 3 * CAPACITY_QUANTUM) is None  # longer than the buffer: the caller pads


def test_other_tensors_are_not_taken_for_zero_tailed_buffers():
    k, _ = _kv(5)
    assert zero_padded(k[0], 64) is None
    layer = BucketedLayer()
    layer.update(*_kv(5))
    address = layer._buffers[0].untyped_storage().data_ptr()
    assert address in _ZERO_TAILED
    del layer
    gc.collect()
    assert address not in _ZERO_TAILED  # a freed buffer's address may hold anything later


def test_a_model_computes_the_same_logits_on_bucketed_and_on_transformers_layers():
    model = make_batch_invariant(tiny_llama(hidden=64, layers=2, ffn=128, seed=0))
    bucketed = rollback_cache(model)
    plain = DynamicCache(config=model.config)
    assert {type(layer) for layer in bucketed.layers} == {BucketedLayer}
    assert {type(layer) for layer in plain.layers} == {DynamicLayer}
    outputs = {}
    with torch.inference_mode():
        for name, cache in (("bucketed", bucketed), ("plain", plain)):
            rows = [cached_forward(model, list(range(3, 70)), cache, last_only=False)]
            for step in range(8):
                rows.append(cached_forward(model, [5 + step, 9, 2][: 1 + step % 3], cache, last_only=False))
                crop_to(cache, cache.get_seq_length() - step % 2)
            outputs[name] = rows
    assert all(torch.equal(a, b) for a, b in zip(outputs["bucketed"], outputs["plain"], strict=True))
