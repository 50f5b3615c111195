"""The engine is lossless: greedy output identical to the verifier's, sampled output distributed as it."""

import itertools
from collections import Counter

import pytest
import torch

from sd2 import decoding
from sd2.config import DecodeConfig
from sd2.decoding import SpeculativeDecoder, verifier_decode
from sd2.draft_vocab import DraftVocab, reduced_head_for
from sd2.metrics import summarize
from sd2.proposer import Proposer
from sd2.sampling import Verdict
from sd2.steering import new_head_for
from sd2.trace import DraftStop, TokenStatus
from tests.tiny import peaky_llama, tiny_mistral

PROMPT = [1, 40, 17, 99, 3, 250]
NO_STOP = frozenset()


def _ids(blocks):
    return [t.token_id for b in blocks for t in b.emitted]


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("kind", ["same", "random", "steered"])
def test_greedy_output_is_identical_to_verifier_greedy(verifier, drafters, k, kind):
    config = DecodeConfig(k=k, temperature=0.0, max_new_tokens=40)
    expected = _ids(verifier_decode(verifier, PROMPT, config, NO_STOP))
    drafter, head = drafters[kind]
    blocks = list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP).run(PROMPT))
    assert _ids(blocks) == expected
    metrics = summarize(blocks, k)
    if kind == "same":
        assert all(b.n_accepted == k for b in blocks if b.complete and b.kind == "speculative")
        assert metrics.tau == k + 1
        assert metrics.acceptance_rate == 1.0
    else:
        assert metrics.acceptance_rate < 0.2  # an untrained random drafter is almost never right


def test_steering_changes_the_drafts_but_not_the_output(verifier, drafters):
    config = DecodeConfig(k=4, max_new_tokens=30)
    drafter, head = drafters["steered"]
    steered_blocks = list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP).run(PROMPT))
    plain_blocks = list(SpeculativeDecoder(verifier, Proposer(drafter), config, NO_STOP).run(PROMPT))
    assert _ids(steered_blocks) == _ids(plain_blocks)
    draft_probs = lambda blocks: [t.draft_prob for b in blocks for t in b.drafts]  # noqa: E731
    assert draft_probs(steered_blocks) != pytest.approx(draft_probs(plain_blocks))
    assert all(b.steering_norm and b.steering_norm > 0 for b in steered_blocks[1:])
    assert all(len(b.layer_bias_norms) == 2 for b in steered_blocks[1:])


def test_stop_token_ends_generation_like_the_verifier(verifier, drafters):
    reference = _ids(verifier_decode(verifier, PROMPT, DecodeConfig(max_new_tokens=40), NO_STOP))
    stop = frozenset({reference[12]})
    cut = reference[: reference.index(reference[12]) + 1]
    for kind in ("same", "random", "steered"):
        drafter, head = drafters[kind]
        config = DecodeConfig(k=5, max_new_tokens=40)
        blocks = list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, stop).run(PROMPT))
        assert _ids(blocks) == cut == _ids(verifier_decode(verifier, PROMPT, config, stop))
        assert not blocks[-1].complete or len(blocks[-1].emitted) == blocks[-1].n_accepted + 1


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 9, 10])
def test_length_limit_is_exact(verifier, drafters, max_new_tokens):
    drafter, head = drafters["same"]
    config = DecodeConfig(k=4, max_new_tokens=max_new_tokens)
    blocks = list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP).run(PROMPT))
    assert len(_ids(blocks)) == max_new_tokens


def test_trace_statuses_and_metric_identities(verifier, drafters):
    drafter, head = drafters["steered"]
    k = 4
    config = DecodeConfig(k=k, temperature=1.0, max_new_tokens=60, seed=11)
    blocks = list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP).run(PROMPT))
    metrics = summarize(blocks, k)
    speculative = [b for b in blocks if b.kind == "speculative"]
    complete = [b for b in speculative if b.complete]
    assert sum(metrics.histogram) == len(complete)
    assert sum(j * h for j, h in enumerate(metrics.histogram)) == metrics.accepted
    assert metrics.n_tokens == len(_ids(blocks)) == sum(b.n_accepted + 1 for b in blocks) == 60
    for block in speculative:
        statuses = [t.status for t in block.drafts]
        n = block.n_accepted
        assert statuses[:n] == [TokenStatus.ACCEPTED] * n
        assert (
            statuses[n:]
            == ([TokenStatus.REJECTED] + [TokenStatus.DISCARDED] * (block.k - n - 1))[: block.k - n]
        )
        assert block.extra.status == (TokenStatus.BONUS if n == block.k else TokenStatus.RESAMPLED)
        assert len(block.overlaps) == min(n + 1, block.k)
    assert metrics.tau == pytest.approx(sum(b.n_accepted + 1 for b in complete) / len(complete))


# --- T = 1: the emitted tokens follow the verifier's law -------------------------------------------

SMALL_V = 8


@pytest.fixture(scope="module")
def small_pair():
    verifier = peaky_llama(SMALL_V, 0, hidden=16, layers=2)
    drafter = peaky_llama(SMALL_V, 1, hidden=16, layers=1)
    head = new_head_for(verifier, drafter)
    with torch.no_grad():
        head.w_s.normal_(0, 2.0)
    return verifier, drafter, head


SMALL_PROMPT = [3, 1, 4]


@torch.inference_mode()
def _exact_law(verifier) -> torch.Tensor:
    """Exact verifier law of emitted tokens 2 and 3, P(x2, x3) = Σ_x1 p(x1) p(x2|x1) p(x3|x1 x2). [V, V]."""
    pairs = torch.tensor(list(itertools.product(range(SMALL_V), repeat=2)))  # [V², 2]
    sequences = torch.cat([torch.tensor(SMALL_PROMPT).expand(len(pairs), -1), pairs], dim=1)
    probs = torch.softmax(verifier(sequences).logits.float(), dim=-1)  # [V², T, V]
    p1 = probs[:, len(SMALL_PROMPT) - 1]  # law of x1, same for every row
    joint = torch.zeros(SMALL_V, SMALL_V, SMALL_V)
    for row, (x1, x2) in enumerate(pairs.tolist()):
        joint[x1, x2] = p1[row, x1] * probs[row, len(SMALL_PROMPT), x2] * probs[row, len(SMALL_PROMPT) + 1]
    return joint.sum(0)  # marginal over x1 → [x2, x3]


def _empirical_law(verifier, drafter, head, n: int, stops: Counter | None = None, **settings) -> torch.Tensor:
    """The law of emitted tokens 2 and 3 over n seeds; `stops` counts the blocks' draft_stop reasons."""
    counts = torch.zeros(SMALL_V, SMALL_V)
    for seed in range(n):
        config = DecodeConfig(**{"k": 2, "max_new_tokens": 3, **settings}, temperature=1.0, seed=seed)
        blocks = list(
            SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP).run(SMALL_PROMPT)
        )
        ids = _ids(blocks)
        counts[ids[1], ids[2]] += 1
        if stops is not None:
            stops.update(b.draft_stop for b in blocks if b.kind == "speculative")
    return counts / n


def _tv(a, b) -> float:
    return 0.5 * float((a - b).abs().sum())


def _bound(exact: torch.Tensor, n: int) -> float:
    """3× the expected TV distance of n exact samples: E|X/n − p| ≈ sqrt(2 p (1 − p) / (π n)) per cell."""
    return 3 * 0.5 * float(torch.sqrt(2 * exact * (1 - exact) / (torch.pi * n)).sum())


@pytest.mark.slow
@pytest.mark.statistical
def test_sampled_output_follows_the_verifier_law_with_and_without_steering(small_pair):
    verifier, drafter, head = small_pair
    exact = _exact_law(verifier)
    plain = _empirical_law(verifier, drafter, None, 5_000)
    steered_law = _empirical_law(verifier, drafter, head, 10_000)
    assert _tv(plain, exact) < _bound(exact, 5_000)
    assert _tv(steered_law, exact) < _bound(exact, 10_000)
    coarse = _empirical_law(verifier, drafter, head, 500)
    assert _tv(steered_law, exact) < _tv(coarse, exact)  # the distance shrinks with samples


@pytest.mark.slow
@pytest.mark.statistical
def test_a_confidence_stop_keeps_the_verifier_law(small_pair):
    """Stopping a draft on the drafter's own probability changes how much is drafted, not the law."""
    verifier, drafter, head = small_pair
    exact, n, stops = _exact_law(verifier), 5_000, Counter()
    # 4 tokens leave the first block room for 2 drafts, so tokens 2 and 3 may follow a stop after one
    law = _empirical_law(verifier, drafter, head, n, stops, k=3, max_new_tokens=4, draft_threshold=0.5)
    assert stops[DraftStop.CONFIDENCE] > 0.2 * n and stops[DraftStop.K] + stops[DraftStop.LENGTH] > 0.2 * n
    assert _tv(law, exact) < _bound(exact, n)


def test_steering_changes_acceptance_not_the_law(small_pair):
    verifier, drafter, head = small_pair
    config = DecodeConfig(k=4, temperature=1.0, max_new_tokens=200, seed=0)
    plain = summarize(
        list(SpeculativeDecoder(verifier, Proposer(drafter), config, NO_STOP).run(SMALL_PROMPT)), 4
    )
    steer = summarize(
        list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP).run(SMALL_PROMPT)), 4
    )
    assert plain.alpha_hat != pytest.approx(steer.alpha_hat, abs=1e-3)


@pytest.mark.slow
@pytest.mark.statistical
def test_negative_control_always_accept_is_detected(small_pair, monkeypatch):
    verifier, drafter, _ = small_pair

    def always_accept(draft_tokens, draft_probs, target_probs, generator):
        return Verdict(
            draft_tokens.shape[0], int(torch.multinomial(target_probs[-1], 1, generator=generator))
        )

    monkeypatch.setattr(decoding, "rejection_sample", always_accept)
    n, exact = 2_000, _exact_law(verifier)
    law = _empirical_law(verifier, drafter, None, n)
    assert _tv(law, exact) > _bound(exact, n)


# --- a reduced draft vocabulary: q = 0 outside it, the law unchanged ------------------------------

KEPT = (5, 1, 6)  # the small drafter may propose only these; the verifier can emit all SMALL_V


def _small_reduced_head(drafter):
    return reduced_head_for(drafter, DraftVocab(KEPT))


def _empirical_law_reduced(verifier, drafter, head, draft_head, n: int) -> torch.Tensor:
    counts = torch.zeros(SMALL_V, SMALL_V)
    for seed in range(n):
        config = DecodeConfig(k=2, temperature=1.0, max_new_tokens=3, seed=seed)
        decoder = SpeculativeDecoder(verifier, Proposer(drafter, head, draft_head), config, NO_STOP)
        ids = _ids(decoder.run(SMALL_PROMPT))
        counts[ids[1], ids[2]] += 1
    return counts / n


@pytest.mark.slow
@pytest.mark.statistical
def test_a_reduced_draft_vocabulary_keeps_the_verifier_law(small_pair):
    verifier, drafter, head = small_pair
    exact, n = _exact_law(verifier), 10_000
    assert exact[:, [t for t in range(SMALL_V) if t not in KEPT]].sum() > 0.2  # pruned tokens matter
    law = _empirical_law_reduced(verifier, drafter, head, _small_reduced_head(drafter), n)
    assert _tv(law, exact) < _bound(exact, n)


def test_a_reduced_vocabulary_drafts_only_kept_tokens_with_q_zero_elsewhere(small_pair):
    verifier, drafter, head = small_pair
    config = DecodeConfig(k=3, temperature=1.0, max_new_tokens=60, seed=4)
    decoder = SpeculativeDecoder(
        verifier, Proposer(drafter, head, _small_reduced_head(drafter)), config, NO_STOP
    )
    blocks = list(decoder.run(SMALL_PROMPT))
    drafts = [t for b in blocks for t in b.drafts]
    assert drafts and {t.token_id for t in drafts} <= set(KEPT)
    emitted = {t.token_id for b in blocks for t in b.emitted}
    assert emitted - set(KEPT)  # the residual and the bonus still reach pruned tokens


@pytest.mark.slow
@pytest.mark.statistical
def test_negative_control_a_verifier_cut_to_the_draft_vocabulary_is_detected(small_pair, monkeypatch):
    """Restricting the verifier's distribution to the kept tokens (a tempting shortcut) changes the law."""
    verifier, drafter, head = small_pair
    real = decoding.rejection_sample

    def truncated(draft_tokens, draft_probs, target_probs, generator):
        kept = torch.zeros(target_probs.shape[-1], dtype=torch.bool)
        kept[list(KEPT)] = True
        cut = target_probs * kept
        return real(draft_tokens, draft_probs, cut / cut.sum(-1, keepdim=True), generator)

    monkeypatch.setattr(decoding, "rejection_sample", truncated)
    exact, n = _exact_law(verifier), 2_000
    law = _empirical_law_reduced(verifier, drafter, head, _small_reduced_head(drafter), n)
    assert _tv(law, exact) > _bound(exact, n)


def test_greedy_output_is_identical_with_a_reduced_draft_vocabulary(verifier, drafters):
    expected = _ids(verifier_decode(verifier, PROMPT, DecodeConfig(max_new_tokens=40), NO_STOP))
    for kind in ("same", "steered"):
        drafter, head = drafters[kind]
        common = Counter(expected).most_common(6)  # a vocabulary that covers some of the output
        draft_head = reduced_head_for(drafter, DraftVocab(tuple(t for t, _ in common)))
        config = DecodeConfig(k=4, max_new_tokens=40)
        decoder = SpeculativeDecoder(verifier, Proposer(drafter, head, draft_head), config, NO_STOP)
        assert _ids(decoder.run(PROMPT)) == expected


@pytest.mark.parametrize("k", [1, 4, 8])
def test_a_sliding_window_pair_rolls_back_past_its_window_and_stays_exact(k):
    """Mistral-style sliding-window caches refuse to crop once their window is full, unless they record
    the past (sd2.kv_cache); the output must still be the verifier's own, and HF's."""
    verifier, drafter = tiny_mistral(64, 2, seed=0), tiny_mistral(32, 1, seed=1)
    window = verifier.config.sliding_window
    prompt = [1, 40, 17, 99, 3, 250, 7, 8, 9, 10, 11, 12]  # longer than the window from the start
    config = DecodeConfig(k=k, temperature=0.0, max_new_tokens=40)
    expected = _ids(verifier_decode(verifier, prompt, config, NO_STOP))
    hf = verifier.generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=40, pad_token_id=2, eos_token_id=None
    )[0, len(prompt) :].tolist()
    assert expected == hf
    for drafter_model in (drafter, verifier):  # rejections at every length; all-accepted blocks
        decoder = SpeculativeDecoder(verifier, Proposer(drafter_model), config, NO_STOP)
        assert _ids(decoder.run(prompt)) == expected
        for layer in decoder.verifier_cache.layers:  # trimmed back to the window after every block
            assert layer.keys.shape[-2] <= window - 1
    sampled = DecodeConfig(k=k, temperature=1.0, max_new_tokens=40, seed=3)
    assert len(_ids(SpeculativeDecoder(verifier, Proposer(drafter), sampled, NO_STOP).run(prompt))) == 40
