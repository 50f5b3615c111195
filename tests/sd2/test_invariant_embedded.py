"""Exactness on the real embedded verifier (docs/lossless.md): a (k+1)-token cached forward gives the
logits of k+1 single-token forwards bit for bit, and every drafter method emits the verifier's own greedy
output, in bf16 and in fp32."""

import copy

import pytest
import torch
from transformers import DynamicCache

from sd2.bench.prompts import load_prompt_sets
from sd2.config import DecodeConfig
from sd2.decoding import cached_forward
from sd2.devices import DTYPES
from sd2.engine import Engine
from sd2.invariant import stock_kernels

pytestmark = pytest.mark.slow
MAX_K = 8


@pytest.fixture(scope="module", params=["bf16", "fp32"])
def engine(request):
    return Engine.load(dtype=request.param)  # the embedded pair with its shipped drafters


@pytest.fixture(scope="module")
def prompts():
    sets = load_prompt_sets(names=["chat", "code", "summarize"], max_prompts=2)
    return [p for s in sets for p in s.prompts]


@torch.inference_mode()
def _verify_rows_equal_single_steps(verifier, prompt_ids: list[int], new_ids: list[int]) -> dict[int, bool]:
    """{k: whether every row of the (k+1)-token forward equals the single-token forward there}."""
    prefilled = DynamicCache(config=verifier.config)
    cached_forward(verifier, prompt_ids, prefilled, last_only=True)  # one prefill, copied for each forward
    single_cache = copy.deepcopy(prefilled)
    singles = [cached_forward(verifier, [t], single_cache, last_only=True)[0] for t in new_ids]  # [V] each
    equal = {}
    for k in range(1, MAX_K + 1):
        cache = copy.deepcopy(prefilled)
        block = cached_forward(verifier, new_ids[: k + 1], cache, last_only=False)  # [k+1, V]
        equal[k] = all(torch.equal(block[i], singles[i]) for i in range(k + 1))
    return equal


def _greedy_continuation(engine: Engine, prompt) -> tuple[list[int], list[int]]:
    decode = DecodeConfig(max_new_tokens=MAX_K + 1)
    request = prompt.request("verifier", decode)
    return engine.encode(request), engine.generate(request).token_ids


def test_a_verify_forward_equals_single_token_steps_bitwise(engine, prompts):
    assert engine.batch_invariant and engine.placement.dtype in DTYPES.values()
    for prompt in prompts:
        prompt_ids, continuation = _greedy_continuation(engine, prompt)
        assert len(continuation) == MAX_K + 1  # no stop inside the first 9 tokens of these prompts
        equal = _verify_rows_equal_single_steps(engine.verifier, prompt_ids, continuation)
        assert all(equal.values()), (prompt.id, equal)


def test_the_stock_bf16_kernels_are_not_invariant_which_is_why_sd2_has_its_own(engine, prompts):
    """Negative control: the same comparison fails on transformers' kernels (measured on AMD Zen 5 and
    Intel Xeon CPUs with AVX-512 BF16), so the test above can fail and the invariant path is needed."""
    if engine.placement.precision != "bf16":
        pytest.skip("documented for bf16; fp32's MKL differences are smaller but exist as well")
    found = False
    with stock_kernels(engine.verifier):
        for prompt in prompts:
            prompt_ids, continuation = _greedy_continuation(engine, prompt)
            found = found or not all(
                _verify_rows_equal_single_steps(engine.verifier, prompt_ids, continuation).values()
            )
    assert found


@pytest.fixture(scope="module")
def verifier_greedy():
    """{(precision, prompt id, max new tokens): the verifier-only greedy output}, computed once and
    shared by the decode settings below (the verifier loop does not draft: k and the threshold do not
    reach it)."""
    return {}


@pytest.mark.parametrize(
    "decode",
    [DecodeConfig(k=4, max_new_tokens=40), DecodeConfig(k="auto", draft_threshold=0.3, max_new_tokens=40)],
    ids=["k=4", "auto+threshold"],
)
def test_every_drafter_method_emits_the_verifier_greedy_output(engine, prompts, decode, verifier_greedy):
    # the verify forwards of k = 1..8 are pinned bitwise above; the shipped drafters draft over their
    # reduced vocabularies (draft_vocab.json)
    if decode.draft_threshold > 0 and engine.placement.precision == "fp32":
        # k = auto and the threshold only choose how many of those verify widths a block uses; fp32's
        # forwards are 2-3x slower on a CPU, and CI's time budget keeps this cell to bf16
        pytest.skip("k = auto with a threshold runs in bf16; fp32's verify widths are pinned above")
    methods = [m for m in engine.methods() if m != "verifier"]
    assert {"self", "pretrained", "distilled", "sd2", "sd2-frozen"} <= set(methods)
    assert all(engine.drafters[m].draft_head is not None for m in methods if m != "self")
    for prompt in prompts[::2]:  # one prompt per set
        key = (engine.precision, prompt.id, decode.max_new_tokens)
        if key not in verifier_greedy:
            verifier_greedy[key] = engine.generate(prompt.request("verifier", decode)).token_ids
        reference = verifier_greedy[key]
        for method in methods:
            result = engine.generate(prompt.request(method, decode))
            assert result.token_ids == reference, (engine.precision, prompt.id, method, decode.k)
            assert result.precision == engine.precision
