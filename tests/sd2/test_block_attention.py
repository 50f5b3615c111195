"""sd2.block_attention on random tensors: causal attention, each segment's and each token's result the same
bit for bit whatever else shares the call."""

import pytest
import torch
import torch.nn.functional as F

from sd2.block_attention import KEY_BUCKET, QUANTA, _layout, block_attention, query_quantum
from sd2.invariant import MAX_ROWS

DTYPES = [torch.float32, torch.bfloat16]
CPU = torch.device("cpu")


def _segments(kv_heads, group, shape, dtype, seed=0):
    """Random queries [H, M, D] and keys/values [H_kv, N_s, D] for segments of (new tokens, keys)."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(kv_heads * group, sum(t for t, _ in shape), 64, generator=generator).to(dtype)
    keys = [torch.randn(kv_heads, n, 64, generator=generator).to(dtype) for _, n in shape]
    values = [torch.randn(kv_heads, n, 64, generator=generator).to(dtype) for _, n in shape]
    return query, keys, values


def _quantum(kv_heads, group, dtype):
    quantum = query_quantum(kv_heads, group, 64, dtype, CPU, MAX_ROWS)
    assert quantum in QUANTA, "no row quantum is invariant on this CPU: the attention falls back to entries"
    return quantum


# (new tokens, keys) per segment: one in two key buckets, lengths at and across bucket edges
SHAPE = ((3, KEY_BUCKET + 2), (5, 40), (1, KEY_BUCKET), (9, 3 * KEY_BUCKET + 1), (2, 2))


@pytest.mark.parametrize("kv_heads,group", [(3, 3), (2, 1), (1, 4)])
def test_block_attention_is_causal_attention_of_each_segment(kv_heads, group):
    query, keys, values = _segments(kv_heads, group, SHAPE, torch.float32)
    got = block_attention(
        query, keys, values, [t for t, _ in SHAPE], 64**-0.5, _quantum(kv_heads, group, torch.float32)
    )
    first = 0
    for (tokens, n_keys), key, value in zip(SHAPE, keys, values, strict=True):
        causal = torch.ones(tokens, n_keys, dtype=torch.bool).tril(n_keys - tokens)
        expected = F.scaled_dot_product_attention(
            query[None, :, first : first + tokens], key[None], value[None], attn_mask=causal, enable_gqa=True
        )[0]
        torch.testing.assert_close(got[:, first : first + tokens], expected)
        first += tokens


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("kv_heads,group", [(3, 3), (2, 2), (4, 5)])
def test_segments_sharing_a_call_equal_their_own_calls_bitwise(dtype, kv_heads, group):
    quantum = _quantum(kv_heads, group, dtype)
    query, keys, values = _segments(kv_heads, group, SHAPE, dtype, seed=1)
    together = block_attention(query, keys, values, [t for t, _ in SHAPE], 64**-0.5, quantum)
    first = 0
    for (tokens, _), key, value in zip(SHAPE, keys, values, strict=True):
        alone = block_attention(query[:, first : first + tokens], [key], [value], [tokens], 64**-0.5, quantum)
        assert torch.equal(together[:, first : first + tokens], alone)
        first += tokens


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_each_token_of_a_segment_equals_its_one_token_call_bitwise(dtype):
    kv_heads, group, tokens, n_keys = 3, 3, 17, 2 * KEY_BUCKET + 5  # a k = 16 verify across a bucket edge
    quantum = _quantum(kv_heads, group, dtype)
    query, (key,), (value,) = _segments(kv_heads, group, ((tokens, n_keys),), dtype, seed=2)
    block = block_attention(query, [key], [value], [tokens], 64**-0.5, quantum)
    for t in range(tokens):
        seen = n_keys - tokens + t + 1
        one = block_attention(query[:, t : t + 1], [key[:, :seen]], [value[:, :seen]], [1], 64**-0.5, quantum)
        assert torch.equal(block[:, t : t + 1], one), t


def test_the_layout_groups_pieces_by_padded_key_length():
    """Segment 0's first token sees 128 keys, its others 129 and 130 (the next bucket); segments 1 and 2
    share the 64-key bucket, in one call of rows padded to the larger block (2 tokens × 3 heads → 8)."""
    calls = _layout(((3, 130), (2, 60), (1, 64)), 3, 4, CPU, torch.bfloat16)
    assert [(c.padded_keys, c.segments, c.mask.shape[2]) for c in calls] == [
        (64, (1, 2), 8),
        (128, (0,), 4),
        (192, (0,), 8),
    ]
    short = calls[0]
    # segment 1's rows are the grouped rows 9..14 (after segment 0's 3 tokens × 3 heads); the rest pad
    assert short.rows[0].tolist() == [9, 10, 11, 12, 13, 14, 18, 18]
    assert short.mask[0, 0, :6].sum(-1).tolist() == [59, 59, 59, 60, 60, 60]
    assert short.mask[0, 0, 6:].sum(-1).tolist() == [1, 1]  # padding rows see key 0 only
    for call in calls:  # the additive form SDPA is given: 0 where seen, −inf elsewhere
        assert call.bias.dtype == torch.bfloat16
        assert torch.equal(call.bias == 0, call.mask) and torch.isneginf(call.bias[~call.mask]).all()
