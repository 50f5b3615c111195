"""Refused values carry the field they are about, whatever the message says."""

import pytest

from sd2.config import DecodeConfig
from sd2.errors import InvalidValue
from sd2.prompts import validate_messages


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 0}, "k"),
        ({"temperature": 1e-9}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"draft_threshold": 2.0}, "draft_threshold"),
    ],
)
def test_decode_config_names_the_field(kwargs, field):
    with pytest.raises(InvalidValue) as caught:
        DecodeConfig(**kwargs)
    assert caught.value.field == field and isinstance(caught.value, ValueError)


def test_messages_errors_name_messages():
    for bad in ([], [{"role": "robot", "content": "x"}], [{"role": "user", "content": ""}]):
        with pytest.raises(InvalidValue) as caught:
            validate_messages(bad)
        assert caught.value.field == "messages"
