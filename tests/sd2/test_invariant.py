"""sd2.invariant on tiny random models: a T-token cached forward equals T 1-token forwards, bit for bit."""

import pytest
import torch
from transformers import DynamicCache

from sd2.decoding import cached_forward
from sd2.invariant import (
    COLUMNS,
    ENTRY_ROWS_LIMIT,
    INVARIANT_ATTENTION,
    KEY_BUCKET,
    LAYOUTS,
    PACKED,
    PACKED_PAD,
    PAD,
    ROWS,
    RowInvariantLinear,
    _bucket_attention,
    _row_buckets,
    entry_rows,
    invariant_attention,
    is_batch_invariant,
    layout_for,
    make_batch_invariant,
    packed_available,
    packed_weight,
    resolve_packed_weights,
    rows_product,
    stock_kernels,
    uses_packed_weights,
)
from tests.tiny import tiny_llama

DTYPES = [torch.float32, torch.bfloat16]


def _invariant_model(dtype, heads=4, kv_heads=2):
    model = tiny_llama(hidden=64, layers=3, ffn=160, seed=0, heads=heads, kv_heads=kv_heads).to(dtype)
    return make_batch_invariant(model)


@torch.inference_mode()
def _many_vs_single(model, context: int, n_tokens: int) -> list[bool]:
    """Whether row i of one n-token forward equals the i-th of n 1-token forwards (same context)."""
    generator = torch.Generator().manual_seed(context * 31 + n_tokens)
    ids = torch.randint(3, model.config.vocab_size, (context + n_tokens,), generator=generator).tolist()
    many, single = DynamicCache(config=model.config), DynamicCache(config=model.config)
    cached_forward(model, ids[:context], many, last_only=True)
    cached_forward(model, ids[:context], single, last_only=True)
    block = cached_forward(model, ids[context:], many, last_only=False)  # [T, V]
    new = ids[context:]
    rows = [cached_forward(model, new[i : i + 1], single, last_only=True)[0] for i in range(n_tokens)]
    return [torch.equal(block[i], row) for i, row in enumerate(rows)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("context", [1, 7, KEY_BUCKET - 3, KEY_BUCKET, 2 * KEY_BUCKET + 1])
def test_a_verify_forward_equals_single_token_forwards_bitwise(dtype, context):
    model = _invariant_model(dtype)
    for n_tokens in (2, 3, 5, 9):  # k = 1, 2, 4, 8; across a key-bucket edge for some contexts
        assert all(_many_vs_single(model, context, n_tokens)), (context, n_tokens)


def test_multi_head_attention_without_grouping_is_invariant_too():
    model = _invariant_model(torch.float32, heads=4, kv_heads=4)  # one query row per KV head
    assert all(_many_vs_single(model, 20, 5))


def _random_attention(kv_heads, group, n_keys, rows, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, kv_heads * group, rows, 64, generator=generator).to(dtype)  # [1, H, T, D]
    key, value = (torch.randn(1, kv_heads, n_keys, 64, generator=generator).to(dtype) for _ in "kv")
    return query, key, value


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("kv_heads,group", [(3, 3), (2, 1), (1, 4), (2, 2), (4, 5)])
def test_each_attention_row_equals_its_one_row_call_bitwise(dtype, kv_heads, group):
    """SmolLM2's shape (3 KV heads of 3 queries, D = 64) and others, across a key-bucket edge."""
    for n_keys, rows in ((45, 5), (KEY_BUCKET + 3, 9), (2 * KEY_BUCKET, 2)):
        query, key, value = _random_attention(kv_heads, group, n_keys, rows, dtype)
        many, _ = invariant_attention(torch.nn.Module(), query, key, value, None)  # [1, T, H, D]
        for t in range(rows):
            visible = n_keys - rows + t + 1
            one, _ = invariant_attention(
                torch.nn.Module(), query[:, :, t : t + 1], key[:, :, :visible], value[:, :, :visible], None
            )
            assert torch.equal(many[0, t], one[0, 0]), (n_keys, rows, t)


@pytest.mark.parametrize("padded", ["probed", "one entry per call"])
def test_both_attention_paths_compute_causal_attention(padded):
    kv_heads, group, n_keys, rows = 3, 3, 70, 6
    query, key, value = _random_attention(kv_heads, group, n_keys, rows, torch.float32, seed=1)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=torch.ones(rows, n_keys).tril(n_keys - rows).bool(), enable_gqa=True
    )[0]  # [H, T, D]
    probed = entry_rows(kv_heads, group, 64, torch.float32, torch.device("cpu"))
    assert max(group, 2) <= abs(probed) <= max(ENTRY_ROWS_LIMIT, group)
    padded_rows = probed if padded == "probed" else -max(group, 2)
    for first, last, seen in _row_buckets(n_keys, rows, torch.device("cpu")):
        got = _bucket_attention(query[0, :, first:last], key[0], value[0], seen, 64**-0.5, padded_rows)
        torch.testing.assert_close(got, expected[:, first:last])


@pytest.mark.parametrize("shape", [(96, 160), (576, 1536)], ids=["small", "down_proj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_the_probe_picks_a_layout_whose_rows_do_not_depend_on_the_row_count(dtype, shape):
    """(576, 1536): the embedded verifier's down_proj, whose 1-row packed product differs in bf16."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(*shape, generator=generator).to(dtype)
    layout = layout_for(shape, dtype, torch.device("cpu"))
    assert layout in LAYOUTS
    rows = torch.randn(12, shape[1], generator=generator).to(dtype)
    single = torch.cat([rows_product(rows[i : i + 1], weight, None, layout) for i in range(12)])
    for m in range(2, 13):
        assert torch.equal(rows_product(rows[:m], weight, None, layout), single[:m])


@pytest.mark.parametrize("layout", [PAD, COLUMNS, ROWS])
def test_every_layout_computes_the_same_product(layout):
    generator = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(24, 40, generator=generator), torch.randn(24, generator=generator)
    rows = torch.randn(5, 40, generator=generator)
    expected = torch.nn.functional.linear(rows, weight, bias)
    for m in (1, 5):
        torch.testing.assert_close(rows_product(rows[:m], weight, bias, layout), expected[:m])


def test_batched_and_long_forwards_keep_the_stock_results():
    """Training batches and long prefills never need invariance: they stay on SDPA (allclose, since fp32
    linears change layout for up to MAX_ROWS rows)."""
    stock = tiny_llama(hidden=64, layers=2, ffn=160, seed=0)
    invariant = make_batch_invariant(tiny_llama(hidden=64, layers=2, ffn=160, seed=0))
    ids = torch.randint(3, 300, (3, 17), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding in one row
    with torch.inference_mode():
        expected = stock(input_ids=ids, attention_mask=mask).logits
        got = invariant(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_stock_kernels_switches_back_and_forth():
    model = _invariant_model(torch.float32)
    swapped = [m for m in model.modules() if type(m) is RowInvariantLinear]
    assert swapped and is_batch_invariant(model)
    with stock_kernels(model):
        assert not is_batch_invariant(model)
        assert all(type(m) is torch.nn.Linear for m in swapped)
    assert is_batch_invariant(model) and model.config._attn_implementation == INVARIANT_ATTENTION
    assert all(type(m) is RowInvariantLinear for m in swapped)


needs_packed = pytest.mark.skipif(
    not packed_available(torch.bfloat16, torch.device("cpu")), reason="oneDNN has no bf16 inner product here"
)


@pytest.mark.parametrize("layout", [PACKED, PACKED_PAD])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_packed_layouts_compute_the_linear_product(layout, dtype):
    if not packed_available(dtype, torch.device("cpu")):
        pytest.skip(f"oneDNN has no {dtype} inner product here")
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(48, 80, generator=generator).to(dtype)
    bias = torch.randn(48, generator=generator).to(dtype)
    rows = torch.randn(6, 80, generator=generator).to(dtype)
    expected = torch.nn.functional.linear(rows.float(), weight.float(), bias.float())
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for m in (1, 6):
        got = rows_product(rows[:m], weight, bias, layout)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), expected[:m], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("layout", [PACKED, PACKED_PAD])
def test_bf16_rows_on_fp32_packed_weights_multiply_in_fp32(layout):
    """A bf16 autocast (`sd2 train --precision bf16`) hands an fp32 engine's packed linears bf16 rows:
    oneDNN takes no such pair (and packs no bf16 weights on a CPU without native bf16), so the rows are
    multiplied in the weight's precision and the result handed back in theirs, row by row."""
    if not packed_available(torch.float32, torch.device("cpu")):
        pytest.skip("oneDNN has no fp32 inner product here")
    generator = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(48, 80, generator=generator), torch.randn(48, generator=generator)
    rows = torch.randn(6, 80, generator=generator).to(torch.bfloat16)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
    expected = rows_product(rows.float(), packed, bias, layout).to(torch.bfloat16)
    for m in (1, 6):
        got = rows_product(rows[:m], packed, bias, layout)
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, expected[:m])


def test_an_fp32_model_on_packed_weights_stays_row_invariant():
    """oneDNN packs fp32 weights on any CPU it runs on, and the probe takes a packed layout where its
    rows are invariant (`packed-pad` for every weight on the AVX-512 EPYC, where MKL's sgemm left only
    `rows`): a T-token forward then equals T 1-token ones, as on any other layout."""
    assert packed_available(torch.float32, torch.device("cpu")) == torch.backends.mkldnn.is_available()
    model = _invariant_model(torch.float32)
    if not uses_packed_weights(model):
        pytest.skip("the probe found no packed fp32 layout invariant on this CPU")
    assert all(_many_vs_single(model, 20, 9)) and all(_many_vs_single(model, 5, 40))


@needs_packed
def test_a_packed_weight_is_packed_again_when_the_weight_changes_and_deep_copies_work():
    """The packed copy lives beside the module: a weight written in place, or a deep copy of the model
    (whose weights are new tensors), gets its own packing, never a stale one."""
    import copy

    model = _invariant_model(torch.bfloat16)
    linear = next(m for m in model.modules() if type(m) is RowInvariantLinear and m.layout == PACKED)
    x = torch.randn(1, 3, linear.in_features).to(torch.bfloat16)
    with torch.inference_mode():
        before = linear(x)
    twin = copy.deepcopy(model)
    assert all(_many_vs_single(twin, 20, 5))
    first = packed_weight(linear)
    with torch.no_grad():
        linear.weight.mul_(2)
    assert packed_weight(linear) is not first
    with torch.inference_mode():
        torch.testing.assert_close(linear(x).float(), 2 * before.float(), rtol=2e-2, atol=2e-2)


def test_packed_weights_can_be_turned_off_by_argument_or_environment():
    assert resolve_packed_weights(None, {}) is True
    assert resolve_packed_weights(None, {"SD2_PACKED_WEIGHTS": "0"}) is False
    assert resolve_packed_weights(True, {"SD2_PACKED_WEIGHTS": "off"}) is True  # an argument wins
    with pytest.raises(ValueError, match="SD2_PACKED_WEIGHTS"):
        resolve_packed_weights(None, {"SD2_PACKED_WEIGHTS": "sometimes"})
    model = tiny_llama(hidden=64, layers=2, ffn=160, seed=0).to(torch.bfloat16)
    assert not uses_packed_weights(make_batch_invariant(model, packed=False))
    assert all(m.layout not in (PACKED, PACKED_PAD) for m in model.modules() if type(m) is RowInvariantLinear)
    packed = make_batch_invariant(tiny_llama(hidden=64, layers=2, ffn=160, seed=0).to(torch.bfloat16))
    assert uses_packed_weights(packed) == packed_available(torch.bfloat16, torch.device("cpu"))
