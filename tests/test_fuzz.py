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
from hypothesis import strategies as st

from hf_specdec import SpeculativeCosts
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


# A sampled draw that puts the forced EOS token just before the forced-EOS position: the user processor then bans
# the only token forced EOS allows, every token is banned there, and what is drawn follows no rule (in plain
# decoding as in ours). The oracle must not count that position against the path.
_EVERY_TOKEN_BANNED = Case(
    arch="qwen2",
    prompts=[
        [2] * 8 + [4, 4, 29, 73, 4, 91, 20, 2, 28, 2, 4, 58, 70, 6],
        [2] * 7 + [4, 6, 6, 4, 20, 2, 26, 4, 4, 2, 45, 4, 6, 4, 4, 56, 2, 64, 69, 78, 4, 3, 3, 5, 5, 94],
        [2, 4],
        [2, 2, 5, 13, 2, 27, 28, 28, 4, 4, 2, 50, 6, 2, 2, 2, 63, 33, 33, 67, 75, 79, 4, 4],
        [5],
    ],
    gen={
        "max_new_tokens": 18,
        "min_new_tokens": 6,
        "min_length": 33,
        "pad_token_id": 0,
        "no_repeat_ngram_size": 1,
        "bad_words_ids": [[54, 9]],
        "sequence_bias": {(54, 54): -10.0},
        "forced_eos_token_id": 54,
        "begin_suppress_tokens": [54, 81, 95],
        "remove_invalid_values": True,
        "renormalize_logits": True,
        "do_sample": True,
        "min_p": 0.0,
        "typical_p": 0.2,
        "num_return_sequences": 3,
        "return_dict_in_generate": True,
        "output_scores": True,
    },
    defaults={},
    # Fixed costs: the tree's shape, and so the draw, follow the tokens alone (with costs measured while decoding,
    # the draw may miss the position on a busy machine).
    path_kwargs={"medusa": True, "tree": "dynamic", "speculative_costs": SpeculativeCosts(0.0, 0.0)},
    mask="mask",
    processor=True,
    prefix_fn=True,
    stop_on=(95,),
    tokenizer=True,
    via_config=True,
    seed=9,  # a draw that meets the position (with these costs) and then breaks a rule there
)


@PROFILE
@given(case=st.just(_EVERY_TOKEN_BANNED))
def test_a_position_where_every_token_is_banned_follows_no_rule(case: Case) -> None:
    check(case, "medusa_dynamic")
