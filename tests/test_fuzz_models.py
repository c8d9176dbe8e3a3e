"""The model-and-input fuzzer (tests/fuzz_models.py), a short deterministic run: a few random cases per speculative
path, each a random tiny architecture with random inputs and drafter, held to plain greedy `generate()`'s tokens or a
clear refusal. Long runs: `python tools/fuzz_models.py --cases-per-path N --seed S --out results.jsonl`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
import torch

import tests.fuzz_models as fuzz
from tests.fuzz_models import ARCHS, PATHS, Case, ModelSpec, build_model, draw_case, record, run_case

CASES_PER_PATH = 8
SEED = "ci"


def _spec(arch: str, **fields: Any) -> ModelSpec:
    """A small model spec: 2 heads of 16, 1 layer, 96 ids (1 = bos, 2 = eos, 0 = pad), 64 positions, peaky weights."""
    base: dict[str, Any] = {"seed": 0, "heads": 2, "head_dim": 16, "kv_heads": 1, "layers": 1, "rows": 96}
    base.update(positions=64, bos=1, eos=2, pad=0, attn="sdpa" if ARCHS[arch].sdpa else "eager", init=0.3)
    base.update(fields)
    return ModelSpec(arch=arch, **base)


def _pinned(path: str, target: ModelSpec, new: int = 16, **fields: Any) -> Case:
    """One row of 12 tokens, `new` greedy tokens without EOS, on `path`."""
    gen = {"do_sample": False, "max_new_tokens": new, "eos_token_id": None}
    ids = [[(5 * i) % 90 + 4 for i in range(12)]]
    return Case(path, "pinned", 96, target, ids, None, gen, **fields)


TWIN = {"kind": "twin", "noise": 0.05, "seed": 1, "positions": None, "dtype": "float32"}
HEADS = {"num_heads": 2, "num_layers": 1, "share_lm_head": True, "noise": 0.3, "seed": 1, "token_ids": None}
LOOKUP = {"prompt_lookup_num_tokens": 3}

# Failure classes the fuzzer has found, one small case each: name -> (case, the failure it was pinned for). Each must
# now give plain's tokens or a clear refusal.
PINNED: dict[str, tuple[Case, str]] = {
    "sliding_window=1": (
        _pinned("lookup", _spec("mistral", window=1), path_kwargs=LOOKUP),
        "DIFFERENT: at window 1 plain's cached decoding differs from its own full forward (speculative: the latter)",
    ),
    "gptj_target_past_its_table": (
        _pinned("lookup", _spec("gptj", positions=20), path_kwargs=LOOKUP),
        "CRASH: IndexError from GPT-J's sinusoidal position table (a buffer, not an nn.Embedding) instead of a refusal",
    ),
    "codegen_draft_shorter_than_the_text": (
        _pinned("assistant", _spec("llama"), draft={"kind": "model", "spec": asdict(_spec("codegen", positions=16))}),
        "CRASH: IndexError in a CodeGen draft's sinusoidal table: it is not stopped at its table as GPT-2 drafts are",
    ),
    "gpt_neo_tree_near_its_position_limit": (
        _pinned("assistant_tree", _spec("gpt_neo", positions=28), draft=TWIN, path_kwargs={"tree": 8}),
        "CRASH: RuntimeError: GPT-Neo's causal buffer has max_position_embeddings slots; a tree's nodes need more",
    ),
    "gpt_neo_local_attention_with_a_tree": (
        _pinned(
            "medusa_dynamic",
            _spec("gpt_neo", window=4, positions=128, seed=3),
            new=24,
            heads={**HEADS, "head_type": "recurrent", "num_heads": 1},
            path_kwargs={"medusa": True, "tree": {"dynamic_tree": [8, 2, 4]}},
        ),
        "DIFFERENT: GPT-Neo's local attention counts its window over cache slots, where tree nodes lie side by side",
    ),
    "heads_on_opt_with_a_projection": (
        _pinned(
            "medusa",
            _spec("opt", options={"proj": 16}),
            heads={**HEADS, "head_type": "recurrent"},
            path_kwargs={"medusa": True},
        ),
        "CRASH: RuntimeError: OPT's lm_head reads word_embed_proj_dim features, not hidden_size ones",
    ),
    "openai_gpt_target": (
        _pinned("lookup", _spec("openai"), path_kwargs=LOOKUP),
        "CRASH: RuntimeError in OpenAIGPT's attention (permute of a 6-D tensor): it does not take the 4D mask",
    ),
    "eagle_heads_on_mamba": (
        _pinned("medusa", _spec("mamba"), heads={**HEADS, "head_type": "eagle"}, path_kwargs={"medusa": True}),
        "CRASH: AttributeError: EAGLE's decoder config sets layer_types, a read-only property of MambaConfig",
    ),
    "eagle_heads_deeper_than_smollm3": (
        _pinned(
            "medusa",
            _spec("smollm3"),
            heads={**HEADS, "head_type": "eagle", "num_layers": 2},
            path_kwargs={"medusa": True},
        ),
        "CRASH: IndexError: the EAGLE decoder's config keeps the base's no_rope_layers (1 entry for 2 layers)",
    ),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_failure_classes(name: str) -> None:
    case, failure = PINNED[name]
    result = run_case(case)
    assert not result.failure, f"{failure}; now: {result.outcome.splitlines()[0][:200]}"


def test_gpt_bigcode_is_not_refused_for_a_causal_table_its_forward_does_not_read() -> None:
    """GPT-BigCode keeps a `bias` buffer of max_position_embeddings x max_position_embeddings, but transformers 5.24
    masks its attention with `create_causal_mask`: a tree verified at the position limit, with a ragged batch, gives
    plain's tokens, and the table is no reason to refuse it."""
    case = _pinned("assistant_tree", _spec("gpt_bigcode", heads=4, head_dim=8, positions=28), draft=TWIN)
    case.path_kwargs = {"tree": 8}
    result = run_case(case)
    assert result.kind == "same", result.outcome


def test_eagle_heads_on_an_eager_only_base_get_the_librarys_own_refusal_or_work() -> None:
    """Gemma2 runs with eager attention only: EAGLE heads built from its config with the default attention got
    transformers' "does not support ... scaled_dot_product_attention ... load your model with eager", which the base
    already was (a misleading message)."""
    case = _pinned("medusa", _spec("gemma2", layer_types=["full_attention"]), heads={**HEADS, "head_type": "eagle"})
    case.path_kwargs = {"medusa": True, "tree": 4}
    result = run_case(case)
    assert "scaled_dot_product_attention" not in result.outcome, result.outcome
    assert not result.failure, result.outcome
    assert result.kind == "same" or result.origin.startswith("hf_specdec"), result.outcome


@pytest.mark.parametrize("index", range(CASES_PER_PATH))
@pytest.mark.parametrize("path", PATHS)
def test_random_models_and_inputs_give_plain_greedy_or_a_clear_refusal(path: str, index: int) -> None:
    case = draw_case(path, f"{SEED}:{path}:{index}")
    result = run_case(case)
    assert not result.failure, f"{fuzz.describe(case)}\n{result.outcome}\nrerun:\n{fuzz.reproducer(case)}"


def test_cases_are_a_function_of_their_seed_and_round_trip_through_json() -> None:
    for path in PATHS:
        case = draw_case(path, f"{SEED}:{path}:0")
        again = draw_case(path, f"{SEED}:{path}:0")
        assert case.to_json() == again.to_json()
        text = json.dumps(case.to_json())
        assert Case.from_json(json.loads(text)).to_json() == case.to_json()
    assert draw_case("lookup", "a").to_json() != draw_case("lookup", "b").to_json()


def test_every_architecture_of_the_table_builds_and_runs() -> None:
    for name, arch in ARCHS.items():
        spec = ModelSpec(
            arch=name,
            seed=0,
            heads=2,
            head_dim=8,
            kv_heads=2,
            layers=2,
            rows=70,
            positions=32,
            bos=1,
            eos=2,
            pad=0,
            attn="sdpa" if arch.sdpa else "eager",
        )
        model = build_model(spec)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[3, 4, 5]])).logits
        assert logits.shape == (1, 3, 70), name


def test_the_checker_reports_a_different_output_and_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The property is not vacuous: a path that changes a token, or raises a RuntimeError, is a failure."""
    case = draw_case("lookup", f"{SEED}:checker")
    case.input_ids, case.attention_mask = [[5, 6, 7, 5, 6]], None
    case.gen, case.eos_mode = {"do_sample": False, "max_new_tokens": 4, "eos_token_id": None}, "given"
    case.target.dtype = "float32"
    assert run_case(case).outcome == "same"

    class Wrong:
        def __init__(self, model: torch.nn.Module, error: bool) -> None:
            self.model, self.error = model, error

        def generate(self, **kwargs: object) -> torch.Tensor:
            if self.error:
                raise RuntimeError("boom")
            kwargs = {k: v for k, v in kwargs.items() if k not in ("prompt_lookup_num_tokens", "speculative_costs")}
            kwargs = {
                k: v for k, v in kwargs.items() if k not in ("max_matching_ngram_size", "num_assistant_tokens_schedule")
            }
            out = self.model.generate(**kwargs)
            out[0, -1] += 1
            return out

    for error, kind in ((False, "DIFFERENT"), (True, "CRASH")):
        monkeypatch.setattr(fuzz.hf_specdec, "speculative", lambda model, error=error: Wrong(model, error))
        result = run_case(case)
        assert result.failure and result.kind == kind, result.outcome
        line = record(case, result)
        assert line["outcome"].startswith(kind) and json.loads(json.dumps(line))["case"] == case.to_json()


@pytest.mark.parametrize("seed", ["42:medusa_dynamic:5934", "42:medusa_dynamic:6711"])
def test_a_dynamic_tree_deeper_than_the_tokens_left_is_cut_to_them(seed: str) -> None:
    """Found by the fuzzer: a DynamicTree deeper than what a step can still commit (two new tokens) grew paths wider
    than the token buffer's room after max_length (IndexError); Medusa heads now grow it no deeper than that."""
    result = run_case(draw_case("medusa_dynamic", seed))
    assert not result.failure, result.outcome.splitlines()[0][:200]


@pytest.mark.parametrize(
    ("seed", "path"),
    [
        ("502:mtp:108", "mtp"),  # a chain grown 8 deep from 6 nodes: the path was wider than the chain (CRASH)
        ("502:medusa:28", "medusa"),  # the same with EAGLE-3 heads, one node (CRASH)
        ("502:medusa:96", "medusa"),  # EAGLE-3 heads on DeepSeek-V3, whose config's key/value heads do not group
        ("503:medusa_lookup:93", "medusa_lookup"),  # heads without blocks on a bf16 base with float32 states
        ("1207:medusa_lookup:197", "medusa_lookup"),  # EAGLE heads on Lara-Mini, whose config validates its window
    ],
)
def test_cases_the_fuzzer_found(seed: str, path: str) -> None:
    result = run_case(draw_case(path, seed))
    assert result.kind in ("same", "bf16 differs"), result.outcome.splitlines()[0][:300]
