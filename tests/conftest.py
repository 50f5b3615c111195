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
