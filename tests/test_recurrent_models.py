"""Models with recurrent layers (hybrids of linear attention, Mamba or short convolutions with attention, and pure
state space models): every path gives plain greedy's tokens at batch 1 and on a left-padded batch of 3, in float32
(chains, and trees verified path by path); sampling keeps the target's distribution; the rollback costs no forward;
a recurrent draft grows trees, each frontier node a row; the classes whose states transformers does not record are
refused before any forward, with the reason."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

import hf_specdec
from tests.goodness_of_fit import chisquare_pvalue, exact_joint, marginal, sample_copies, sampling_warpers
from tests.recurrent_models import RECURRENT_ARCHS, recurrent_model
from tests.tiny_models import ragged_batch

# Classes whose recurrent states transformers' caches keep per token (or that need none: short convolutions).
SUPPORTED = (
    "qwen3_5", "qwen3_5_moe", "qwen3_next", "mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "falcon_h1",
    "granitemoehybrid", "nemotron_h", "zamba2", "lfm2", "lfm2_moe", "lfm3", "kimi_linear", "olmo_hybrid",
    "bailing_hybrid", "lara_mini",
)  # fmt: skip
# Refused, with the reason each message gives.
REFUSED = {
    "zamba": "does not keep the state of its recurrent layers after each token",
    "zaya": "does not keep the state of its recurrent layers after each token",
    "qwen4_exp": "indexed_attention",
    "minimax": "does not keep the state of its recurrent layers after each token",
    "recurrent_gemma": "does not keep the state of its recurrent layers after each token",
    "rwkv": "recurrent state outside transformers' cache",
    "xlstm": "recurrent state outside transformers' cache",
}
PATHS = {
    "assistant": lambda draft: {"assistant": draft},
    "lookup": lambda draft: {"prompt_lookup_num_tokens": 3},
    "assistant+lookup": lambda draft: {"assistant": draft, "prompt_lookup_num_tokens": 3},
}
COSTS = hf_specdec.SpeculativeCosts(0.0, 0.0)  # drafting always pays: every step speculates


def test_every_class_is_tested_or_refused() -> None:
    assert set(SUPPORTED) | set(REFUSED) == set(RECURRENT_ARCHS)
    assert not set(SUPPORTED) & set(REFUSED)


@pytest.mark.parametrize(("model_type", "continues"), [("zaya", True), ("minimax", False)])
def test_what_the_unrecorded_classes_multi_token_forward_gives(model_type: str, continues: bool) -> None:
    """Why MiniMax, refused for unrecorded states, would stay refused even if its states were rebuilt by feeding
    tokens again: its forward over several tokens after a cache differs from one forward over the whole text (by
    0.06 on this tiny model), where ZAYA's matches it."""
    model = recurrent_model(model_type, 0)
    ids = torch.randint(4, 90, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(ids).logits[:, 8:]
        cache = model(ids[:, :8], use_cache=True).cache
        continued = model(ids[:, 8:], cache=cache, use_cache=True).logits
    gap = float((continued - whole).abs().max())
    assert (gap < 1e-4) == continues, gap


def test_transformers_own_assisted_decoding_parts_from_plain_greedy_on_zaya() -> None:
    """Why ZAYA's refusal keeps its users' results right rather than sending them elsewhere: transformers' own
    assisted decoding, fed a draft, crops ZAYA's cache without rolling back its recurrent state, and its greedy
    tokens part from plain greedy decoding (here on every one of three seeds)."""
    parted = 0
    for seed in range(3):
        target, draft = recurrent_model("zaya", 2 * seed), recurrent_model("zaya", 2 * seed + 1)
        ids = torch.randint(3, target.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(seed))
        plain = target.generate(ids, max_new_tokens=24, do_sample=False)
        assisted = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft)
        parted += not torch.equal(plain, assisted)
    assert parted == 3


@pytest.mark.parametrize("model_type", ["minimax", "recurrent_gemma"])
def test_transformers_own_assisted_decoding_stops_on_minimax_and_recurrent_gemma(model_type: str) -> None:
    target, draft = recurrent_model(model_type, 0), recurrent_model(model_type, 1)
    ids = torch.randint(3, target.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    with pytest.raises((RuntimeError, AttributeError)):
        target.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=draft)


@functools.cache
def _models(model_type: str) -> tuple[Any, Any]:
    return hf_specdec.speculative(recurrent_model(model_type, 0)), recurrent_model(model_type, 1)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("model_type", SUPPORTED)
def test_chains_give_plain_greedy_tokens(model_type: str, path: str, batch: int) -> None:
    target, draft = _models(model_type)
    ids, mask = ragged_batch(3)
    ids, mask = ids[:batch], mask[:batch]
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False)
    out = target.generate(
        ids, attention_mask=mask, max_new_tokens=14, do_sample=False, speculative_costs=COSTS,
        return_dict_in_generate=True, **PATHS[path](draft),
    )  # fmt: skip
    assert torch.equal(out.sequences, plain)
    assert out.speculative.plain_steps == 0
    if "assistant" in path:  # (lookup drafts where the text repeats itself)
        assert int(out.speculative.drafted_tokens.sum()) > 0


@pytest.mark.parametrize("model_type", ["qwen3_5", "falcon_h1", "mamba2", "lfm3"])
def test_a_static_cache_gives_plain_greedy_tokens(model_type: str) -> None:
    target, draft = _models(model_type)
    ids, mask = ragged_batch(3)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    for extra in ({"assistant": draft}, {"prompt_lookup_num_tokens": 3}):
        out = target.generate(
            ids, attention_mask=mask, max_new_tokens=12, do_sample=False, cache_implementation="static",
            speculative_costs=COSTS, **extra,
        )  # fmt: skip
        assert torch.equal(out, plain), extra


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_classes_without_recorded_states_are_refused_with_the_reason(model_type: str) -> None:
    target = hf_specdec.speculative(recurrent_model(model_type, 0))
    ids, mask = ragged_batch(2)
    with pytest.raises(ValueError, match=REFUSED[model_type]):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, prompt_lookup_num_tokens=3)


def test_a_cut_of_a_hybrid_drafts_for_it() -> None:
    target, _ = _models("qwen3_5")
    ids, mask = ragged_batch(3)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    out = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, assistant_early_exit=1)
    assert torch.equal(out, plain)


def test_a_hybrid_draft_drafts_for_an_attention_target() -> None:
    from tests.tiny_models import tiny_target

    target = tiny_target("llama")
    draft = recurrent_model("qwen3_5", 1)
    ids, mask = ragged_batch(3)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    out = target.generate(
        ids, attention_mask=mask, max_new_tokens=12, do_sample=False, assistant=draft, speculative_costs=COSTS
    )
    assert torch.equal(out, plain)


def test_rolling_back_costs_no_forward() -> None:
    """One target forward per step: the states of rejected drafts are taken from the verify forward."""
    target, draft = _models("qwen3_5")
    calls: list[str] = []

    def count(module: torch.nn.Module, args: Any) -> None:
        if module is target:
            calls.append("target")

    ids, mask = ragged_batch(3)
    hook = register_module_forward_pre_hook(count)
    try:
        out = target.generate(
            ids, attention_mask=mask, max_new_tokens=14, do_sample=False, assistant=draft, speculative_costs=COSTS,
            return_dict_in_generate=True,
        )  # fmt: skip
    finally:
        hook.remove()
    steps = int(out.speculative.target_forwards.max())
    assert len(calls) == 1 + steps  # the prefill, then one forward per step: nothing re-run
    assert int(out.speculative.accepted_tokens.sum()) < int(out.speculative.drafted_tokens.sum())  # rejections


HEAD_BASES = ("qwen3_5", "mamba2", "jamba", "falcon_h1", "nemotron_h", "lfm2", "granitemoehybrid")
# EAGLE heads need a config whose layer types they can set to full attention; EAGLE-3 heads, attention heads.
HEADS_REFUSED = {("mamba2", "eagle"), ("mamba2", "eagle3"), ("jamba", "eagle"), ("falcon_h1", "eagle")}


@pytest.mark.parametrize("head_type", ["medusa", "recurrent", "eagle", "eagle3"])
@pytest.mark.parametrize("model_type", HEAD_BASES)
def test_heads_draft_trees_and_chains_on_a_recurrent_base(model_type: str, head_type: str) -> None:
    """Heads on a base with recurrent layers: their default there (a chain), trees, and trees with prompt lookup."""
    base, _ = _models(model_type)
    ids, mask = ragged_batch(3)
    plain = base.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    try:
        heads = hf_specdec.MedusaForCausalLM.from_base(base, hf_specdec.MedusaConfig(num_heads=3, head_type=head_type))
    except ValueError as error:  # EAGLE's decoder is built from the base's family; EAGLE-3's takes its attention
        assert (model_type, head_type) in HEADS_REFUSED, error
        return
    assert (model_type, head_type) not in HEADS_REFUSED
    tree = hf_specdec.DynamicTree(num_nodes=5, top_k=2) if head_type.startswith("eagle") else "small"
    for extra in ({}, {"tree": tree}, {"tree": tree, "prompt_lookup_num_tokens": 3}):
        out = heads.generate(
            ids, attention_mask=mask, max_new_tokens=12, do_sample=False, medusa=True, speculative_costs=COSTS,
            return_dict_in_generate=True, **extra,
        )  # fmt: skip
        assert torch.equal(out.sequences, plain), extra
        assert int(out.speculative.drafted_tokens.sum()) > 0 and out.speculative.plain_steps == 0


@pytest.mark.parametrize("model_type", ["qwen3_5", "mamba", "jamba", "falcon_h1", "lfm3", "nemotron_h"])
def test_a_draft_tree_is_verified_path_by_path(model_type: str) -> None:
    """A draft of attention layers grows a tree; the target with recurrent layers verifies each root-to-leaf path
    as a row of its own, in one forward."""
    from tests.tiny_models import tiny_model

    target, _ = _models(model_type)
    draft = tiny_model("llama", seed=1, num_layers=1)
    ids, mask = ragged_batch(3)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False)
    for extra in ({"tree": 6}, {"tree": hf_specdec.DynamicTree(num_nodes=5, depth=3, top_k=2)}):
        out = target.generate(
            ids, attention_mask=mask, max_new_tokens=14, do_sample=False, assistant=draft, speculative_costs=COSTS,
            return_dict_in_generate=True, **extra,
        )  # fmt: skip
        assert torch.equal(out.sequences, plain), extra
        assert out.speculative.plain_steps == 0


@pytest.mark.parametrize("model_type", ["qwen3_5", "mamba", "jamba", "lfm2", "zamba2"])
def test_a_recurrent_draft_grows_trees(model_type: str) -> None:
    """A draft with recurrent layers grows a tree, each frontier node a row of its own: plain greedy's tokens at
    batch 1 and 3, with and without prompt lookup grafted on and with a static cache; with the target's own weights
    as the draft every step accepts every depth of its greedy path."""
    target, draft = _models(model_type)
    same = recurrent_model(model_type, 0)
    for batch in (1, 3):
        ids, mask = ragged_batch(batch)
        plain = target.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False)
        for extra in (
            {"tree": 6},
            {"tree": hf_specdec.DynamicTree(num_nodes=5, depth=3, top_k=2), "prompt_lookup_num_tokens": 3},
            {"tree": 4, "cache_implementation": "static"},
        ):
            out = target.generate(
                ids, attention_mask=mask, max_new_tokens=14, do_sample=False, assistant=draft, speculative_costs=COSTS,
                **extra,
            )  # fmt: skip
            assert torch.equal(out, plain), extra
        chain_tree = hf_specdec.DynamicTree(num_nodes=3, depth=3, top_k=1)  # the greedy path alone, grown as a tree
        out = target.generate(
            ids, attention_mask=mask, max_new_tokens=14, do_sample=False, assistant=same, tree=chain_tree,
            speculative_costs=COSTS, return_dict_in_generate=True,
        )  # fmt: skip
        assert torch.equal(out.sequences, plain)
        assert torch.equal(out.speculative.accepted_tokens, out.speculative.drafted_tokens)


@pytest.mark.parametrize("model_type", ["qwen3_5", "mamba", "falcon_h1"])
def test_a_recurrent_draft_scores_every_node_from_its_own_path(model_type: str) -> None:
    """Every node a recurrent draft is fed while growing a tree gets the logits the draft gives at the end of the
    node's whole text (committed tokens, then its path) in one plain forward, across steps where rows keep
    different paths of their trees."""
    from hf_specdec.drafters.recurrent_tree import RecurrentDraftTreeDrafter

    target, _ = _models(model_type)
    draft = recurrent_model(model_type, 0)  # the target's weights, its output layer perturbed: some paths accepted
    with torch.no_grad():
        weight = draft.get_output_embeddings().weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)) * 0.5 * weight.std())
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # (text, logits) per fed node
    propose, feed = RecurrentDraftTreeDrafter.propose, RecurrentDraftTreeDrafter._feed_frontier

    def recording_propose(self: Any, buffer: Any, *args: Any, **kwargs: Any) -> Any:
        self._recorded_buffer = buffer
        return propose(self, buffer, *args, **kwargs)

    def recording_feed(self: Any, state: Any, *args: Any) -> torch.Tensor:
        logits = feed(self, state, *args)
        buffer = self._recorded_buffer
        for a, row in enumerate(buffer.active.tolist()):
            length = int(buffer.active_lengths[a])
            real = torch.cat([ids_mask[row].bool(), torch.ones(length - width, dtype=torch.bool)])
            prefix = buffer.tokens[row, :length][real]  # the row's committed tokens, without its padding
            for f in range(state.paths.shape[1]):
                if bool(state.alive[a, f]):
                    seen.append((torch.cat([prefix, state.paths[a, f]]), logits[a, f].clone()))
        return logits

    ids, ids_mask = ragged_batch(3)
    width = ids.shape[1]
    tree = hf_specdec.DynamicTree(num_nodes=6, depth=3, top_k=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RecurrentDraftTreeDrafter, "propose", recording_propose)
        patch.setattr(RecurrentDraftTreeDrafter, "_feed_frontier", recording_feed)
        target.generate(
            ids, attention_mask=ids_mask, max_new_tokens=12, do_sample=False, assistant=draft, tree=tree,
            speculative_costs=COSTS,
        )  # fmt: skip
    assert len(seen) > 20
    for text, logits in seen:
        expected = draft(text[None]).logits[0, -1]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_a_cache_of_recurrent_states_is_not_continued() -> None:
    target, draft = _models("qwen3_5")
    ids, mask = ragged_batch(1)
    first = target.generate(
        ids, attention_mask=mask, max_new_tokens=4, return_dict_in_generate=True, prompt_lookup_num_tokens=3
    )
    assert first.cache is None  # the loop's own states, which no later call could continue
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=2, return_dict_in_generate=True)
    with pytest.raises(ValueError, match="cannot continue a cache of them"):
        target.generate(
            torch.cat([plain.sequences, plain.sequences[:, -1:]], dim=1), cache=plain.cache, max_new_tokens=2,
            assistant=draft,
        )  # fmt: skip


# Sampling ------------------------------------------------------------------------------------------------------

VOCAB, PAD, MAX_NEW, SAMPLES, ALPHA = 8, 0, 4, 6000, 1e-3


def _sampling_model(seed: int, sharpen: float) -> Qwen3_5ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_value_heads=2, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=3,
        layer_types=["linear_attention", "full_attention"], max_position_embeddings=64, eos_token_id=None,
        pad_token_id=PAD, bos_token_id=None,
    )  # fmt: skip
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def _attention_draft() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, eos_token_id=None, pad_token_id=PAD, bos_token_id=None,
    )  # fmt: skip
    draft = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        draft.lm_head.weight.mul_(6.0)
    return draft


@pytest.mark.parametrize("path", ["assistant", "lookup", "heads", "heads tree", "draft tree", "own draft tree"])
def test_sampling_keeps_a_hybrid_targets_distribution(path: str) -> None:
    target = hf_specdec.speculative(_sampling_model(0, 6.0))
    draft = _sampling_model(1, 6.0)
    prompts = ((1, 5, 2, 5, 2), (6, 4))  # the second left-padded; lookup finds the first's repeats
    extra: dict[str, Any] = {"assistant": draft, "num_assistant_tokens": 3, "num_assistant_tokens_schedule": "constant"}
    model = target
    if path == "lookup":
        extra = {"prompt_lookup_num_tokens": 3}
    if path.startswith("heads"):  # untrained recurrent heads: their top tokens, each a point mass
        torch.manual_seed(2)
        model = hf_specdec.MedusaForCausalLM.from_base(
            target, hf_specdec.MedusaConfig(num_heads=3, head_type="recurrent")
        )
        extra = {"medusa": True, "tree": "small" if path == "heads tree" else "chain"}
    if path.endswith("draft tree"):  # trees sampled from a draft of attention layers, or from the recurrent draft
        grower = draft if path.startswith("own") else _attention_draft()
        extra = {"assistant": grower, "tree": hf_specdec.DynamicTree(num_nodes=6, depth=3, top_k=2)}
    samples, stats = sample_copies(model, prompts, SAMPLES, PAD, MAX_NEW, seed=7, speculative_costs=COSTS, **extra)
    assert int(stats.drafted_tokens.sum()) > 0 and stats.plain_steps == 0
    assert int(stats.accepted_tokens.sum()) < int(stats.drafted_tokens.sum())  # rejections and rows that part
    for prompt, generated in zip(prompts, samples, strict=True):
        joint = exact_joint(target, prompt, sampling_warpers(1.0, None, None), VOCAB, MAX_NEW)
        for columns in (slice(0, 2), slice(1, 3), slice(2, 4)):
            assert chisquare_pvalue(generated[:, columns], marginal(joint, columns)) > ALPHA, (prompt, columns)


# Random inputs ------------------------------------------------------------------------------------------------


def _random_case(seed: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A model type, inputs (1-4 left-padded rows of 1-16 tokens, an EOS the target emits or none, 1-20 new
    tokens, a dynamic or static cache) and a path (chains, or trees a draft grows) with random settings,
    from `seed`."""
    import random

    rng = random.Random(seed)
    model_type = rng.choice(SUPPORTED)
    target, draft = _models(model_type)
    batch = rng.randint(1, 4)
    lengths = [rng.randint(1, 16) for _ in range(batch)]
    width = max(lengths)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 96, (batch, width), generator=generator)
    if rng.random() < 0.5:  # repeats in the prompts: prompt lookup finds them
        ids = torch.cat([ids[:, : width // 2 + 1]] * 2, dim=1)[:, :width]
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    ids = ids.masked_fill(mask == 0, 0)
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": rng.randint(1, 20)}
    if rng.random() < 0.3:
        inputs["cache_implementation"] = "static"
    if rng.random() < 0.5:  # an EOS the target emits, so that rows finish at different steps
        plain = target.generate(**inputs, do_sample=False)
        inputs["eos_token_id"] = int(plain[rng.randrange(batch), rng.randint(width, plain.shape[1] - 1)])
    path = rng.choice(
        ["assistant", "lookup", "assistant+lookup", "early_exit", "tree", "tree+lookup", "own_tree", "own_tree+lookup"]
    )  # a tree grown by a draft of attention layers, or by the draft with recurrent layers (`own_tree`)
    extra: dict[str, Any] = {"speculative_costs": COSTS}
    if "assistant" in path:
        extra.update(assistant=draft, num_assistant_tokens=rng.randint(1, 8))
        extra["num_assistant_tokens_schedule"] = rng.choice(["constant", "heuristic"])
    if "lookup" in path:
        extra.update(prompt_lookup_num_tokens=rng.randint(1, 6), max_matching_ngram_size=rng.randint(1, 3))
    if "tree" in path:
        from tests.tiny_models import tiny_model

        tree = hf_specdec.DynamicTree.at_most(rng.randint(2, 8), rng.randint(1, 4), rng.randint(1, 3))
        grower = draft if path.startswith("own") else tiny_model("llama", seed=1, num_layers=1)
        extra.update(assistant=grower, tree=tree)
    if path == "early_exit":
        extra.update(assistant_early_exit=1, num_assistant_tokens=rng.randint(1, 6))
    return model_type, inputs, extra


@pytest.mark.parametrize("seed", range(40))
def test_random_inputs_give_plain_greedy_tokens(seed: int) -> None:
    model_type, inputs, extra = _random_case(seed)
    target, _ = _models(model_type)
    plain = target.generate(**inputs, do_sample=False)
    try:
        out = target.generate(**inputs, do_sample=False, **extra)
    except ValueError as error:  # a cut whose config keeps per-layer lists of the whole model (Zamba2's)
        assert "assistant_early_exit" in str(error) and "assistant_early_exit" in extra, error
        return
    assert torch.equal(out, plain), (model_type, {k: v for k, v in extra.items() if k != "assistant"})


# The cache's bookkeeping ---------------------------------------------------------------------------------------


def _sequence(model_type: str, batch: int, capacity: int | None = None) -> Any:
    from hf_specdec.generation.kv_cache import CachedSequence
    from hf_specdec.trees.masks import chain_structure

    target, _ = _models(model_type)
    seq = CachedSequence(target, batch, torch.device("cpu"), capacity=capacity)
    prompt = torch.arange(4, 10).repeat(batch, 1)
    seq.forward(prompt, None, torch.arange(6).expand(batch, -1), chain_structure(6, "cpu"), logits_to_keep=1)
    return seq, target


def _feed(seq: Any, tokens: list[int], start: int) -> torch.Tensor:
    from hf_specdec.trees.masks import chain_structure

    batch = seq.valid.shape[0]
    ids = torch.tensor(tokens).repeat(batch, 1)
    positions = (start + torch.arange(len(tokens))).expand(batch, -1)
    return seq.forward(ids, None, positions, chain_structure(len(tokens), "cpu")).logits


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba", "jamba", "qwen3_5"])
def test_keeping_no_token_of_a_forward_gives_back_the_state_before_it(model_type: str) -> None:
    """Mamba's layers step the cache's own state in place during a forward: the state before it is kept first."""
    seq, _ = _sequence(model_type, 2)
    _feed(seq, [11, 12, 13], 6)
    seq.keep_prefix(3, torch.zeros(2, dtype=torch.long), 0)
    after = _feed(seq, [20], 6)
    fresh, _ = _sequence(model_type, 2)
    assert torch.allclose(after, _feed(fresh, [20], 6), atol=1e-5)


def test_a_static_cache_of_a_hybrid_grows_when_a_forward_needs_room() -> None:
    seq, _ = _sequence("qwen3_5", 2, capacity=8)
    _feed(seq, [11, 12, 13, 14], 6)  # 10 slots in a cache of 8
    assert seq.capacity >= 10 and seq.num_slots == 10


def test_recording_buffers_do_not_grow_with_the_batch_changing() -> None:
    """Rows leaving the batch, or a tree's paths as rows, change the batch at a step's start: the buffers are
    allocated anew at the size needed, never doubled for it."""
    seq, _ = _sequence("qwen3_5", 4)
    for step in range(12):
        if step % 2:
            seq.fork(3)
            _feed(seq, [11, 12, 13], 6)
            seq.join(torch.arange(4) * 3)
        else:
            _feed(seq, [11, 12, 13], 6)
        seq.keep_prefix(3, torch.ones(4, dtype=torch.long), 1, real_kept=[1] * 4)
    sizes = [buffer.shape[0] for layer in seq.recurrent.layers for buffer in layer.buffers.values()]
    assert sizes and max(sizes) <= 6
