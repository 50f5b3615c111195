"""The decode matrix on each device: every temperature, k and length limit runs and stays exact.

On CUDA a k = 0 block (one token left before max_new_tokens) once mixed CPU and CUDA tensors; the
`gpu` tests run the same matrix there (skipped without a CUDA device, run by the device check).
"""

import pytest
import torch

from sd2.config import DecodeConfig
from sd2.decoding import SpeculativeDecoder, verifier_decode
from sd2.proposer import Proposer
from sd2.steering import new_head_for
from tests.tiny import tiny_llama

PROMPT = [1, 40, 17, 99, 3, 250]
NO_STOP = frozenset()
MATRIX = [(t, k, n) for t in (0.0, 1.0) for k in (1, 4, 8) for n in (2, 7, 33)]


def _pair(device: str):
    verifier = tiny_llama(hidden=64, layers=4, ffn=128, seed=0).to(device)
    drafter = tiny_llama(hidden=32, layers=2, ffn=64, seed=1).to(device)
    return verifier, drafter, new_head_for(verifier, drafter).to(device)


def _ids(blocks):
    return [t.token_id for b in blocks for t in b.emitted]


def _check_matrix(device: str) -> None:
    verifier, drafter, head = _pair(device)
    for temperature, k, max_new_tokens in MATRIX:
        config = DecodeConfig(k=k, temperature=temperature, max_new_tokens=max_new_tokens, seed=5)
        ids = _ids(SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP).run(PROMPT))
        assert len(ids) == max_new_tokens, (temperature, k, max_new_tokens)
        if temperature == 0:
            assert ids == _ids(verifier_decode(verifier, PROMPT, config, NO_STOP)), (k, max_new_tokens)


def test_the_decode_matrix_runs_on_the_cpu():
    _check_matrix("cpu")


@pytest.mark.gpu
def test_the_decode_matrix_runs_on_cuda():
    _check_matrix("cuda")


@pytest.mark.gpu
def test_a_k_zero_block_keeps_its_empty_rows_on_the_models_device():
    verifier, drafter, head = _pair("cuda")
    config = DecodeConfig(k=4, temperature=1.0, max_new_tokens=2, seed=0)
    decoder = SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP)
    blocks = list(decoder.run(PROMPT))
    assert blocks[-1].k == 0 and len(_ids(blocks)) == 2
    tokens, logits, probs = _without_calls(decoder._draft(0))
    assert logits.device.type == probs.device.type == "cuda" and tokens.numel() == 0


def _without_calls(program):
    """The value a decoding sub-program returns when it needs no model call (a k = 0 draft)."""
    try:
        call = next(program)
    except StopIteration as done:
        return done.value
    raise AssertionError(f"a k = 0 draft asked for {call!r}")


def test_a_k_zero_block_keeps_its_empty_rows_on_the_models_device_cpu():
    verifier, drafter, head = _pair("cpu")
    decoder = SpeculativeDecoder(verifier, Proposer(drafter, head), DecodeConfig(k=4), NO_STOP)
    tokens, logits, probs = _without_calls(decoder._draft(0))
    assert tokens.numel() == 0 and logits.shape == probs.shape == (0, verifier.config.vocab_size)
    assert logits.device == torch.device("cpu")
