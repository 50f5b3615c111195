import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_pair_dir(tmp_path_factory):
    """Folders of a tiny random verifier and drafter sharing a small tokenizer."""
    from tests.tiny import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("tiny_pair"))


@pytest.fixture(autouse=True)
def _one_torch_thread_for_tiny_models(request):
    """Tiny models gain nothing from intra-op threads, and on a 2-core machine shared with other
    processes their spin-waiting makes each forward many times slower. Real-model tests (slow) keep
    them; statistical tests are slow too, but on tiny models, so they get one thread like the rest."""
    import torch

    before = torch.get_num_threads()
    if "slow" not in request.keywords or "statistical" in request.keywords:
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
