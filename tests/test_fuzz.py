"""Differential fuzzer: every speculative decoding path against plain transformers `generate()`.

Greedy cases (and sampling that cannot vary: top_k=1) must return plain's exact tokens, scores and logits;
sampled cases must keep every rule plain decoding keeps (lengths, EOS and padding, bans, n-grams, ...); a
refusal must be a documented one, a `ValueError` naming the argument. One test per path, so that the profile's
case count is per path: "ci" by default, `HYPOTHESIS_PROFILE=long` for >= 5,000 random cases per path.

    python -m pytest tests/test_fuzz.py -q                              # ci
    HYPOTHESIS_PROFILE=long python -m pytest tests/test_fuzz.py -q -x    # long (FUZZ_EXAMPLES=N: N per path)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import example, given

from tests.fuzz_cases import PROFILE, Case, cases, check, known_divergences


def known(path: str) -> Callable[[Any], Any]:
    """Run the once-found divergences on `path` first, as explicit examples."""

    def decorate(test: Any) -> Any:
        for case in known_divergences(path):
            test = example(case=case)(test)
        return test

    return decorate


@PROFILE
@known("assistant_poor")
@given(case=cases("assistant_poor"))
def test_assistant_poor_draft(case: Case) -> None:
    check(case, "assistant_poor")


@PROFILE
@known("assistant_tree")
@given(case=cases("assistant_tree"))
def test_assistant_draft_tree(case: Case) -> None:
    check(case, "assistant_tree")


@PROFILE
@known("assistant_perfect")
@given(case=cases("assistant_perfect"))
def test_assistant_perfect_draft(case: Case) -> None:
    check(case, "assistant_perfect")


@PROFILE
@known("lookup")
@given(case=cases("lookup"))
def test_prompt_lookup(case: Case) -> None:
    check(case, "lookup")


@PROFILE
@known("hybrid")
@given(case=cases("hybrid"))
def test_hybrid(case: Case) -> None:
    check(case, "hybrid")


@PROFILE
@known("early_exit")
@given(case=cases("early_exit"))
def test_early_exit(case: Case) -> None:
    check(case, "early_exit")


@PROFILE
@known("other_tokenizer")
@given(case=cases("other_tokenizer"))
def test_draft_of_another_tokenizer(case: Case) -> None:
    check(case, "other_tokenizer")


@PROFILE
@known("medusa")
@given(case=cases("medusa"))
def test_medusa_static_tree(case: Case) -> None:
    check(case, "medusa")


@PROFILE
@known("medusa_dynamic")
@given(case=cases("medusa_dynamic"))
def test_medusa_dynamic_tree(case: Case) -> None:
    check(case, "medusa_dynamic")


@PROFILE
@known("medusa_lookup")
@given(case=cases("medusa_lookup"))
def test_medusa_tree_and_lookup(case: Case) -> None:
    check(case, "medusa_lookup")


@PROFILE
@known("medusa_eagle")
@given(case=cases("medusa_eagle"))
def test_eagle_heads(case: Case) -> None:
    check(case, "medusa_eagle")
