"""Choosing training conversations by topic (`hf_specdec.topics`) and the `data` command's filters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hf_specdec.bench import prompts
from hf_specdec.cli import main
from hf_specdec.topics import select_conversations, topic_of


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
        ("Write a C++ program that prints primes", "code"),
        ("How do I do this in C#?", "code"),
        ("Help me with my maths homework", "maths"),
        ("Explain mathematical induction", "maths"),
        ("Tell me a story about a dragon.", None),
        ("Make a list of ten birthday gift ideas", None),  # everyday words are not code
        ("Summarise the meeting of 2023-05-01 in 3-5 sentences", None),  # dates and ranges are not arithmetic
        ("A 1920x1080 wallpaper of a sunset, please", None),
        ("Classical music or jazz?", None),
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
    neither = select_conversations(records, n=10, max_prompt_chars=40, topics=["other"])
    assert [r["id"] for r in neither] == ["chat"]
    anything = select_conversations(records, n=3, max_prompt_chars=1000)
    assert [r["id"] for r in anything] == ["chat", "code-1", "code-too-long"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"topics": ["poetry"]}, "Unknown topics \\['poetry'\\]"),
        ({"n": 0}, "at least one"),
        ({"min_prompt_chars": 20}, "swap them"),
        ({"min_ascii": 97}, "in \\[0, 1\\]"),
    ],
)
def test_select_conversations_checks_its_arguments_at_once(arguments: dict, message: str) -> None:
    def never() -> Iterator[dict]:
        raise AssertionError("the records must not be read when the arguments are wrong")
        yield {}

    with pytest.raises(ValueError, match=message):
        select_conversations(never(), **{"n": 1, "max_prompt_chars": 10, **arguments})


def test_data_command_writes_the_selected_conversations(tmp_path: Path, monkeypatch, capsys) -> None:
    records = [_record(f"Write python code number {i}", f"c{i}", replies=2) for i in range(3)]
    records.insert(1, _record("A poem about the sea", "chat"))
    monkeypatch.setattr(prompts, "sharegpt_v3_conversations", lambda: records)
    out = tmp_path / "code.jsonl"
    assert main(["data", "--n", "5", "--skip", "1", "--topic", "code", "--out", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in written] == ["c1", "c2"]
    assert written[0]["conversations"] == records[2]["conversations"][:2]
    assert "wrote 2 conversations" in (printed := capsys.readouterr().out) and "asked for 5" in printed
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "--n", "0", "--out", str(out)])
    assert exit_info.value.code == 2 and "--n: expected a whole number >= 1" in capsys.readouterr().err


def test_whole_conversations_keep_every_exchange_while_the_turns_alternate() -> None:
    record = _record("Write python code", "a", replies=3)  # human, (gpt, human) x 3: ends on a human turn
    twice = [{"from": "gpt", "value": "twice"}, {"from": "human", "value": "q"}]
    broken = {"id": "b", "conversations": [*_record("Hi there")["conversations"][:2], *twice]}
    empty = {"id": "c", "conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": ""}]}
    chosen = list(select_conversations([record, broken, empty], n=5, max_prompt_chars=100, whole=True))
    assert [r["id"] for r in chosen] == ["a", "b"]
    assert chosen[0]["conversations"] == record["conversations"][:6]  # up to the last reply
    assert [t["from"] for t in chosen[1]["conversations"]] == ["human", "gpt"]  # stops at the second gpt turn


def test_data_command_writes_whole_conversations(tmp_path: Path, monkeypatch) -> None:
    records = [_record("Write python code", "a", replies=2)]
    monkeypatch.setattr(prompts, "sharegpt_v3_conversations", lambda: records)
    out = tmp_path / "whole.jsonl"
    assert main(["data", "--whole", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["conversations"] == records[0]["conversations"][:4]
