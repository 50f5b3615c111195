import pytest

from tests.sd2.train.tiny_runs import tiny_train_data


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_train_data(tmp_path_factory.mktemp("shards") / "tiny")
