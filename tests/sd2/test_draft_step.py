"""The drafter's step (sd2.draft_step): a static cache with a compiled one-token step drafts what the eager
step drafts, rolls back across blocks and requests, traces once, and keeps decoding exact."""

import os

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from sd2.config import DecodeConfig
from sd2.decoding import SpeculativeDecoder, verifier_decode
from sd2.draft_step import (
    CAPACITY_QUANTUM,
    COMPILE_CACHE_ENV,
    CompiledDraftStep,
    EagerDraftStep,
    reduce_overhead,
    resolve_draft_step,
)
from sd2.draft_vocab import DraftVocab, reduced_head_for
from sd2.engine import Engine
from sd2.proposer import Proposer
from tests.sd2.test_decoding import (
    SMALL_PROMPT,
    _bound,
    _exact_law,
    _tv,
    small_pair,  # noqa: F401  (a fixture)
)
from tests.tiny import tiny_mistral

PROMPT = [1, 40, 17, 99, 3, 250]
OTHER_PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 2]
NO_STOP = frozenset()


def _ids(blocks):
    return [t.token_id for b in blocks for t in b.emitted]


def uncompiled(step):
    """The static cache and steering buffers alone: the one-token step runs as written."""
    return step


def traced(step):
    """torch.compile's tracing without code generation: a graph break or a retrace shows here as it
    would under mode="reduce-overhead" on CUDA (fullgraph=True turns a break into an error)."""
    return torch.compile(step, backend="eager", fullgraph=True, dynamic=False)


def _run(verifier, drafter, head, config, prompt, step=None, draft_head=None):
    decoder = SpeculativeDecoder(verifier, Proposer(drafter, head, draft_head, step), config, NO_STOP)
    return list(decoder.run(prompt))


def _drafts(blocks):
    return [[t.token_id for t in b.drafts] for b in blocks], [t.draft_prob for b in blocks for t in b.drafts]


@pytest.mark.parametrize("kind", ["same", "random", "steered"])
@pytest.mark.parametrize("reduced", [False, True])
def test_a_static_step_drafts_what_the_eager_step_drafts(verifier, drafters, kind, reduced):
    drafter, head = drafters[kind]
    config = DecodeConfig(k=4, max_new_tokens=40)
    expected = _ids(verifier_decode(verifier, PROMPT, config, NO_STOP))
    kept = tuple(sorted(set(expected[::2]) | set(range(0, 320, 5))))  # some of the output, not all
    draft_head = reduced_head_for(drafter, DraftVocab(kept)) if reduced else None
    eager = _run(verifier, drafter, head, config, PROMPT, draft_head=draft_head)
    step = CompiledDraftStep(drafter, draft_head, compiler=uncompiled)
    try:
        static = _run(verifier, drafter, head, config, PROMPT, step, draft_head)
    finally:
        step.close()
    assert _ids(static) == _ids(eager) == expected
    tokens_static, probs_static = _drafts(static)
    tokens_eager, probs_eager = _drafts(eager)
    assert tokens_static == tokens_eager
    assert probs_static == pytest.approx(probs_eager, rel=1e-4, abs=1e-6)
    if kind == "same" and not reduced:  # every draft accepted: blocks start with two pending tokens
        assert all(b.n_accepted == 4 for b in static if b.kind == "speculative" and b.complete)


def test_the_steering_buffers_steer_only_while_drafting(verifier, drafters):
    drafter, head = drafters["steered"]
    config = DecodeConfig(k=3, max_new_tokens=20)
    step = CompiledDraftStep(drafter, None, compiler=uncompiled)
    try:
        steered_probs = _drafts(_run(verifier, drafter, head, config, PROMPT, step))[1]
        plain_probs = _drafts(_run(verifier, drafter, None, config, PROMPT, step))[1]
        assert steered_probs != pytest.approx(plain_probs)
        assert plain_probs == pytest.approx(
            _drafts(_run(verifier, drafter, None, config, PROMPT))[1], rel=1e-4
        )
        ids = torch.tensor([PROMPT])
        with torch.inference_mode():
            before = drafter(input_ids=ids).logits
            step.start(PROMPT, room=8)  # hooks stay registered, but off outside `steering`
            assert torch.equal(drafter(input_ids=ids).logits, before)
    finally:
        step.close()
    assert all(not mlp._forward_hooks for mlp in (layer.mlp.up_proj for layer in drafter.model.layers))


def test_a_copy_of_the_drafter_is_never_steered_by_its_step(verifier, drafters):
    import copy

    drafter, _ = drafters["steered"]
    step = CompiledDraftStep(drafter, None, compiler=uncompiled)
    try:
        twin = copy.deepcopy(drafter)  # e.g. a training job's copy of a loaded drafter
        ids = torch.tensor([PROMPT[:2]])  # a draft forward: 1 or 2 tokens
        with torch.inference_mode():
            plain = twin(input_ids=ids).logits
            biases = {layer: torch.ones(2, drafter.config.intermediate_size) for layer in range(2)}
            with step.steering(biases):
                assert torch.equal(twin(input_ids=ids).logits, plain)
                assert not torch.equal(drafter(input_ids=ids).logits, plain)  # the step's own drafter is
    finally:
        step.close()


def test_one_compiled_step_serves_many_requests_and_grows_in_quanta(verifier, drafters):
    drafter, head = drafters["steered"]
    step = CompiledDraftStep(drafter, None, compiler=uncompiled)
    try:
        for prompt, k, max_new_tokens in [(PROMPT, 4, 30), (OTHER_PROMPT, 1, 12), (PROMPT, 8, 33)]:
            config = DecodeConfig(k=k, max_new_tokens=max_new_tokens)
            expected = _ids(verifier_decode(verifier, prompt, config, NO_STOP))
            assert _ids(_run(verifier, drafter, head, config, prompt, step)) == expected
        assert step.capacity == CAPACITY_QUANTUM
        cache = step.cache
        long_prompt = [1 + i % 300 for i in range(CAPACITY_QUANTUM)]  # grows the cache to the next quantum
        step.start(long_prompt, room=10)
        assert step.capacity == 2 * CAPACITY_QUANTUM and step.cache is not cache
        assert step.length == len(long_prompt)
    finally:
        step.close()


@pytest.mark.parametrize("reduced", [False, True])
def test_the_compiled_step_traces_once_and_keeps_greedy_identity(verifier, drafters, reduced):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the graph counts of earlier tests
    drafter, head = drafters["steered"]
    # a reduced draft head probes its invariant layout on first use: never inside the compiled step
    draft_head = reduced_head_for(drafter, DraftVocab(tuple(range(0, 320, 2)))) if reduced else None
    step = CompiledDraftStep(drafter, draft_head, compiler=traced)
    try:
        config = DecodeConfig(k=4, max_new_tokens=24)
        first = _run(verifier, drafter, head, config, PROMPT, step, draft_head)
        assert _ids(first) == _ids(verifier_decode(verifier, PROMPT, config, NO_STOP))
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert graphs == 1
        for prompt, k in [(OTHER_PROMPT, 2), (PROMPT, 8)]:  # new lengths, rollbacks, new biases
            config = DecodeConfig(k=k, max_new_tokens=24)
            assert _ids(_run(verifier, drafter, head, config, prompt, step, draft_head)) == _ids(
                verifier_decode(verifier, prompt, config, NO_STOP)
            )
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs  # no retrace
    finally:
        step.close()
        torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.statistical
def test_sampling_with_a_static_step_keeps_the_verifier_law(small_pair):  # noqa: F811
    verifier, drafter, head = small_pair
    exact, n = _exact_law(verifier), 3_000
    counts = torch.zeros_like(exact)
    step = CompiledDraftStep(drafter, None, compiler=uncompiled)
    try:
        for seed in range(n):
            config = DecodeConfig(k=2, max_new_tokens=3, temperature=1.0, seed=seed)
            ids = _ids(_run(verifier, drafter, head, config, SMALL_PROMPT, step))
            counts[ids[1], ids[2]] += 1
    finally:
        step.close()
    assert _tv(counts / n, exact) < _bound(exact, n)


def test_the_eager_step_is_the_default_and_measures_the_same_costs(verifier, drafters):
    drafter, head = drafters["random"]
    decoder = SpeculativeDecoder(verifier, Proposer(drafter, head), DecodeConfig(k=2), NO_STOP)
    assert isinstance(decoder.draft_step, EagerDraftStep)


def test_a_sliding_window_drafter_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--draft-step eager"):
        CompiledDraftStep(tiny_mistral(sliding_window=8), None, compiler=uncompiled)


def test_draft_step_choice(monkeypatch):
    monkeypatch.delenv("SD2_DRAFT_STEP", raising=False)
    assert resolve_draft_step(None, torch.device("cpu")) == "direct"
    assert resolve_draft_step(None, torch.device("cuda")) == "compiled"
    assert resolve_draft_step("eager", torch.device("cpu")) == "eager"
    assert resolve_draft_step("compiled", torch.device("cpu")) == "compiled"
    monkeypatch.setenv("SD2_DRAFT_STEP", "eager")
    assert resolve_draft_step(None, torch.device("cuda")) == "eager"
    with pytest.raises(ValueError, match="--draft-step must be one of auto, eager, direct, compiled"):
        resolve_draft_step("cudagraph", torch.device("cpu"))


def test_the_compiled_step_keeps_its_compile_cache_under_sd2_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SD2_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    reduce_overhead(lambda x: x + 1)  # torch.compile is lazy: this only wraps (no C++ compiler needed)
    assert os.environ[COMPILE_CACHE_ENV] == str(tmp_path / "home" / "compile-cache")
    monkeypatch.setenv(COMPILE_CACHE_ENV, default_cache_dir())  # what importing inductor writes there
    reduce_overhead(lambda x: x * 2)
    assert os.environ[COMPILE_CACHE_ENV] == str(tmp_path / "home" / "compile-cache")
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "mine"))  # a place the user chose stays
    reduce_overhead(lambda x: x - 1)
    assert os.environ[COMPILE_CACHE_ENV] == str(tmp_path / "mine")


def test_an_engine_keeps_one_compiled_step_per_drafter(tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = Engine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu", draft_step="compiled")
    assert engine.draft_step_kind == "compiled"
    from sd2.engine import GenerateRequest

    def text(method, prompt):
        request = GenerateRequest(prompt=prompt, method=method, decode=DecodeConfig(k=3, max_new_tokens=16))
        return engine.generate(request).token_ids

    for prompt in ("hello there", "a longer prompt than the first one"):
        assert text("tiny", prompt) == text("verifier", prompt) == text("self", prompt)
    step = engine._compiled_steps["tiny"]
    assert list(engine._compiled_steps) == ["tiny"]  # "self" runs eagerly on the verifier
    text("tiny", "again")
    assert engine._compiled_steps["tiny"] is step
    engine.load_drafter("tiny", drafter_dir)  # a replaced drafter drops its step and its costs
    assert "tiny" not in engine._compiled_steps


@pytest.mark.gpu
def test_the_compiled_step_on_cuda_drafts_what_the_eager_step_drafts():
    """CUDA graphs through mode="reduce-overhead" on tiny fp32 models: same drafts (to fp32 noise), same
    output, and the verifier-only greedy output."""
    from sd2.steering import new_head_for
    from tests.tiny import tiny_llama

    verifier = tiny_llama(hidden=64, layers=4, ffn=128, seed=0).cuda()
    drafter = tiny_llama(hidden=32, layers=2, ffn=64, seed=1).cuda()
    head = new_head_for(verifier, drafter).cuda()
    with torch.no_grad():
        head.w_s.normal_(0, 0.3)
    step = CompiledDraftStep(drafter, None)
    try:
        for prompt in (PROMPT, OTHER_PROMPT):
            config = DecodeConfig(k=4, max_new_tokens=33)
            compiled = _run(verifier, drafter, head, config, prompt, step)
            eager = _run(verifier, drafter, head, config, prompt)
            assert _ids(compiled) == _ids(eager) == _ids(verifier_decode(verifier, prompt, config, NO_STOP))
            assert _drafts(compiled)[1] == pytest.approx(_drafts(eager)[1], rel=1e-3, abs=1e-5)
            sampled = DecodeConfig(k=4, max_new_tokens=33, temperature=1.0, seed=2)
            assert len(_ids(_run(verifier, drafter, head, sampled, prompt, step))) == 33
    finally:
        step.close()
