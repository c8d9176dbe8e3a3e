"""Drafting with the target's own multi-token-prediction (MTP) layers (`mtp_decode`, what
`generate(use_mtp=True)` runs): the drafts are those of transformers' `MtpModel` (chains; trees hold them at
their first depth), greedy decoding keeps plain greedy's tokens at any batch size, sampling keeps the target's
distribution, and models without MTP layers are refused.

The models are tiny random ones of architectures transformers gives MTP layers (GLM-4.5 MoE, DeepSeek-V3,
ERNIE 4.5 MoE, Mellum), with their MTP layers built in memory from the model (`MtpModel(model, k)`) and attached
to it.
"""

from __future__ import annotations

import copy
import functools
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)
from transformers.cache_utils import MtpCache

import hf_specdec
from hf_specdec.generation.decisions import SpeculationGate, SpeculativeCosts
from hf_specdec.medusa.eagle_drafter import EagleDrafter
from hf_specdec.mtp.chain import MtpDrafter
from hf_specdec.mtp.decoding import mtp_decode
from hf_specdec.mtp.layers import mtp_layers
from hf_specdec.trees.dynamic import DynamicTree
from tests.goodness_of_fit import chisquare_pvalue, exact_joint, marginal, sample_copies, sampling_warpers
from tests.tiny_mtp import PAD, tiny_mtp_model


def ragged_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of 9, 6 and 2 tokens."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0
    attention_mask[2, :7] = 0
    return input_ids.masked_fill(attention_mask == 0, PAD), attention_mask


FIXED_COSTS = SpeculativeCosts(draft_forward=0.1, verify_per_token=0.01)


def mtp_generate(model: PreTrainedModel, input_ids: torch.Tensor, **kwargs: Any) -> Any:
    """`generate()` with the MTP loop, as `generate(use_mtp=True)` hands it over."""
    options = {k: kwargs.pop(k) for k in ("adaptive", "costs", "tree") if k in kwargs}
    options.setdefault("costs", FIXED_COSTS)  # drafting decisions independent of the machine's load
    decode = functools.partial(mtp_decode, **options)
    kwargs.setdefault("pad_token_id", PAD)
    return model.generate(input_ids, custom_generate=decode, **kwargs)


# ---------------------------------------------------------------------------------------------------------
# The drafts are transformers' MTP drafts
# ---------------------------------------------------------------------------------------------------------


def reference_drafts(model: PreTrainedModel, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' MTP drafts `(K,)` after `tokens` `(n+1,)`, recomputed from scratch: the target's last hidden
    states on every token but the last, then `MtpModel` over the whole text."""
    n = tokens.shape[0] - 1
    hidden = model(tokens[None, :n], output_hidden_states=-1).hidden_states[-1]
    mtp = mtp_layers(model)
    drafts, _, _ = mtp(
        input_ids=tokens[None, 1:],
        last_hidden_states=hidden,
        attention_mask=None,
        position_ids=torch.arange(1, n + 1)[None],
        mtp_cache=MtpCache(config=model.config.get_mtp_config()),
    )
    return drafts[0]


def check_drafts(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    monkeypatch: pytest.MonkeyPatch,
    **generate_kwargs: Any,
) -> Any:
    """Greedy MTP decoding of the batch, checking that every step's drafts in every row are the ones
    transformers' `MtpModel` drafts from the row's committed text; returns the output."""
    records: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    propose = MtpDrafter.propose

    def recording_propose(self: MtpDrafter, buffer: Any, last_token: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        proposal = propose(self, buffer, last_token, *args, **kwargs)
        for i, row in enumerate(buffer.active.tolist()):
            records.append((row, buffer.tokens[row, : int(buffer.lengths[row])].clone(), proposal.nodes[i, 1:]))
        return proposal

    monkeypatch.setattr(MtpDrafter, "propose", recording_propose)
    kwargs = {"attention_mask": attention_mask, "max_new_tokens": 24, "do_sample": False, **generate_kwargs}
    out = mtp_generate(model, input_ids, return_dict_in_generate=True, **kwargs)
    assert torch.equal(out.sequences, model.generate(input_ids, pad_token_id=PAD, **kwargs))
    pads = (1 - attention_mask).sum(dim=1).tolist()
    assert records
    for row, tokens, drafts in records:
        expected = reference_drafts(model, tokens[pads[row] :])[: drafts.shape[0]]
        assert torch.equal(drafts, expected), (row, tokens, drafts, expected)
    return out


@pytest.mark.parametrize(
    ("architecture", "num_mtp_layers"),
    [("glm4_moe", 1), ("glm4_moe", 2), ("glm4_moe", 3), ("deepseek_v3", 1), ("ernie4_5_moe", 1), ("mellum", 1)],
)
@pytest.mark.parametrize("plain_steps", [False, True])
@torch.no_grad()
def test_drafts_are_transformers_mtp_drafts(
    architecture: str, num_mtp_layers: int, plain_steps: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step's drafts, in every row of a left-padded batch, are the ones transformers' `MtpModel` drafts
    from the committed text, also after plain steps (every third step here)."""
    vocab = 4  # drafts are often right: steps accept 0, 1 and more tokens
    model = tiny_mtp_model(architecture, num_mtp_layers, vocab, seed=1)
    pattern = itertools.cycle([True, True, False] if plain_steps else [True])
    monkeypatch.setattr(SpeculationGate, "speculate", lambda self, rows: next(pattern))
    out = check_drafts(model, *ragged_batch(vocab), monkeypatch)
    assert int(out.speculative.accepted_tokens.sum()) > 0


@torch.no_grad()
def test_rows_that_finish_leave_the_mtp_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows ending at an EOS at different steps leave the batch: the others' drafts stay transformers' own."""
    model = tiny_mtp_model("glm4_moe", 3, vocab=4, seed=1)
    out = check_drafts(model, *ragged_batch(4), monkeypatch, eos_token_id=3)
    assert int((out.sequences[:, 9:] == 3).sum()) >= 2


@pytest.mark.parametrize("width", [1, 2, 3])
@torch.no_grad()
def test_prompts_shorter_than_the_mtp_layers(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompts of fewer tokens than the MTP layers need to see committed slots (one token, left-padded among
    longer ones): the drafts are still transformers' own."""
    model = tiny_mtp_model("glm4_moe", 3, vocab=4, seed=1)
    input_ids = torch.tensor([[1, 2, 3][:width], [PAD] * (width - 1) + [3]])
    attention_mask = (input_ids != PAD).long()
    attention_mask[0] = 1
    check_drafts(model, input_ids, attention_mask, monkeypatch)


@pytest.mark.parametrize("architecture", ["glm4_moe", "deepseek_v3"])
@torch.no_grad()
def test_a_tree_holds_the_mtp_draft_at_its_first_depth(architecture: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `tree=`, every step's tree has transformers' MTP draft among the root's children."""
    model = tiny_mtp_model(architecture, 1, vocab=4, seed=1)
    input_ids, attention_mask = ragged_batch(4)
    records: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    propose = EagleDrafter.propose

    def recording_propose(self: EagleDrafter, buffer: Any, *args: Any, **kwargs: Any) -> Any:
        proposal = propose(self, buffer, *args, **kwargs)
        for i, row in enumerate(buffer.active.tolist()):
            children = proposal.nodes[i][(proposal.trees.depths[i] == 1) & proposal.trees.real[i]]
            records.append((row, buffer.tokens[row, : int(buffer.lengths[row])].clone(), children))
        return proposal

    monkeypatch.setattr(EagleDrafter, "propose", recording_propose)
    out = mtp_generate(
        model,
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=20,
        do_sample=False,
        tree=8,
        adaptive=False,
        return_dict_in_generate=True,
    )
    pads = (1 - attention_mask).sum(dim=1).tolist()
    assert records
    for row, tokens, children in records:
        draft = reference_drafts(model, tokens[pads[row] :])[0]
        assert bool((children == draft).any()), (row, tokens, children, draft)
    assert int(out.speculative.accepted_tokens.sum()) > 0


# ---------------------------------------------------------------------------------------------------------
# Greedy identity
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("architecture", "num_mtp_layers"), [("glm4_moe", 2), ("deepseek_v3", 1)])
@pytest.mark.parametrize("batch", [1, 3])
@torch.no_grad()
def test_greedy_matches_plain_generate(architecture: str, num_mtp_layers: int, batch: int) -> None:
    model = tiny_mtp_model(architecture, num_mtp_layers, vocab=32, seed=3)
    input_ids, attention_mask = ragged_batch(32, seed=4)
    input_ids, attention_mask = input_ids[:batch], attention_mask[:batch]
    kwargs = {"attention_mask": attention_mask, "max_new_tokens": 30, "do_sample": False, "pad_token_id": PAD}
    expected = model.generate(input_ids, **kwargs)
    for adaptive in (False, True):
        out = mtp_generate(model, input_ids, adaptive=adaptive, return_dict_in_generate=True, **kwargs)
        assert torch.equal(out.sequences, expected)
        assert int(out.speculative.draft_forwards) > 0


@pytest.mark.parametrize("architecture", ["glm4_moe", "deepseek_v3"])
@pytest.mark.parametrize("batch", [1, 3])
@torch.no_grad()
def test_greedy_with_trees_matches_plain_generate(architecture: str, batch: int) -> None:
    model = tiny_mtp_model(architecture, 1, vocab=32, seed=3)
    input_ids, attention_mask = ragged_batch(32, seed=4)
    input_ids, attention_mask = input_ids[:batch], attention_mask[:batch]
    kwargs = {"attention_mask": attention_mask, "max_new_tokens": 30, "do_sample": False, "pad_token_id": PAD}
    expected = model.generate(input_ids, **kwargs)
    for adaptive, tree in ((False, 8), (True, DynamicTree(12, depth=3, top_k=3))):
        out = mtp_generate(model, input_ids, tree=tree, adaptive=adaptive, return_dict_in_generate=True, **kwargs)
        assert torch.equal(out.sequences, expected)
        assert int(out.speculative.draft_forwards) > 0


@torch.no_grad()
def test_greedy_stops_where_plain_generate_stops() -> None:
    """An EOS inside an accepted chain ends the row there, as in plain decoding."""
    model = tiny_mtp_model("glm4_moe", 3, vocab=8, seed=5)
    input_ids, attention_mask = ragged_batch(8, seed=6)
    kwargs = {"attention_mask": attention_mask, "max_new_tokens": 30, "do_sample": False, "pad_token_id": PAD}
    for eos in range(1, 8):
        expected = model.generate(input_ids, eos_token_id=eos, **kwargs)
        out = mtp_generate(model, input_ids, eos_token_id=eos, adaptive=False, **kwargs)
        assert torch.equal(out, expected), eos


# ---------------------------------------------------------------------------------------------------------
# Sampling keeps the target's distribution
# ---------------------------------------------------------------------------------------------------------

SAMPLE_VOCAB = 8
MAX_NEW = 4
NUM_SAMPLES = 4000
ALPHA = 1e-3
PROMPTS = ((1, 5, 2, 7, 3), (6, 4))
CHECKS = (("token 1", slice(0, 1)), ("tokens 1-2", slice(0, 2)), ("tokens 2-3", slice(1, 3)), ("token 4", slice(3, 4)))


@functools.cache
def _sampling_model(num_mtp_layers: int) -> PreTrainedModel:
    model = tiny_mtp_model("glm4_moe", num_mtp_layers, SAMPLE_VOCAB, seed=7)
    with torch.no_grad():  # peakier target and drafts: drafts are accepted and rejected often
        model.lm_head.weight.mul_(6.0)
    return model


@pytest.mark.parametrize(
    ("mode", "num_mtp_layers", "tree"), [("plain", 2, None), ("warped", 2, None), ("plain", 1, 8), ("warped", 1, 8)]
)
@torch.no_grad()
def test_sampling_keeps_the_target_distribution(mode: str, num_mtp_layers: int, tree: int | None) -> None:
    """Left-padded ragged batch of copies of two prompts: every row's tokens follow the target's exact
    distribution (chi-square, p >= 1e-3 for every check; the seed is fixed), with chains and with trees."""
    sampling = {"temperature": 1.0, "top_k": None, "top_p": None}
    if mode == "warped":
        sampling = {"temperature": 0.7, "top_k": 6, "top_p": 0.9}
    model = _sampling_model(num_mtp_layers)
    decode = functools.partial(mtp_decode, tree=tree, adaptive=False, costs=SpeculativeCosts(0.1, 0.0))
    kwargs = {k: v for k, v in sampling.items() if v is not None}
    samples, stats = sample_copies(
        model, PROMPTS, NUM_SAMPLES, PAD, MAX_NEW, seed=1234, custom_generate=decode, **kwargs
    )
    if tree is None:
        drafted, accepted = stats.drafted_at_position, stats.accepted_at_position
        assert bool((accepted > 0).all() and (accepted < drafted).all()), (drafted, accepted)
    assert 0 < int(stats.accepted_tokens.sum()) < int(stats.drafted_tokens.sum())
    warpers = sampling_warpers(**sampling)
    for prompt, rows in zip(PROMPTS, samples, strict=True):
        joint = exact_joint(model, prompt, warpers, SAMPLE_VOCAB, MAX_NEW)
        for name, columns in CHECKS:
            p = chisquare_pvalue(rows[:, columns], marginal(joint, columns))
            assert p >= ALPHA, (prompt, name, p)


# ---------------------------------------------------------------------------------------------------------
# generate(use_mtp=True)
# ---------------------------------------------------------------------------------------------------------


def routed_generate(model: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
    """The library's `generate()` entry on `model` (what `speculative(model).generate` runs)."""
    return hf_specdec.speculative_generate(model, *args, **kwargs)


@torch.no_grad()
def test_use_mtp_runs_the_library_loop() -> None:
    """`use_mtp=True` (keyword or generation config) decodes in the library's loop at batch 3, with its
    statistics, trees and schedules; transformers' own `use_mtp` path (batch 1 only) is not reached."""
    model = tiny_mtp_model("glm4_moe", 1, vocab=32, seed=3)
    input_ids, attention_mask = ragged_batch(32, seed=4)
    kwargs = {"attention_mask": attention_mask, "max_new_tokens": 20, "do_sample": False, "pad_token_id": PAD}
    expected = model.generate(input_ids, **kwargs)
    kwargs["speculative_costs"] = FIXED_COSTS  # drafting decisions independent of the machine's load
    calls = (
        {"use_mtp": True},
        {"generation_config": GenerationConfig(use_mtp=True, max_new_tokens=20, pad_token_id=PAD)},
        {"use_mtp": True, "tree": 8, "num_assistant_tokens_schedule": "constant"},
    )
    for extra in calls:
        out = routed_generate(model, input_ids, return_dict_in_generate=True, **{**kwargs, **extra})
        assert torch.equal(out.sequences, expected), extra
        assert int(out.speculative.draft_forwards) > 0
    model.generation_config.use_mtp = True  # the model's own default asks for it
    try:
        out = routed_generate(model, input_ids, return_dict_in_generate=True, **kwargs)
        assert torch.equal(out.sequences, expected)
        assert int(out.speculative.draft_forwards) > 0
        unfixed = {k: v for k, v in kwargs.items() if k != "speculative_costs"}  # a plain call takes no costs
        plain = routed_generate(model, input_ids, use_mtp=False, return_dict_in_generate=True, **unfixed)
        assert torch.equal(plain.sequences, expected)
        assert not hasattr(plain, "speculative")
    finally:
        model.generation_config.use_mtp = False


def test_use_mtp_refusals() -> None:
    model = tiny_mtp_model("glm4_moe", 2, vocab=16)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="drop `assistant=`"):
        routed_generate(model, ids, use_mtp=True, assistant=model, max_new_tokens=3)
    with pytest.raises(ValueError, match="`num_assistant_tokens` cannot be combined"):
        routed_generate(model, ids, use_mtp=True, num_assistant_tokens=4, max_new_tokens=3)
    with pytest.raises(ValueError, match="'adaptive' or 'constant'"):
        routed_generate(model, ids, use_mtp=True, num_assistant_tokens_schedule="heuristic", max_new_tokens=3)
    with pytest.raises(ValueError, match="no multi-token-prediction layers"):
        routed_generate(tiny_llama(), ids, use_mtp=True, max_new_tokens=3)


# ---------------------------------------------------------------------------------------------------------
# Loading the MTP layers
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_mtp_layers_load_once_from_the_checkpoint(tmp_path: Path) -> None:
    """Without attached MTP layers, the model's are loaded from its checkpoint (transformers' `MtpModel`
    loader: the checkpoint's layers past the model's last, which the model itself does not load), once."""
    source = tiny_mtp_model("glm4_moe", 1, vocab=32, seed=3)
    mtp = mtp_layers(source)
    source.save_pretrained(tmp_path)
    # The MTP layer's checkpoint names: those of a decoder layer after the model's last, plus its own weights.
    longer = copy.deepcopy(source.config)
    longer.num_hidden_layers = 3
    holder = AutoModelForCausalLM.from_config(longer)
    holder.model.layers[2].load_state_dict(mtp.layers[0].mtp_block.state_dict())
    holder.save_pretrained(tmp_path / "holder")
    weights = load_file(tmp_path / "model.safetensors")
    weights |= {k: v for k, v in load_file(tmp_path / "holder" / "model.safetensors").items() if ".layers.2." in k}
    layer = mtp.layers[0]
    for name, tensor in (("enorm", layer.enorm), ("hnorm", layer.hnorm), ("eh_proj", layer.eh_proj)):
        weights[f"model.layers.2.{name}.weight"] = tensor.weight.clone()
    weights["model.layers.2.shared_head.norm.weight"] = layer.post_norm.weight.clone()
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    model._keys_to_ignore_on_load_unexpected = [r"model\.layers\.2.*"]  # GLM-4.5's MTP layer is its 47th or 93rd
    loaded = mtp_layers(model)
    assert mtp_layers(model) is loaded
    assert loaded.shared_head is model.lm_head
    expected = dict(mtp.layers.named_parameters())
    assert all(torch.equal(p, expected[name]) for name, p in loaded.layers.named_parameters())
    input_ids, attention_mask = ragged_batch(32, seed=4)
    kwargs = {"attention_mask": attention_mask, "max_new_tokens": 20, "do_sample": False, "pad_token_id": PAD}
    assert torch.equal(mtp_generate(model, input_ids, **kwargs), model.generate(input_ids, **kwargs))


# ---------------------------------------------------------------------------------------------------------
# Refusal
# ---------------------------------------------------------------------------------------------------------


def tiny_llama() -> PreTrainedModel:
    """A model without MTP layers."""
    config = LlamaConfig(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return LlamaForCausalLM(config).eval()


def test_a_model_without_mtp_layers_is_refused() -> None:
    model = tiny_llama()
    with pytest.raises(ValueError, match="no multi-token-prediction layers"):
        mtp_generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
    zero = tiny_mtp_model("glm4_moe", 1, vocab=16)
    zero.config.num_mtp_layers = 0
    with pytest.raises(ValueError, match="no multi-token-prediction layers"):
        mtp_layers(AutoModelForCausalLM.from_config(zero.config))


def test_an_mtp_layer_of_a_kind_without_rotary_frequencies_is_refused() -> None:
    """The shared rotary embedding holds frequencies for the model's own layer kinds only: a sliding-window MTP
    layer on a model of full-attention layers is refused before decoding, not failed with a KeyError."""
    full = {"layer_types": ["full_attention"] * 2, "mtp_layer_types": ["sliding_attention"]}
    model = tiny_mtp_model("mellum", 1, vocab=16, **full)
    for extra in ({}, {"tree": 4}):
        with pytest.raises(ValueError, match="MTP layer 0 is a 'sliding_attention' layer"):
            routed_generate(model, torch.tensor([[1, 2, 3]]), use_mtp=True, max_new_tokens=3, **extra)


def test_trees_need_a_single_mtp_layer() -> None:
    model = tiny_mtp_model("glm4_moe", 2, vocab=16)
    with pytest.raises(ValueError, match="grows trees from a single MTP layer"):
        mtp_generate(model, torch.tensor([[1, 2, 3]]), tree=8, max_new_tokens=3, do_sample=False)
