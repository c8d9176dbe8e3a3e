"""Choosing training conversations by topic (`hf_specdec.training.topics`) and the `data` command's filters."""

from __future__ import annotations

import pytest

from hf_specdec.training.topics import select_conversations, topic_of


def _record(opening: str, ident: str = "x", replies: int = 1) -> dict:
    turns = [{"from": "human", "value": opening}]
    for i in range(replies):
        turns += [{"from": "gpt", "value": f"reply {i}"}, {"from": "human", "value": "more"}]
    return {"id": ident, "conversations": turns}


@pytest.mark.parametrize(
    ("text", "topic"),
    [
        ("Write a Python function that reverses a list.", "code"),
        ("Explain this SQL query to me", "code"),
        ("Here is my snippet:\n```\nx = 1\n```", "code"),
        ("A shop sells 12 apples at 3 dollars each. How much does it earn?", "maths"),
        ("What is 17 * 23?", "maths"),
        ("Write a program to calculate the average of a list", "maths"),  # a calculation wins over code
        ("Tell me a story about a dragon.", None),
        ("Classical music or jazz?", None),  # "class" as a word only, not inside another
    ],
)
def test_topic_of(text: str, topic: str | None) -> None:
    assert topic_of(text) == topic


def test_select_conversations_filters_in_order_and_cuts_to_the_first_exchange() -> None:
    records = [
        _record("Tell me a joke.", "chat"),
        _record("Write a Python class for a stack.", "code-1"),
        _record("x" * 50 + " python", "code-too-long"),
        _record("How many legs do 3 spiders have?", "maths-1"),
        _record("Écris du code python — ça dépend", "code-french"),
        {"id": "no-reply", "conversations": [{"from": "human", "value": "Write python"}]},
        {"id": "gpt-first", "conversations": [{"from": "gpt", "value": "python"}, {"from": "human", "value": "a"}]},
        _record("py code", "code-short"),
        _record("Write a bash script that counts files.", "code-2"),
    ]
    chosen = list(select_conversations(records, n=10, max_prompt_chars=40, topics=["code"], min_ascii=0.97))
    assert [r["id"] for r in chosen] == ["code-1", "code-short", "code-2"]
    assert all(len(r["conversations"]) == 2 for r in chosen)
    longer = select_conversations(records, n=10, max_prompt_chars=40, topics=["code"], min_prompt_chars=10)
    assert [r["id"] for r in longer] == ["code-1", "code-french", "code-2"]
    both = select_conversations(records, n=2, max_prompt_chars=40, topics=["code", "maths"])
    assert [r["id"] for r in both] == ["code-1", "maths-1"]
    anything = select_conversations(records, n=3, max_prompt_chars=1000)
    assert [r["id"] for r in anything] == ["chat", "code-1", "code-too-long"]


def test_select_conversations_rejects_an_unknown_topic() -> None:
    with pytest.raises(ValueError, match="Unknown topics \\['poetry'\\]"):
        list(select_conversations([], n=1, max_prompt_chars=10, topics=["poetry"]))
