"""Models and drafts at the edges of what they can take: position limits, length-dependent rotary frequencies,
drafts with broken scores or another shape. Each gives plain `generate()`'s result or a clear refusal."""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any

import pytest
import torch
from transformers import (
    AutoModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PreTrainedModel,
)

import hf_specdec
from hf_specdec.drafters.draft_model import draft_distribution
from hf_specdec.generation.positions import length_dependent_rope_limit, position_table_limit
from tests.tiny_models import BOS, EOS, PAD, VOCAB, ragged_batch, tiny_model

COSTS = hf_specdec.SpeculativeCosts(draft_forward=0.2, verify_per_token=0.02)


def _llama(seed: int, max_positions: int = 256, rope: dict[str, Any] | None = None) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=BOS,
        **({"rope_parameters": rope} if rope else {}),
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # peakier distributions: fewer ties, longer agreement with a draft
    return model


def _gpt2(seed: int, positions: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, n_positions=positions, eos_token_id=EOS, bos_token_id=BOS
    )
    return GPT2LMHeadModel(config).eval()


def _greedy(target: PreTrainedModel, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(plain, speculative) greedy sequences of `target` for the same call."""
    ids, mask = ragged_batch(2)
    call = {"input_ids": ids, "attention_mask": mask, "do_sample": False, "max_new_tokens": 40}
    plain = target.generate(**call)
    return plain, hf_specdec.speculative(target).generate(**call, speculative_costs=COSTS, **kwargs)


def test_learned_position_tables_are_found_and_rotary_models_have_none() -> None:
    assert position_table_limit(_gpt2(0, 48)) == 48
    opt = OPTForCausalLM(
        OPTConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            ffn_dim=32,
            num_attention_heads=2,
            max_position_embeddings=40,
            word_embed_proj_dim=16,
        )
    )
    assert position_table_limit(opt) == 40  # its table has two more rows: an offset
    assert position_table_limit(_llama(0)) is None


@pytest.mark.parametrize("drafting", ["chain", "tree", "hybrid"])
def test_a_draft_with_fewer_positions_than_the_text_drafts_up_to_them_then_steps_plainly(drafting: str) -> None:
    """A GPT-2-style draft of 24 positions drafts for a text that grows to 50 tokens: no index error, plain's tokens."""
    target, draft = _llama(0), _gpt2(1, positions=24)
    extra = {"chain": {}, "tree": {"tree": 6}, "hybrid": {"prompt_lookup_num_tokens": 4}}[drafting]
    plain, ours = _greedy(target, assistant=draft, return_dict_in_generate=True, **extra)
    assert torch.equal(ours.sequences, plain)


def test_a_draft_whose_positions_the_prompt_already_fills_never_drafts() -> None:
    plain, ours = _greedy(_llama(0), assistant=_gpt2(1, positions=8), return_dict_in_generate=True)
    assert torch.equal(ours.sequences, plain)
    assert int(ours.speculative.drafted_tokens.sum()) == 0


def test_a_target_with_learned_positions_refuses_a_length_past_its_table() -> None:
    target = hf_specdec.speculative(_gpt2(0, positions=30))
    ids, mask = ragged_batch(2)
    with pytest.raises(ValueError, match=r"max_length=50 .* 30 positions the target"):
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, prompt_lookup_num_tokens=3)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * 4,
            "long_factor": [3.0] * 4,
            "original_max_position_embeddings": 24,
        },
    ],
    ids=["dynamic", "longrope"],
)
def test_length_dependent_rope_matches_plain_within_its_original_length_and_is_refused_past_it(
    rope: dict[str, Any],
) -> None:
    max_positions = 24 if rope["rope_type"] == "dynamic" else 96
    target = _llama(0, max_positions=max_positions, rope=rope)
    assert length_dependent_rope_limit(target) == 24
    draft = _llama(1)
    ids, mask = ragged_batch(2)
    call = {"input_ids": ids, "attention_mask": mask, "do_sample": False}
    within = target.generate(**call, max_new_tokens=14)
    assert torch.equal(hf_specdec.speculative(target).generate(**call, max_new_tokens=14, assistant=draft), within)
    with pytest.raises(ValueError, match="rotary frequencies from the length of each forward"):
        hf_specdec.speculative(target).generate(**call, max_new_tokens=30, assistant=draft)


@pytest.mark.parametrize("rope_type", ["linear", "yarn"])
def test_rope_scalings_fixed_at_load_match_plain_past_the_original_length(rope_type: str) -> None:
    rope = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0}
    if rope_type == "yarn":
        rope["original_max_position_embeddings"] = 16
    target = _llama(0, max_positions=32, rope=rope)
    assert length_dependent_rope_limit(target) is None
    plain, ours = _greedy(target, assistant=_llama(1))
    assert torch.equal(ours, plain)


@pytest.mark.parametrize("path", ["assistant", "lookup", "tree"])
def test_right_padded_prompts_are_refused(path: str) -> None:
    target = hf_specdec.speculative(_llama(0))
    ids = torch.randint(4, VOCAB, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    extra = {
        "assistant": {"assistant": _llama(1)},
        "lookup": {"prompt_lookup_num_tokens": 3},
        "tree": {"assistant": _llama(1), "tree": 4},
    }[path]
    with pytest.raises(ValueError, match=r"Row\(s\) \[1\] of `attention_mask` end with padding"):
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, **extra)


def test_prompt_lookup_asking_far_more_tokens_than_remain_is_bounded_by_what_remains() -> None:
    """Transformers runs `prompt_lookup_num_tokens=10**9`; so does the library, without a buffer of that size."""
    plain, ours = _greedy(_llama(0), prompt_lookup_num_tokens=10**9, max_matching_ngram_size=10**9)
    assert torch.equal(ours, plain)
    target, draft = _llama(0), _llama(1)
    plain, ours = _greedy(target, assistant=draft, num_assistant_tokens=10**9, num_assistant_tokens_schedule="constant")
    assert torch.equal(ours, plain)


def test_a_draft_with_non_finite_scores_samples_and_keeps_generating() -> None:
    target, draft = hf_specdec.speculative(_llama(0)), _llama(1)

    def poison(module: torch.nn.Module, inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[..., 5] = float("nan")
        logits[0, ..., :] = float("nan")  # the first row has no finite score at all
        return logits

    draft.lm_head.register_forward_hook(poison)
    ids, mask = ragged_batch(2)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=16, assistant=draft)
    assert out.shape == (2, ids.shape[1] + 16)


def test_draft_distribution_is_a_distribution_whatever_the_scores() -> None:
    scores = torch.tensor(
        [
            [0.0, 1.0, float("nan"), 2.0],  # a nan is never drawn
            [float("nan")] * 4,  # nothing finite: the best-scored token with certainty
            [float("-inf")] * 4,
            [0.0, float("inf"), 1.0, float("-inf")],  # +inf: that token with certainty
        ]
    )
    q = draft_distribution(scores)
    assert torch.isfinite(q).all() and torch.allclose(q.sum(dim=-1), torch.ones(4))
    assert q[0, 2] == 0 and q[0, 3] > q[0, 1] > q[0, 0] > 0
    assert q[3, 1] == 1


def test_an_assistant_without_a_language_model_head_is_a_type_error() -> None:
    target = hf_specdec.speculative(_llama(0))
    ids, _ = ragged_batch(1)
    with pytest.raises(TypeError, match="no language-model head"):
        target.generate(input_ids=ids, assistant=AutoModel.from_config(_llama(1).config), max_new_tokens=3)
    with pytest.raises(TypeError, match="takes a transformers causal LM"):
        target.generate(input_ids=ids, assistant="Qwen/Qwen2.5-0.5B", max_new_tokens=3)


def test_a_lora_draft_drafts_with_its_adapter() -> None:
    peft = pytest.importorskip("peft")
    draft = peft.get_peft_model(_llama(1), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    plain, ours = _greedy(_llama(0), assistant=draft)
    assert torch.equal(ours, plain)


def test_a_speculative_model_pickles_saves_and_copies_as_itself() -> None:
    target = hf_specdec.speculative(tiny_model("llama", seed=0))
    ids, mask = ragged_batch(2)
    call = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 6, "prompt_lookup_num_tokens": 3}
    expected = target.generate(**call)
    buffer = io.BytesIO()
    torch.save(target, buffer)
    buffer.seek(0)
    for copied in (pickle.loads(pickle.dumps(target)), torch.load(buffer, weights_only=False), copy.deepcopy(target)):
        assert isinstance(copied, hf_specdec.SpeculativeGenerationMixin)
        assert type(copied).__name__ == "LlamaForCausalLM"
        assert torch.equal(copied.generate(**call), expected)


def test_settings_transformers_applies_and_the_loop_does_not_are_refused() -> None:
    target = hf_specdec.speculative(_llama(0))
    ids, _ = ragged_batch(1)
    with pytest.raises(ValueError, match=r"target_lookbehind=5"):
        target.generate(input_ids=ids, assistant=_llama(1), target_lookbehind=5, max_new_tokens=3)


def test_inputs_embeds_without_ids_is_refused_for_what_it_is() -> None:
    target = hf_specdec.speculative(_llama(0))
    with pytest.raises(ValueError, match="`inputs_embeds=` cannot be passed with prompt lookup: drafts are token ids"):
        target.generate(inputs_embeds=torch.randn(1, 5, 32), prompt_lookup_num_tokens=3, max_new_tokens=3)


def _config_model(config_name: str, model_name: str, **config: Any) -> PreTrainedModel:
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, **config
    )
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def test_a_draft_with_a_table_of_rotary_angles_drafts_up_to_it() -> None:
    """GPT-J precomputes its rotary angles for `n_positions` positions: a buffer, not an embedding."""
    draft = _config_model("GPTJConfig", "GPTJForCausalLM", n_embd=32, n_layer=1, n_head=4, rotary_dim=8, n_positions=16)
    assert position_table_limit(draft) == 16
    plain, ours = _greedy(_llama(0), assistant=draft)
    assert torch.equal(ours, plain)


def test_models_that_mask_by_cache_slot_or_a_one_token_window_are_refused() -> None:
    neo = _config_model(
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
        max_position_embeddings=128,
    )
    ids, mask = ragged_batch(2)
    with pytest.raises(ValueError, match="causal table of 128 x 128 sliced by the length of its cache"):
        hf_specdec.speculative(neo).generate(input_ids=ids, attention_mask=mask, prompt_lookup_num_tokens=3)
    window = _config_model(
        "MistralConfig",
        "MistralForCausalLM",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=1,
    )
    with pytest.raises(ValueError, match="sliding window of 1 token"):
        hf_specdec.speculative(window).generate(input_ids=ids, attention_mask=mask, prompt_lookup_num_tokens=3)


def test_heads_refuse_a_base_that_projects_its_state_before_the_lm_head() -> None:
    opt = _config_model(
        "OPTConfig",
        "OPTForCausalLM",
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=64,
        word_embed_proj_dim=16,
    )
    with pytest.raises(ValueError, match="lm_head reads vectors of size 16, but its last hidden state has size 32"):
        hf_specdec.MedusaForCausalLM.from_base(opt, hf_specdec.MedusaConfig(num_heads=2))


@pytest.mark.parametrize("arch", ["smollm3", "gemma2-eager"])
def test_eagle_heads_on_bases_with_per_layer_settings_or_eager_attention_keep_plain_greedy(arch: str) -> None:
    common = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4}
    if arch == "smollm3":  # `no_rope_layers` lists one entry per layer of the base; the heads have two layers
        base = _config_model("SmolLM3Config", "SmolLM3ForCausalLM", num_key_value_heads=2, **common)
    else:  # transformers runs Gemma 2 with eager attention only
        base = _config_model(
            "Gemma2Config",
            "Gemma2ForCausalLM",
            num_key_value_heads=1,
            head_dim=8,
            attn_implementation="eager",
            **common,
        )
    heads = hf_specdec.MedusaForCausalLM.from_base(
        base, hf_specdec.MedusaConfig(num_heads=2, head_type="eagle", num_layers=2)
    )
    ids, mask = ragged_batch(2)
    call = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 12, "do_sample": False}
    assert torch.equal(heads.generate(**call, medusa=True, speculative_costs=COSTS), base.generate(**call))


def test_a_model_whose_forward_takes_no_cache_is_refused_before_any_forward() -> None:
    gpt = _config_model("OpenAIGPTConfig", "OpenAIGPTLMHeadModel", n_embd=32, n_layer=1, n_head=4, n_positions=64)
    ids, mask = ragged_batch(2)
    forwards = []
    gpt.register_forward_pre_hook(lambda *args: forwards.append(1))
    with pytest.raises(ValueError, match=r"The target \(OpenAIGPTLMHeadModel\) keeps no KV cache"):
        hf_specdec.speculative(gpt).generate(input_ids=ids, attention_mask=mask, prompt_lookup_num_tokens=3)
    assert not forwards
