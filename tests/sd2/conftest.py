"""The tiny decoding pair shared by the engine's math tests (test_decoding, test_draft_length)."""

import copy

import pytest
import torch

from sd2.steering import new_head_for
from tests.tiny import tiny_llama


@pytest.fixture(scope="module")
def verifier():
    """A random 4-layer Llama verifier."""
    return tiny_llama(hidden=64, layers=4, ffn=128, seed=0)


@pytest.fixture(scope="module")
def drafters(verifier):
    """{kind: (drafter, steering head or None)}: the verifier itself ("same", every draft accepted at
    T = 0), a random 2-layer drafter, and the same drafter with a random steering head."""
    random_drafter = tiny_llama(hidden=32, layers=2, ffn=64, seed=1)
    head = new_head_for(verifier, random_drafter)
    with torch.no_grad():
        head.w_s.normal_(0, 0.3)
    return {
        "same": (copy.deepcopy(verifier), None),
        "random": (random_drafter, None),
        "steered": (random_drafter, head),
    }
