"""transformers' speculative arguments through this library's loop: `assistant_model=` (the same as
`assistant=`), `assistant_early_exit=` (the target's first layers draft), at any batch size; the methods this
loop does not run stay transformers' own; `speculative_generate` leaves the model as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GenerationMixin

import hf_specdec
from hf_specdec.drafters.early_exit import early_exit_draft
from hf_specdec.generation.model_class import original_class
from tests.goodness_of_fit import chisquare_pvalue, exact_joint, marginal, sample_copies, sampling_warpers
from tests.tiny_models import PAD, ragged_batch, tiny_model

ARCHS = ("llama", "gpt2", "qwen2", "mistral")


def _call(batch: int, **kwargs) -> dict:
    ids, mask = ragged_batch(batch)
    return {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 16, "do_sample": False, **kwargs}


@pytest.mark.parametrize("batch", [1, 3])
def test_assistant_model_is_assistant_at_any_batch_size(batch: int) -> None:
    target, draft = tiny_model("llama", seed=0, sharpen=4.0), tiny_model("llama", seed=1, num_layers=1)
    plain = target.generate(**_call(batch))
    wrapped = hf_specdec.speculative(target)
    out = wrapped.generate(
        **_call(batch, assistant_model=draft, return_dict_in_generate=True, speculative_costs=_FREE_DRAFT)
    )
    assert torch.equal(out.sequences, plain)
    assert int(out.speculative.drafted_tokens.sum()) > 0  # drafted by this library's loop
    assert torch.equal(wrapped.generate(**_call(batch, assistant=draft)), plain)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 3])
def test_early_exit_greedy_is_plain_greedy(arch: str, batch: int) -> None:
    target = tiny_model(arch, seed=0, num_layers=3, sharpen=4.0)
    plain = target.generate(**_call(batch))
    out = hf_specdec.speculative_generate(
        target, **_call(batch, assistant_early_exit=1, return_dict_in_generate=True, speculative_costs=_FREE_DRAFT)
    )
    assert torch.equal(out.sequences, plain)
    assert out.speculative.draft_forwards > 0


@pytest.mark.parametrize("extra", [{"tree": 4}, {"prompt_lookup_num_tokens": 3}])
def test_early_exit_grows_trees_and_combines_with_lookup(extra: dict) -> None:
    target = tiny_model("qwen2", seed=0, num_layers=3, sharpen=4.0)
    plain = target.generate(**_call(3))
    out = hf_specdec.speculative_generate(target, **_call(3, assistant_early_exit=2, **extra))
    assert torch.equal(out, plain)


def test_the_early_exit_draft_is_the_targets_first_layers_sharing_its_tensors() -> None:
    target = tiny_model("llama", seed=0, num_layers=3)
    draft = early_exit_draft(target, 2)
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 3
    shared = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in shared for p in draft.parameters())
    # What transformers' early exit computes: the first layers, the final norm, the lm_head.
    ids = torch.tensor([[5, 9, 11, 3]])
    hidden = target.model.embed_tokens(ids)
    positions = torch.arange(ids.shape[1])[None]
    rotary = target.model.rotary_emb(hidden, positions)
    mask = torch.full((4, 4), float("-inf")).triu(1)[None, None]
    for layer in target.model.layers[:2]:
        hidden = layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    expected = target.lm_head(target.model.norm(hidden))
    torch.testing.assert_close(draft(ids).logits, expected)


def test_early_exit_samples_the_targets_distribution() -> None:
    torch.manual_seed(0)
    target = tiny_model("llama", seed=0, num_layers=3, sharpen=6.0)
    target.generation_config.eos_token_id = None
    prompt, vocab, new = (5, 9, 11, 3), target.config.vocab_size, 2
    warpers = sampling_warpers(temperature=1.0, top_k=None, top_p=None)
    joint = exact_joint(target, prompt, warpers, vocab, new)
    (samples,), stats = sample_copies(
        hf_specdec.speculative(target), (prompt,), 4000, PAD, new, seed=3, assistant_early_exit=2,
        num_assistant_tokens=1, num_assistant_tokens_schedule="constant", top_k=None, top_p=None,
    )  # fmt: skip
    assert int(stats.drafted_tokens.sum()) > 0
    assert chisquare_pvalue(samples, joint) > 1e-3  # the two tokens jointly (the second one drafted)
    assert chisquare_pvalue(samples[:, 1:], marginal(joint, slice(1, 2))) > 1e-3


def test_early_exit_refusals() -> None:
    target = tiny_model("llama", seed=0, num_layers=3)
    with pytest.raises(ValueError, match="between 1 and 2"):
        hf_specdec.speculative_generate(target, **_call(1, assistant_early_exit=3))
    with pytest.raises(ValueError, match="cannot be combined with a draft model"):
        hf_specdec.speculative_generate(target, **_call(1, assistant_early_exit=1, assistant=tiny_model("llama", 1)))


def test_speculative_generate_leaves_the_model_as_it_was() -> None:
    target, draft = tiny_model("llama", seed=0, sharpen=4.0), tiny_model("llama", seed=1, num_layers=1)
    cls = type(target)
    plain = target.generate(**_call(2))
    assert torch.equal(hf_specdec.speculative_generate(target, **_call(2, assistant=draft)), plain)
    assert type(target) is cls and original_class(target) is cls
    assert torch.equal(target.generate(**_call(2)), plain)
    wrapped = hf_specdec.speculative(target)
    assert original_class(wrapped) is cls
    # A wrapped model's plain calls and another draft work as before.
    assert torch.equal(wrapped.generate(**_call(2)), plain)
    assert torch.equal(wrapped.generate(**_call(2, assistant=tiny_model("llama", seed=2, num_layers=1))), plain)


def test_transformers_own_methods_stay_transformers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """`assistant_model=` with DFlash is transformers' own assisted decoding, untouched (transformers then finds
    that the tiny Llama is no DFlash drafter); beside `assistant=` it is refused."""
    target, draft = hf_specdec.speculative(tiny_model("llama", seed=0)), tiny_model("llama", seed=1, num_layers=1)
    seen = []
    original = GenerationMixin.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("custom_generate"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    with pytest.raises(Exception):  # noqa: B017  (whatever transformers raises on it)
        target.generate(**_call(1, assistant_model=draft, speculation_type="dflash"))
    assert seen and seen[0] is None  # no loop of ours handed in
    with pytest.raises(ValueError, match="speculation_type"):
        target.generate(**_call(1, assistant=draft, speculation_type="dflash"))


def test_use_mtp_beside_a_draft_model_is_refused() -> None:
    target, draft = hf_specdec.speculative(tiny_model("llama", seed=0)), tiny_model("llama", seed=1, num_layers=1)
    with pytest.raises(ValueError, match="drop `assistant=`"):
        target.generate(**_call(1, assistant_model=draft, use_mtp=True))


_FREE_DRAFT = hf_specdec.SpeculativeCosts(draft_forward=0.05, verify_per_token=0.01)


HUB_RECIPE = Path(__file__).resolve().parents[1] / "hub" / "speculative-generate"


@pytest.mark.parametrize("wrapped", [False, True])
def test_the_custom_generate_recipe_runs_repeatedly_through_the_loop(wrapped: bool) -> None:
    target, draft = tiny_model("llama", seed=0, sharpen=4.0), tiny_model("llama", seed=1, num_layers=1)
    plain = target.generate(**_call(2))
    cls = type(hf_specdec.speculative(target) if wrapped else target)
    recipe = {"custom_generate": str(HUB_RECIPE), "trust_remote_code": True, "return_dict_in_generate": True}
    for drafts in ({"assistant": draft}, {"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}, {}):
        out = target.generate(**_call(2, **recipe, **drafts))
        assert torch.equal(out.sequences, plain)
        assert (getattr(out, "speculative", None) is not None) == bool(drafts)
        assert type(target) is cls  # the recipe changes nothing on the model
    assert torch.equal(target.generate(**_call(2)), plain)
