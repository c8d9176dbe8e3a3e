"""A user's stopping criteria see what plain `generate()` shows them, on every path and at any batch size: one call
per position on the whole batch, rows in their places (padded once finished), in plain decoding's order; so
criteria with one setting per row, in loop or tensor form, and criteria that count their calls stop rows where
plain decoding stops them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_specdec
from tests.callback_cases import PATHS, Recording, models
from tests.tiny_models import ragged_batch


class StopOnToken(StoppingCriteria):
    """Stop row i when its last token is `stops[i]` (a loop over rows, or one tensor comparison)."""

    def __init__(self, stops: list[int], tensor_form: bool) -> None:
        self.stops, self.tensor_form = stops, tensor_form

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        if self.tensor_form:
            return input_ids[:, -1] == torch.tensor(self.stops)
        return torch.tensor([int(input_ids[i, -1]) == self.stops[i] for i in range(input_ids.shape[0])])


class RowBudgets(StoppingCriteria):
    """Stop row i after `budgets[i]` new tokens."""

    def __init__(self, prompt: int, budgets: list[int]) -> None:
        self.prompt, self.budgets = prompt, budgets

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return input_ids.shape[1] - self.prompt >= torch.tensor(self.budgets)


class CountingCalls(StoppingCriteria):
    """Stop every row at the `stop_at`-th call, recording every call's shapes."""

    def __init__(self, stop_at: int) -> None:
        self.stop_at, self.calls = stop_at, []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        self.calls.append((tuple(input_ids.shape), input_ids[:, -1].tolist()))
        return torch.full((input_ids.shape[0],), len(self.calls) >= self.stop_at, dtype=torch.bool)


def _criteria(kind: str, batch: int, prompt: int, plain_tokens: torch.Tensor) -> StoppingCriteria:
    """A fresh criterion of `kind` for rows whose plain greedy continuations are `plain_tokens` `(batch, n)`."""
    if kind in ("row tokens", "row tokens, tensor"):
        stops = [int(plain_tokens[b, 2 + 3 * b]) for b in range(batch)]  # each row its own token, reached late
        return StopOnToken(stops, tensor_form=kind.endswith("tensor"))
    if kind == "row budgets":
        return RowBudgets(prompt, [3 + 4 * b for b in range(batch)])
    return CountingCalls(stop_at=7)


@pytest.mark.parametrize("eos", [False, True])
@pytest.mark.parametrize("kind", ["row tokens", "row tokens, tensor", "row budgets", "counting calls"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", list(PATHS))
def test_criteria_see_plains_calls(path: str, batch: int, kind: str, eos: bool) -> None:
    target, draft, heads = models()
    ids, mask = ragged_batch(3, seed=5)
    ids, mask = ids[:batch], mask[:batch]
    settings: dict[str, Any] = {"attention_mask": mask, "max_new_tokens": 16, "do_sample": False}
    if not eos:  # no EOS id: plain decoding keeps extending stopped rows until every row has stopped
        settings["eos_token_id"] = None
    reference = target.generate(ids, **settings)[:, ids.shape[1] :]
    expected_criteria = _criteria(kind, batch, ids.shape[1], reference)
    expected = target.generate(ids, stopping_criteria=StoppingCriteriaList([expected_criteria]), **settings)
    criteria = _criteria(kind, batch, ids.shape[1], reference)
    model = heads if path == "heads" else target
    extra = {"speculative_costs": hf_specdec.SpeculativeCosts(0.0, 0.0), **PATHS[path](draft)}
    out = model.generate(ids, stopping_criteria=StoppingCriteriaList([criteria]), **settings, **extra)
    assert torch.equal(out, expected)
    if isinstance(criteria, CountingCalls):
        assert criteria.calls == expected_criteria.calls


class RecordingScores(StoppingCriteria):
    """Never stops; records what `scores` each call received."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        self.seen.append(None if scores is None else (type(scores).__name__, len(scores), tuple(scores[-1].shape)))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


@pytest.mark.parametrize("output_scores", [False, True])
def test_criteria_get_plains_scores_argument(output_scores: bool) -> None:
    target, draft, _ = models()
    ids, mask = ragged_batch(3, seed=5)
    settings: dict[str, Any] = {"attention_mask": mask, "max_new_tokens": 6, "do_sample": False}
    settings.update(output_scores=output_scores, return_dict_in_generate=True)
    plain, speculative = RecordingScores(), RecordingScores()
    target.generate(ids, stopping_criteria=StoppingCriteriaList([plain]), **settings)
    target.generate(ids, stopping_criteria=StoppingCriteriaList([speculative]), assistant=draft, **settings)
    assert speculative.seen == plain.seen


@pytest.mark.parametrize("seed", range(12))
def test_rows_cut_back_by_criteria_stream_and_stop_as_in_plain(seed: int) -> None:
    """A row a criterion stops before tokens it committed in earlier steps (a perfect draft runs ahead), while
    another row has ended at its EOS further on: the sequences, the criterion's calls and the streamer's are
    plain decoding's."""
    import copy
    import random

    target, _, _ = models()
    rng = random.Random(seed)
    ids, mask = ragged_batch(3, seed=seed)
    settings: dict[str, Any] = {"attention_mask": mask, "max_new_tokens": 12, "do_sample": False}
    free = target.generate(ids, **settings)[:, ids.shape[1] :]
    settings["eos_token_id"] = int(free[0, rng.randint(2, 6)])
    budgets = [rng.randint(1, 8) for _ in range(3)]
    expected_criteria, criteria = CountingRows(ids.shape[1], budgets), CountingRows(ids.shape[1], budgets)
    plain_stream, stream = Recording(), Recording()
    expected = target.generate(
        ids, stopping_criteria=StoppingCriteriaList([expected_criteria]), streamer=plain_stream, **settings
    )
    out = target.generate(
        ids, stopping_criteria=StoppingCriteriaList([criteria]), streamer=stream, assistant=copy.deepcopy(target),
        num_assistant_tokens=8, speculative_costs=hf_specdec.SpeculativeCosts(0.0, 0.0), **settings,
    )  # fmt: skip
    assert torch.equal(out, expected)
    assert criteria.calls == expected_criteria.calls
    assert stream.calls == plain_stream.calls


class CountingRows(RowBudgets):
    """`RowBudgets`, recording each call's shape."""

    def __init__(self, prompt: int, budgets: list[int]) -> None:
        super().__init__(prompt, budgets)
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        self.calls.append(tuple(input_ids.shape))
        return super().__call__(input_ids, scores)
