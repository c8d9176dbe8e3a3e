"""The bad-input table: every input the speculative paths refuse, as data.

Each `Case` says in a user's words what the user does, which speculative paths it applies to, and how to make
that call on a path, on tiny seeded float32 models. `tools/refusal_table.py` runs every case on every path it
applies to and writes what each raised to docs/refusals.md; `tests/test_refusal_table.py` checks that every call
is refused with a `ValueError` or `TypeError` before any model forward, and that the page is current.
`tests/test_refusals.py` checks what goes beyond a message (refused exactly as plain `generate()` refuses; what
is not refused).

The paths (`PATHS`):

- `assistant`: `speculative(model).generate(..., assistant=draft)`;
- `tree`: `speculative(model).generate(..., assistant=draft, tree=4)`, the draft model growing a tree;
- `lookup`: `speculative(model).generate(..., prompt_lookup_num_tokens=3)`;
- `hybrid`: `speculative(model).generate(..., assistant=draft, prompt_lookup_num_tokens=3)`;
- `medusa`: `MedusaForCausalLM.generate(..., medusa=True)`, the heads' default static tree;
- `medusa-dynamic`: `MedusaForCausalLM.generate(..., medusa=True, tree=DynamicTree(num_nodes=3))`;
- `medusa-lookup`: `MedusaForCausalLM.generate(..., medusa=True, prompt_lookup_num_tokens=3)`;
- `mtp` (for the cases of a model's own multi-token-prediction layers alone): `speculative(model).generate(...,
  use_mtp=True)`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    RwkvConfig,
    RwkvForCausalLM,
    SynthIDTextWatermarkingConfig,
    T5Config,
    T5ForConditionalGeneration,
)

import hf_specdec
from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM
from tests.recurrent_models import recurrent_model
from tests.tiny_models import BOS, EOS, PAD, VOCAB, ragged_batch, tiny_model, tiny_target

PATHS = ("assistant", "tree", "lookup", "hybrid", "medusa", "medusa-dynamic", "medusa-lookup")
TABLE_PATHS = (*PATHS, "mtp")  # "all" stands for `PATHS`; `mtp` rows are a model's own MTP layers drafting
DRAFT_PATHS = ("assistant", "tree", "hybrid")  # with a draft model
SPECULATIVE_PATHS = ("assistant", "tree", "lookup", "hybrid")  # `speculative(model).generate(...)`
MEDUSA_PATHS = ("medusa", "medusa-dynamic", "medusa-lookup")
LOOKUP_PATHS = ("lookup", "hybrid", "medusa-lookup")  # with prompt lookup

# How each path's messages name it ("... cannot be combined with `assistant=`").
PATH_NAMES = {
    "assistant": "`assistant=`",
    "tree": "`assistant=`",
    "lookup": "prompt lookup",
    "hybrid": "`assistant=`",
    "medusa": "`medusa=True`",
    "medusa-dynamic": "`medusa=True`",
    "medusa-lookup": "`medusa=True`",
    "mtp": "`use_mtp=True`",
}

Generate = Callable[..., Any]


def speculative_generate(path: str, target: PreTrainedModel, draft: Any = None) -> Generate:
    """`generate` on `path`: `target` with speculative generate() and `draft` for the draft-model paths; for
    the Medusa paths, fresh heads on `target`. The call's keyword arguments override the path's own."""
    if path in MEDUSA_PATHS:
        medusa = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=2))
        heads: dict[str, Any] = {
            "medusa": {"medusa": True},
            "medusa-dynamic": {"medusa": True, "tree": DynamicTree(num_nodes=3)},
            "medusa-lookup": {"medusa": True, "prompt_lookup_num_tokens": 3},
        }[path]
        return lambda *args, **kwargs: medusa.generate(*args, **{**heads, **kwargs})
    target = hf_specdec.speculative(target)
    extra: dict[str, Any] = {
        "assistant": {"assistant": draft},
        "tree": {"assistant": draft, "tree": 4},
        "lookup": {"prompt_lookup_num_tokens": 3},
        "hybrid": {"assistant": draft, "prompt_lookup_num_tokens": 3},
    }[path]
    return lambda *args, **kwargs: target.generate(*args, **{**extra, **kwargs})


def prompts(**kwargs: Any) -> dict[str, Any]:
    """Two left-padded prompts of different lengths, greedy, 4 new tokens; `kwargs` add or override."""
    ids, mask = ragged_batch(2)
    return {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 4, "do_sample": False, **kwargs}


class Models:
    """The tiny seeded models the cases run on, each built once: a Llama target, a one-layer Llama draft, the
    `generate` of every path on them, and the other models some cases need (`shared`)."""

    def __init__(self) -> None:
        self.target = tiny_target("llama")
        self.draft = one_layer_llama()
        self._generate: dict[str, Generate] = {}
        self._shared: dict[Callable[[], PreTrainedModel], PreTrainedModel] = {}

    def generate(self, path: str) -> Generate:
        """`generate` on `path` for the target and the draft."""
        if path not in self._generate:
            self._generate[path] = speculative_generate(path, self.target, self.draft)
        return self._generate[path]

    def shared(self, build: Callable[[], PreTrainedModel]) -> PreTrainedModel:
        """`build()`, built once (a refused call leaves its models as they were)."""
        if build not in self._shared:
            self._shared[build] = build()
        return self._shared[build]


# Models that cannot take part, and models at the edge of what can -----------------------------------------------


def t5() -> PreTrainedModel:
    """A tiny encoder-decoder."""
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, decoder_start_token_id=PAD
    )
    return T5ForConditionalGeneration(config).eval()


_SPECIAL = {"pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": BOS}


def rwkv() -> PreTrainedModel:
    """A tiny RWKV model (a recurrent state)."""
    torch.manual_seed(0)
    config = RwkvConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, **_SPECIAL)
    return RwkvForCausalLM(config).eval()


def bloom() -> PreTrainedModel:
    """A tiny model with ALiBi positions (biases tied to cache slots)."""
    torch.manual_seed(0)
    config = BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=2, **_SPECIAL)
    return BloomForCausalLM(config).eval()


def short_gpt2() -> PreTrainedModel:
    """A tiny GPT-2 with a learned table of 16 positions."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=16, **_SPECIAL)
    return GPT2LMHeadModel(config).eval()


def gpt_neo() -> PreTrainedModel:
    """A tiny GPT-Neo: a causal-mask table sliced by cache length, and local attention by cache slot."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPTNeoConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
        max_position_embeddings=64,
        **_SPECIAL,
    )
    return transformers.GPTNeoForCausalLM(config).eval()


def one_token_window() -> PreTrainedModel:
    """A tiny Mistral whose sliding window is a single token."""
    import transformers

    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=1,
        **_SPECIAL,
    )
    return transformers.MistralForCausalLM(config).eval()


def mistral() -> PreTrainedModel:
    """A tiny model with sliding-window attention."""
    return tiny_model("mistral", seed=0)


def gpt2() -> PreTrainedModel:
    """A tiny GPT-2 (learned positions; its forward takes `token_type_ids`)."""
    return tiny_model("gpt2", seed=0)


def one_layer_llama() -> PreTrainedModel:
    return tiny_model("llama", seed=1, num_layers=1)


def one_layer_gpt2() -> PreTrainedModel:
    return tiny_model("gpt2", seed=1, num_layers=1)


def one_layer_mistral() -> PreTrainedModel:
    return tiny_model("mistral", seed=1, num_layers=1)


# The draft of a target of another architecture than Llama, by the target's class name.
_DRAFTS = {"GPT2LMHeadModel": one_layer_gpt2, "MistralForCausalLM": one_layer_mistral}


def softcapped_draft() -> PreTrainedModel:
    """A draft that rescales its logits after its lm_head (Gemma 2's final soft-capping)."""
    torch.manual_seed(1)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        final_logit_softcapping=30.0,
        **_SPECIAL,
    )
    return Gemma2ForCausalLM(config).eval()


def int8_draft() -> PreTrainedModel:
    """The usual draft with its linear layers in int8 (torch's dynamic quantisation), its lm_head included."""
    return torch.ao.quantization.quantize_dynamic(one_layer_llama(), {torch.nn.Linear}, dtype=torch.qint8)


def wider_draft() -> PreTrainedModel:
    """The usual draft, scoring 4 more tokens."""
    return llama_like(one_layer_llama(), vocab_size=VOCAB + 4)


def other_bos_draft() -> PreTrainedModel:
    """The usual draft with another BOS id."""
    return llama_like(one_layer_llama(), bos_token_id=4)


def llama_like(model: PreTrainedModel, **changes: Any) -> PreTrainedModel:
    """A seeded Llama of `model`'s config with `changes`."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**model.config.to_dict(), **changes})).eval()


def _rope(rope_parameters: dict[str, Any]) -> Callable[[], PreTrainedModel]:
    """A tiny Llama of 16 positions whose rotary frequencies follow `rope_parameters`."""
    return lambda: llama_like(tiny_model("llama", seed=0), max_position_embeddings=16, rope_parameters=rope_parameters)


def _flex_attention() -> PreTrainedModel:
    model = tiny_model("llama", seed=0)
    model.set_attn_implementation("flex_attention")
    return model


def word_tokenizer(prefix: str, size: int = VOCAB) -> PreTrainedTokenizerBase:
    """A word-level tokenizer of `size` words `prefix0`, `prefix1`, ...: two prefixes, two vocabularies."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"{prefix}{i}": i for i in range(size)}, unk_token=f"{prefix}0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


# The calls --------------------------------------------------------------------------------------------------------

Call = Callable[[Models, str], Any]


def _call(**kwargs: Any) -> Call:
    """The usual call on the path, with `kwargs`."""
    return lambda models, path: models.generate(path)(**prompts(**kwargs))


def _with_a_cache(models: Models, path: str) -> Any:
    """The usual call (two prompts) with a cache of one row to continue from (made per call: a cache kept alive
    would outlive the tests)."""
    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8), 0)
    return models.generate(path)(**prompts(cache=cache))


def _edited(edit: Callable[[torch.Tensor, torch.Tensor], None]) -> Call:
    """The usual call on three ragged prompts after `edit(input_ids, attention_mask)` changed them in place."""

    def call(models: Models, path: str) -> Any:
        ids, mask = ragged_batch(3)
        edit(ids, mask)
        return models.generate(path)(**prompts(input_ids=ids, attention_mask=mask))

    return call


def _token(row: int, column: int, token: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def edit(ids: torch.Tensor, mask: torch.Tensor) -> None:
        ids[row, column] = token

    return edit


def _all_padding(ids: torch.Tensor, mask: torch.Tensor) -> None:
    mask[1] = 0


def _right_padding(ids: torch.Tensor, mask: torch.Tensor) -> None:
    mask[0, -2:] = 0
    ids[0, -2:] = PAD


def _target(build: Callable[[], PreTrainedModel], **kwargs: Any) -> Call:
    """The usual call with `kwargs`, with `build()` as the target (on the Medusa paths, the heads' base), drafted
    by a one-layer model of its architecture (GPT-2, Mistral; Llama for the others)."""

    def call(models: Models, path: str) -> Any:
        target = models.shared(build)
        draft = models.shared(_DRAFTS.get(type(target).__name__, one_layer_llama))
        return speculative_generate(path, target, draft)(**prompts(**kwargs))

    return call


def _draft(build: Callable[[Models], Any], **kwargs: Any) -> Call:
    """The usual call with `kwargs`, with `build(models)` as the draft."""
    return lambda models, path: speculative_generate(path, models.target, build(models))(**prompts(**kwargs))


def _meta_draft(models: Models) -> PreTrainedModel:
    return copy.deepcopy(models.draft).to("meta")


def _prefix_tuned_draft(models: Models) -> Any:
    from peft import PrefixTuningConfig, get_peft_model

    return get_peft_model(copy.deepcopy(models.draft), PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))


def _positional(models: Models, path: str) -> Any:
    ids, mask = ragged_batch(2)
    return models.generate(path)(ids, GenerationConfig(max_new_tokens=4), None, attention_mask=mask)


def _inputs_embeds(models: Models, path: str) -> Any:
    embeds = models.target.get_input_embeddings()(ragged_batch(2)[0]).detach()
    return models.generate(path)(inputs_embeds=embeds, attention_mask=ragged_batch(2)[1], max_new_tokens=4)


def gemma3n() -> PreTrainedModel:
    """A tiny Gemma-3n (two AltUp streams in its hidden states)."""
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    torch.manual_seed(0)
    config = Gemma3nTextConfig(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=64, hidden_size_per_layer_input=8,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        layer_types=["sliding_attention", "full_attention"], sliding_window=16, num_kv_shared_layers=0,
        laurel_rank=4, altup_num_inputs=2, activation_sparsity_pattern=[0.0, 0.0], **_SPECIAL,
    )  # fmt: skip
    return Gemma3nForCausalLM(config).eval()


def _heads_on_gemma3n(models: Models, path: str) -> Any:
    return MedusaForCausalLM.from_base(models.shared(gemma3n), MedusaConfig(num_heads=2))


def _heads_for_another_base(models: Models, path: str) -> Any:
    narrower = llama_like(models.target, hidden_size=32)
    return MedusaForCausalLM(narrower, MedusaConfig(num_heads=2, hidden_size=64, vocab_size=VOCAB))


def _scaling_draft(family: str, **scaling: float) -> Callable[[], PreTrainedModel]:
    """A builder of a one-layer draft of `family` ("Cohere", "Granite") that scales its logits after its lm_head
    (`scaling`: the config field that does it: Cohere's `logit_scale`, Granite's `logits_scaling`)."""

    def build() -> PreTrainedModel:
        import transformers

        torch.manual_seed(1)
        config = getattr(transformers, f"{family}Config")(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, **scaling, **_SPECIAL,
        )  # fmt: skip
        return getattr(transformers, f"{family}ForCausalLM")(config).eval()

    return build


scaled_draft = _scaling_draft("Cohere", logit_scale=0.5)
granite_scaled_draft = _scaling_draft("Granite", logits_scaling=4.0)


# Models with recurrent layers (`tests.recurrent_models`), one builder object each so that `Models.shared` builds
# each once: Zamba's per-token states are not recorded; Jamba derives its layer types; Zamba2 cannot be cut into a
# decoder of attention layers; Mamba has no attention; the Qwen3.5 draft has another seed.
zamba = functools.partial(recurrent_model, "zamba", 0)
_jamba = functools.partial(recurrent_model, "jamba", 0)
_zamba2 = functools.partial(recurrent_model, "zamba2", 0)
_mamba = functools.partial(recurrent_model, "mamba", 0)
_qwen3_5_draft = functools.partial(recurrent_model, "qwen3_5", 1)


def gpt1() -> PreTrainedModel:
    """A tiny GPT-1 (`OpenAIGPTLMHeadModel`), whose forward takes no cache."""
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    torch.manual_seed(0)
    config = OpenAIGPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    return OpenAIGPTLMHeadModel(config).eval()


def _recurrent_draft_of_other_tokenizer(models: Models, path: str) -> Any:
    draft = models.shared(_qwen3_5_draft)
    generate = speculative_generate(path, models.target, draft)
    return generate(**prompts(tokenizer=word_tokenizer("a"), assistant_tokenizer=word_tokenizer("b")))


def _heads_of(
    head_type: str, base: Callable[[], PreTrainedModel], config: dict[str, Any] | None = None, **kwargs: Any
) -> Call:
    """The usual call on a Medusa path with fresh heads of `head_type` (and `config`'s `MedusaConfig` fields) on
    `base()` (their `from_base` may refuse)."""

    def call(models: Models, path: str) -> Any:
        settings = MedusaConfig(num_heads=2, head_type=head_type, **(config or {}))
        heads = MedusaForCausalLM.from_base(models.shared(base), settings)
        extra = {"medusa-dynamic": {"tree": DynamicTree(num_nodes=3)}, "medusa-lookup": {"prompt_lookup_num_tokens": 3}}
        return heads.generate(**prompts(medusa=True, **{**extra.get(path, {}), **kwargs}))

    return call


def _llama_target() -> PreTrainedModel:
    return tiny_target("llama")


def _opt_projected() -> PreTrainedModel:
    """A tiny OPT whose lm_head reads a projection of the last hidden state (`word_embed_proj_dim`)."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(
        vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=2,
        word_embed_proj_dim=16, max_position_embeddings=64, **_SPECIAL,
    )  # fmt: skip
    return OPTForCausalLM(config).eval()


def _too_many_nodes(models: Models, path: str) -> Any:
    return models.generate(path)(**prompts(tree=DynamicTree(num_nodes=9, depth=1, top_k=2)))


def _mtp(architecture: str = "deepseek_v3", layers: int = 1, overrides: dict | None = None, **kwargs: Any) -> Call:
    """`speculative(model).generate(..., use_mtp=True)` on a tiny model of `architecture` (`overrides`: config
    fields) with `layers` MTP layers, with `kwargs`."""

    def build() -> PreTrainedModel:
        from tests.tiny_mtp import tiny_mtp_model

        return tiny_mtp_model(architecture, layers, VOCAB, **(overrides or {}))

    def call(models: Models, path: str) -> Any:
        model = hf_specdec.speculative(models.shared(build))
        return model.generate(**prompts(use_mtp=True, **kwargs))

    return call


@dataclass(frozen=True)
class Case:
    """One bad input.

    Attributes:
        id: a short name, unique (test ids).
        topic: the heading it is listed under (one of `TOPICS`).
        what: what the user does, in the user's words.
        paths: the paths (of `PATHS`) it applies to.
        call: makes the call on a path, with the models given.
    """

    id: str
    topic: str
    what: str
    paths: tuple[str, ...]
    call: Call


PROMPTS = "The prompts"
LENGTHS = "Lengths and positions"
SETTINGS = "Generation settings"
ARGUMENTS = "Speculative arguments"
HEADS = "Medusa heads' arguments"
MODELS = "The models"
TOPICS = (PROMPTS, LENGTHS, SETTINGS, ARGUMENTS, HEADS, MODELS)

_EMPTY = torch.zeros(1, 0, dtype=torch.long)
_LARGE_TOKENIZER = word_tokenizer("a", VOCAB + 8)
_IDS, _MASK = ragged_batch(2)
_HOLE = _MASK.clone()
_HOLE[0, 5] = 0  # row 0: padding inside its prompt
_LONGROPE = {"rope_type": "longrope", "original_max_position_embeddings": 8, "short_factor": [1.0] * 8,
             "long_factor": [2.0] * 8}  # fmt: skip

# fmt: off
CASES: tuple[Case, ...] = (
    # The prompts ------------------------------------------------------------------------------------------------
    Case("empty-prompt", PROMPTS, "a prompt of no tokens (`input_ids` of shape (1, 0))", PATHS,
         lambda models, path: models.generate(path)(input_ids=_EMPTY, max_new_tokens=4)),
    Case("all-padding", PROMPTS, "a prompt row that is all padding (its `attention_mask` row all zeros)", PATHS,
         _edited(_all_padding)),
    Case("right-padding", PROMPTS, "prompts padded on the right", PATHS, _edited(_right_padding)),
    Case("sliding-window-hole", PROMPTS, "padding inside a prompt, on a model with sliding-window attention", PATHS,
         _target(mistral, attention_mask=_HOLE)),
    Case("id-past-vocabulary", PROMPTS, "a token id one past the vocabulary", PATHS, _edited(_token(1, 7, VOCAB))),
    Case("id-far-past-vocabulary", PROMPTS, "a token id far past the vocabulary", PATHS,
         _edited(_token(1, 7, VOCAB + 1000))),
    Case("negative-id", PROMPTS, "a negative token id", PATHS, _edited(_token(1, 7, -1))),
    Case("negative-id-under-padding", PROMPTS, "a label-style filler (-100) under the padding", PATHS,
         _edited(_token(1, 0, -100))),
    Case("float-ids", PROMPTS, "`input_ids` of floats", PATHS, _call(input_ids=_IDS.float())),
    Case("bool-ids", PROMPTS, "`input_ids` of booleans", PATHS, _call(input_ids=_IDS.bool())),
    Case("ids-as-list", PROMPTS, "`input_ids` as a Python list", PATHS, _call(input_ids=_IDS.tolist())),
    Case("one-dimensional-ids", PROMPTS, "one prompt as a 1-D tensor (no batch dimension)", PATHS,
         _call(input_ids=_IDS[0], attention_mask=None)),
    Case("mask-shorter", PROMPTS, "an `attention_mask` shorter than the prompts", PATHS,
         _call(attention_mask=_MASK[:, 1:])),
    Case("mask-fewer-rows", PROMPTS, "an `attention_mask` with fewer rows than the prompts", PATHS,
         _call(attention_mask=_MASK[1:])),
    Case("mask-as-list", PROMPTS, "an `attention_mask` as a Python list", PATHS,
         _call(attention_mask=_MASK.tolist())),
    Case("inputs-embeds", PROMPTS, "prompts as `inputs_embeds` instead of token ids", PATHS, _inputs_embeds),
    Case("token-type-ids", PROMPTS, "`token_type_ids` with the prompts (GPT-2)", PATHS,
         _target(gpt2, token_type_ids=torch.zeros_like(_IDS))),
    # Lengths and positions --------------------------------------------------------------------------------------
    Case("no-new-tokens", LENGTHS, "`max_new_tokens=0`", PATHS, _call(max_new_tokens=0)),
    Case("dynamic-rope", LENGTHS, "a length past the original context of a target with 'dynamic' rope scaling", PATHS,
         _target(_rope({"rope_type": "dynamic", "factor": 2.0}), max_new_tokens=12)),
    Case("longrope", LENGTHS, "a length past the original context of a target with 'longrope' scaling", PATHS,
         _target(_rope(_LONGROPE), max_new_tokens=4)),
    Case("learned-positions", LENGTHS, "a length past the learned position table of the target (GPT-2)", PATHS,
         _target(short_gpt2, max_new_tokens=12)),
    # Generation settings ----------------------------------------------------------------------------------------
    Case("beam-search", SETTINGS, "beam search (`num_beams=2`)", PATHS, _call(num_beams=2)),
    Case("contrastive-search", SETTINGS, "contrastive search (`penalty_alpha=0.6, top_k=4`)", PATHS,
         _call(penalty_alpha=0.6, top_k=4)),
    Case("dola", SETTINGS, "DoLa decoding (`dola_layers='high'`)", PATHS, _call(dola_layers="high")),
    Case("guidance", SETTINGS, "classifier-free guidance (`guidance_scale=2.0`)", PATHS, _call(guidance_scale=2.0)),
    Case("negative-prompt", SETTINGS, "a negative prompt (`negative_prompt_ids=`)", SPECULATIVE_PATHS,
         _call(negative_prompt_ids=_IDS[:, :3])),
    Case("ensemble-weight", SETTINGS, "`assistant_ensemble_weight=0.5`", PATHS, _call(assistant_ensemble_weight=0.5)),
    Case("target-lookbehind", SETTINGS, "`target_lookbehind=5`", PATHS, _call(target_lookbehind=5)),
    Case("assistant-lookbehind", SETTINGS, "`assistant_lookbehind=5`", PATHS, _call(assistant_lookbehind=5)),
    Case("early-exit", SETTINGS, "`assistant_early_exit=1` beside a draft model or heads",
         DRAFT_PATHS + MEDUSA_PATHS, _call(assistant_early_exit=1)),
    Case("early-exit-too-deep", SETTINGS, "an `assistant_early_exit` of as many layers as the target has",
         ("lookup",), _call(assistant_early_exit=2)),
    Case("prefill-chunks", SETTINGS, "`prefill_chunk_size=4`", PATHS, _call(prefill_chunk_size=4)),
    Case("low-memory", SETTINGS, "`low_memory=True`", PATHS, _call(low_memory=True)),
    Case("no-cache", SETTINGS, "`use_cache=False`", PATHS, _call(use_cache=False)),
    Case("offloaded-cache", SETTINGS, "`cache_implementation='offloaded'`", PATHS,
         _call(cache_implementation="offloaded")),
    Case("a-cache", SETTINGS, "a cache to continue from (`cache=`) of another batch size", PATHS,
         _with_a_cache),
    Case("output-attentions", SETTINGS, "`output_attentions=True`", PATHS,
         _call(output_attentions=True, return_dict_in_generate=True)),
    Case("output-hidden-states", SETTINGS, "`output_hidden_states=True`", PATHS,
         _call(output_hidden_states=True, return_dict_in_generate=True)),
    Case("watermark", SETTINGS, "SynthID text watermarking (`watermarking_config=`)", PATHS,
         _call(watermarking_config=SynthIDTextWatermarkingConfig(keys=[1, 2, 3], ngram_len=2), do_sample=True)),
    Case("stop-strings", SETTINGS, "`stop_strings` without `tokenizer=`", PATHS, _call(stop_strings=["a"])),
    Case("synced-gpus", SETTINGS, "`synced_gpus=True`", PATHS, _call(synced_gpus=True)),
    Case("custom-generate", SETTINGS, "a decoding loop of one's own (`custom_generate=`)", PATHS,
         _call(custom_generate=lambda *args, **kwargs: None)),
    Case("positional-arguments", SETTINGS, "`generate()`'s arguments after the generation config by position", PATHS,
         _positional),
    Case("generation-config-dict", SETTINGS, "a `generation_config` that is a dict", PATHS,
         _call(generation_config={"max_new_tokens": 4})),
    Case("streamer-object", SETTINGS, "a `streamer` without `put` and `end`", PATHS, _call(streamer=object())),
    # Speculative arguments --------------------------------------------------------------------------------------
    Case("assistant-name", ARGUMENTS, "a model name as `assistant=`", DRAFT_PATHS,
         _draft(lambda models: "HuggingFaceTB/SmolLM2-135M")),
    Case("assistant-without-head", ARGUMENTS, "a draft without its language-model head (`AutoModel`)", DRAFT_PATHS,
         _draft(lambda models: models.draft.model)),
    Case("assistant-model", ARGUMENTS, "`assistant_model=` beside `assistant=`, or with heads",
         DRAFT_PATHS + MEDUSA_PATHS,
         lambda models, path: models.generate(path)(**prompts(assistant_model=models.draft))),
    Case("assistant-with-medusa", ARGUMENTS, "a draft model (`assistant=`) with `medusa=True`", MEDUSA_PATHS,
         lambda models, path: models.generate(path)(**prompts(assistant=models.draft))),
    Case("assistant-vocab-alone", ARGUMENTS, "`assistant_vocab=` without `assistant=`", ("lookup",),
         _call(assistant_vocab=[0, 1, 2, 3])),
    Case("assistant-vocab-outside", ARGUMENTS, "an `assistant_vocab` with an id past the vocabulary", DRAFT_PATHS,
         _call(assistant_vocab=[0, 1, VOCAB])),
    Case("assistant-vocab-repeated", ARGUMENTS, "an `assistant_vocab` that repeats an id", DRAFT_PATHS,
         _call(assistant_vocab=[0, 1, 1])),
    Case("int8-draft-vocab", ARGUMENTS, "`assistant_vocab=` with an int8 draft (torch's dynamic quantisation)",
         DRAFT_PATHS, _draft(lambda models: models.shared(int8_draft), assistant_vocab=list(range(48)))),
    Case("softcapped-draft-vocab", ARGUMENTS, "`assistant_vocab=` with a draft that soft-caps its logits (Gemma 2)",
         DRAFT_PATHS, _draft(lambda models: models.shared(softcapped_draft), assistant_vocab=list(range(48)))),
    Case("scaled-draft-vocab", ARGUMENTS, "`assistant_vocab=` with a draft that scales its logits (Cohere)",
         DRAFT_PATHS, _draft(lambda models: models.shared(scaled_draft), assistant_vocab=list(range(48)))),
    Case("granite-scaled-draft-vocab", ARGUMENTS,
         "`assistant_vocab=` with a draft that divides its logits (Granite's `logits_scaling`)", DRAFT_PATHS,
         _draft(lambda models: models.shared(granite_scaled_draft), assistant_vocab=list(range(48)))),
    Case("tree-without-assistant", ARGUMENTS, "`tree=` without `assistant=`", ("lookup",), _call(tree=4)),
    Case("tree-name", ARGUMENTS, "a preset name as a draft model's `tree=`", ("tree",), _call(tree="medium")),
    Case("tree-of-no-nodes", ARGUMENTS, "a draft model's `tree=0`", ("tree",), _call(tree=0)),
    Case("dynamic-tree-too-many-nodes", ARGUMENTS, "a `DynamicTree` of more nodes than its depth and `top_k` grow",
         ("tree", *MEDUSA_PATHS), _too_many_nodes),
    Case("num-tokens-with-tree", ARGUMENTS, "`num_assistant_tokens` with `tree=`", ("tree",),
         _call(num_assistant_tokens=4)),
    Case("heuristic-with-tree", ARGUMENTS, "`num_assistant_tokens_schedule='heuristic'` with `tree=`", ("tree",),
         _call(num_assistant_tokens_schedule="heuristic")),
    Case("num-tokens-without-draft", ARGUMENTS, "`num_assistant_tokens` without a draft model",
         ("lookup", *MEDUSA_PATHS), _call(num_assistant_tokens=4)),
    Case("zero-num-tokens", ARGUMENTS, "`num_assistant_tokens=0`", ("assistant", "hybrid"),
         _call(num_assistant_tokens=0)),
    Case("negative-num-tokens", ARGUMENTS, "`num_assistant_tokens=-1`", ("assistant", "hybrid"),
         _call(num_assistant_tokens=-1)),
    Case("bool-num-tokens", ARGUMENTS, "`num_assistant_tokens=True`", ("assistant", "hybrid"),
         _call(num_assistant_tokens=True)),
    Case("unknown-schedule", ARGUMENTS, "an unknown `num_assistant_tokens_schedule`",
         ("assistant", "tree", "lookup", "hybrid", *MEDUSA_PATHS), _call(num_assistant_tokens_schedule="fast")),
    Case("heuristic-lookup", ARGUMENTS, "`num_assistant_tokens_schedule='heuristic'` without a draft model",
         ("lookup", *MEDUSA_PATHS), _call(num_assistant_tokens_schedule="heuristic")),
    Case("confidence-threshold", ARGUMENTS, "`assistant_confidence_threshold=1.5`", ("assistant", "hybrid"),
         _call(assistant_confidence_threshold=1.5)),
    Case("zero-lookup-tokens", ARGUMENTS, "`prompt_lookup_num_tokens=0`", LOOKUP_PATHS,
         _call(prompt_lookup_num_tokens=0)),
    Case("negative-lookup-tokens", ARGUMENTS, "`prompt_lookup_num_tokens=-1`", LOOKUP_PATHS,
         _call(prompt_lookup_num_tokens=-1)),
    Case("bool-lookup-tokens", ARGUMENTS, "`prompt_lookup_num_tokens=True`", LOOKUP_PATHS,
         _call(prompt_lookup_num_tokens=True)),
    Case("ngram-without-lookup", ARGUMENTS, "`max_matching_ngram_size` without prompt lookup",
         ("assistant", "tree", "medusa", "medusa-dynamic"), _call(max_matching_ngram_size=2)),
    Case("zero-ngram", ARGUMENTS, "`max_matching_ngram_size=0`", LOOKUP_PATHS, _call(max_matching_ngram_size=0)),
    Case("costs-of-another-type", ARGUMENTS, "`speculative_costs=` that is not a `SpeculativeCosts`", PATHS,
         _call(speculative_costs={"draft": 1.0})),
    # Medusa heads' arguments ------------------------------------------------------------------------------------
    Case("medusa-not-bool", HEADS, "`medusa='yes'`", MEDUSA_PATHS, _call(medusa="yes")),
    Case("tree-without-medusa", HEADS, "Medusa's `tree=` without `medusa=True`", MEDUSA_PATHS,
         _call(medusa=False, tree=4)),
    Case("unknown-preset", HEADS, "an unknown tree preset", ("medusa",), _call(tree="huge")),
    Case("tree-of-a-float", HEADS, "`tree=1.5`", ("medusa",), _call(tree=1.5)),
    Case("heads-tree-of-no-nodes", HEADS, "`tree=0`", ("medusa",), _call(tree=0)),
    Case("tree-deeper-than-heads", HEADS, "a tree deeper than there are heads", ("medusa", "medusa-lookup"),
         _call(tree=[[0], [0, 0], [0, 0, 0]])),
    Case("tree-wider-than-heads-choose", HEADS, "a static tree needing more candidates than the heads choose from",
         ("medusa", "medusa-lookup"), _call(tree=[[VOCAB]])),
    Case("dynamic-top-k-past-heads", HEADS, "a `DynamicTree` whose `top_k` is more tokens than the heads choose from",
         MEDUSA_PATHS, _call(tree=DynamicTree(num_nodes=3, top_k=VOCAB + 1))),
    Case("eagle-static-tree", HEADS, "EAGLE heads with a static tree (a preset name or a list of paths)",
         ("medusa", "medusa-lookup"), _heads_of("eagle", _llama_target, tree="small")),
    Case("eagle-on-derived-layer-types", HEADS, "EAGLE heads on a base that derives its layer types (Jamba)",
         MEDUSA_PATHS, _heads_of("eagle", _jamba)),
    Case("eagle-decoder-that-cannot-run", HEADS,
         "EAGLE heads on a base whose family cannot run as a decoder of full-attention layers (Zamba2)",
         MEDUSA_PATHS, _heads_of("eagle", _zamba2)),
    Case("eagle3-feature-layers-past-the-base", HEADS,
         "EAGLE-3 heads reading hidden states past the base's layers (`feature_layers=`)", MEDUSA_PATHS,
         _heads_of("eagle3", _llama_target, {"feature_layers": [0, 5]})),
    Case("eagle3-without-attention", HEADS, "EAGLE-3 heads on a base without attention (Mamba)", MEDUSA_PATHS,
         _heads_of("eagle3", _mamba)),
    Case("eagle-final-norm-unknown", HEADS, "EAGLE heads on a base with two final norms to choose from (BLOOM)",
         MEDUSA_PATHS, _heads_of("eagle", bloom)),
    Case("heads-on-projected-states", HEADS,
         "heads on a base whose lm_head reads a projection of its last hidden state (OPT's `word_embed_proj_dim`)",
         MEDUSA_PATHS, _heads_of("medusa", _opt_projected)),
    Case("dynamic-tree-deeper-than-heads", HEADS, "a `DynamicTree` deeper than there are heads", MEDUSA_PATHS,
         _call(tree=DynamicTree(num_nodes=3, depth=3))),
    Case("unknown-acceptance", HEADS, "an unknown `medusa_acceptance`", MEDUSA_PATHS,
         _call(medusa_acceptance="greedy")),
    Case("typical-greedy", HEADS, "`medusa_acceptance='typical'` without sampling", MEDUSA_PATHS,
         _call(medusa_acceptance="typical")),
    Case("typical-epsilon-range", HEADS, "`typical_epsilon=2.0`", MEDUSA_PATHS,
         _call(medusa_acceptance="typical", do_sample=True, typical_epsilon=2.0)),
    Case("typical-epsilon-type", HEADS, "`typical_epsilon='0.1'`", MEDUSA_PATHS,
         _call(medusa_acceptance="typical", do_sample=True, typical_epsilon="0.1")),
    # The models -------------------------------------------------------------------------------------------------
    Case("target-as-draft", MODELS, "the target as its own draft (`assistant=model`)", DRAFT_PATHS,
         _draft(lambda models: models.target)),
    Case("meta-draft", MODELS, "a draft whose weights are not loaded (on the 'meta' device)", DRAFT_PATHS,
         _draft(_meta_draft)),
    Case("prefix-tuned-draft", MODELS, "a PEFT draft with a prefix-tuning adapter", DRAFT_PATHS,
         _draft(_prefix_tuned_draft)),
    Case("other-tokenizers", MODELS,
         "a draft whose tokenizer differs from the target's (both passed), with a tree or prompt lookup",
         ("tree", "hybrid"), _call(tokenizer=word_tokenizer("a"), assistant_tokenizer=word_tokenizer("b"))),
    Case("tokenizers-sharing-nothing", MODELS,
         "sampling with a draft whose tokenizer shares no token with the target's", ("assistant",),
         _call(tokenizer=word_tokenizer("a"), assistant_tokenizer=word_tokenizer("b"), do_sample=True)),
    Case("other-tokenizers-vocab", MODELS, "`assistant_vocab` with a draft whose tokenizer differs from the target's",
         ("assistant",),
         _call(tokenizer=word_tokenizer("a"), assistant_tokenizer=word_tokenizer("b"), assistant_vocab=[1, 2, 3])),
    Case("tokenizers-past-the-models", MODELS, "a tokenizer with more tokens than the models score (both passed)",
         DRAFT_PATHS, _call(tokenizer=_LARGE_TOKENIZER, assistant_tokenizer=_LARGE_TOKENIZER)),
    Case("assistant-tokenizer-alone", MODELS, "`assistant_tokenizer=` without `tokenizer=`", DRAFT_PATHS,
         _call(assistant_tokenizer=word_tokenizer("a"))),
    Case("other-vocabulary-size", MODELS, "a draft that scores another number of tokens", DRAFT_PATHS,
         _draft(lambda models: models.shared(wider_draft))),
    Case("other-bos", MODELS, "a draft with another `bos_token_id`", DRAFT_PATHS,
         _draft(lambda models: models.shared(other_bos_draft))),
    Case("encoder-decoder-target", MODELS, "an encoder-decoder target (T5)", PATHS, _target(t5)),
    Case("encoder-decoder-draft", MODELS, "an encoder-decoder draft (T5)", DRAFT_PATHS,
         _draft(lambda models: models.shared(t5))),
    Case("rwkv-target", MODELS, "an RWKV target (a recurrent state)", PATHS, _target(rwkv)),
    Case("unrecorded-recurrent-target", MODELS,
         "a target whose recurrent states transformers does not record per token (Zamba, ZAYA, MiniMax, "
         "RecurrentGemma)", PATHS, _target(zamba)),
    Case("no-cache-target", MODELS, "a target whose forward takes no cache (GPT-1)", PATHS, _target(gpt1)),
    Case("no-cache-draft", MODELS, "a draft whose forward takes no cache (GPT-1)", DRAFT_PATHS,
         _draft(lambda models: models.shared(gpt1))),
    Case("early-exit-cut-config", MODELS,
         "`assistant_early_exit=` on a target whose config keeps per-layer lists of the whole model (Zamba2)",
         ("lookup",), _target(_zamba2, assistant_early_exit=1)),
    Case("recurrent-draft-of-other-tokenizer", MODELS, "a draft with recurrent layers and another tokenizer",
         ("assistant",), _recurrent_draft_of_other_tokenizer),
    Case("mtp-tree-of-several-layers", ARGUMENTS, "`tree=` with two or more MTP layers", ("mtp",),
         _mtp(layers=2, tree=4)),
    Case("mtp-with-lookup", ARGUMENTS, "`prompt_lookup_num_tokens=` with `use_mtp=True`", ("mtp",),
         _mtp(prompt_lookup_num_tokens=3)),
    Case("mtp-layer-kind-without-rotary", MODELS,
         "an MTP layer of an attention kind the model's rotary embedding does not hold (Mellum)", ("mtp",),
         _mtp("mellum", overrides={"layer_types": ["full_attention", "full_attention"],
                                   "mtp_layer_types": ["sliding_attention"]})),
    Case("rwkv-draft", MODELS, "an RWKV draft", DRAFT_PATHS, _draft(lambda models: models.shared(rwkv))),
    Case("alibi-target", MODELS, "a target with ALiBi positions (BLOOM)", PATHS, _target(bloom)),
    Case("slot-mask-target", MODELS, "a target that masks by cache slot (GPT-Neo)", PATHS, _target(gpt_neo)),
    Case("one-token-window", MODELS, "a target with a one-token sliding window", PATHS, _target(one_token_window)),
    Case("flex-attention", MODELS, "a target loaded with `attn_implementation='flex_attention'`", PATHS,
         _target(_flex_attention)),
    Case("heads-on-altup-streams", MODELS, "heads on a Gemma-3n base (AltUp streams in its hidden states)",
         ("medusa",), _heads_on_gemma3n),
    Case("heads-for-another-base", MODELS,
         "Medusa heads on a base of another hidden size (`MedusaForCausalLM(base, config)`)", ("medusa",),
         _heads_for_another_base),
)
# fmt: on
