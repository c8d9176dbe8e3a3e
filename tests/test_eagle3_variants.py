"""The EAGLE-3 variants vLLM serves load, compute what their equations say, keep plain greedy and export back as
vLLM reads them: a Qwen3 layer (`Eagle3Qwen3ForCausalLM`: per-head query and key norms), `norm_before_fc` (one
norm over the fused states), `fc_norm` (a norm on each), `norm_output` (the next depth reads the normed output).
Heads of a Qwen3 layer also train from a base, as Llama-layer heads do."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from hf_specdec import MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.medusa.eagle3 import Eagle3Heads
from hf_specdec.medusa.eagle_layouts import UNUSED_EMBEDDING
from hf_specdec.serving import export_heads
from hf_specdec.training.pipeline import MedusaTrainingConfig
from tests.eagle_reference import eagle3_fuse, eagle3_layer, rms
from tests.published_drafts import (
    draft_vocabulary,
    eagle1_weights,
    eagle3_weights,
    layer_config,
    write_eagle1,
    write_eagle3,
    write_speculators,
)
from tests.tiny_models import ragged_batch, tiny_model

FREE = SpeculativeCosts(0.0, 0.0)
LAYERS = [1, 2, 4]
QWEN3 = "Eagle3Qwen3ForCausalLM"
VARIANTS = {
    "qwen3": (QWEN3, {}),
    "norm_before_fc": ("LlamaForCausalLMEagle3", {"norm_before_fc": True}),
    "fc_norm": ("LlamaForCausalLMEagle3", {"fc_norm": True}),
    "norm_output": ("LlamaForCausalLMEagle3", {"norm_output": True}),
    "all": (QWEN3, {"norm_before_fc": True, "fc_norm": True, "norm_output": True, "norm_before_residual": True}),
}


def _base():
    return tiny_model("llama", seed=0, num_layers=6, sharpen=4.0)


def _write(folder, variant: str, layout: str = "eagle3") -> dict:
    architecture, options = VARIANTS[variant]
    if layout == "speculators":
        residual = options.get("norm_before_residual", False)
        others = {k: v for k, v in options.items() if k != "norm_before_residual"}
        return write_speculators(folder, draft_vocabulary(40), LAYERS, residual, qwen3=architecture == QWEN3, **others)
    return write_eagle3(folder, draft_vocabulary(40), layer_ids=LAYERS, architecture=architecture, **options)


def _expected(weights: dict, prefix: str, options: dict, tokens, states, base):
    """The published equations over one sequence: depth 1's outputs and logits at every position, and depth 2's
    output at position `t` (its input: the token two ahead and what depth 1 feeds back)."""
    published = {k.replace(prefix, "midlayer."): v for k, v in weights.items()}
    config = LlamaConfig(**layer_config())
    residual = options.get("norm_before_residual", False)
    fused = torch.cat([states[i] for i in LAYERS], dim=-1)[0]
    embed = base.get_input_embeddings()
    following = torch.cat([tokens[0, 1:], tokens[0, :1]])
    g = eagle3_fuse(published, config, fused)
    out = eagle3_layer(published, config, embed(following), g, torch.arange(tokens.shape[1]), residual)
    normed = rms(out, weights["norm.weight"], config.rms_norm_eps)
    fed_back = normed if options.get("norm_output") else out
    second = {}
    for t in (2, 5):
        g2 = torch.cat([g[: t + 1], fed_back[t : t + 1]])
        e2 = embed(torch.cat([following[: t + 1], tokens[0, t + 2 : t + 3]]))
        second[t] = eagle3_layer(published, config, e2, g2, torch.arange(t + 2), residual)[-1]
        if options.get("norm_output"):
            second[t] = rms(second[t], weights["norm.weight"], config.rms_norm_eps)
    return fed_back, normed @ weights["lm_head.weight"].T, second


@pytest.mark.parametrize("layout", ["eagle3", "speculators"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_published_variants_compute_their_equations(tmp_path, variant: str, layout: str) -> None:
    weights = _write(tmp_path, variant, layout)
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base())
    heads, base = model.heads, model.base
    architecture, options = VARIANTS[variant]
    assert isinstance(heads, Eagle3Heads) and heads.feature_layers == tuple(LAYERS)
    for name in ("norm_before_fc", "fc_norm", "norm_output"):
        assert getattr(model.config, name) == options.get(name, False)
    assert (model.config.layer_config.get("model_type") == "qwen3") == (architecture == QWEN3)
    tokens = torch.randint(4, base.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        states = base(tokens, output_hidden_states=True).hidden_states
        fused = torch.cat([states[i] for i in LAYERS], dim=-1)
        first, second = heads.unroll(fused, tokens, base.get_input_embeddings(), depth=2)[:2]
        logits = heads.project(first[0], base.get_output_embeddings())
        prefix = "layers.0." if layout == "speculators" else "midlayer."
        expected, expected_logits, expected_second = _expected(weights, prefix, options, tokens, states, base)
    torch.testing.assert_close(first[0, :-1], expected[:-1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[:-1], expected_logits[:-1], rtol=1e-4, atol=1e-5)
    for t, value in expected_second.items():  # depth 2 drafts from position t (the feature of t + 2)
        torch.testing.assert_close(second[0, t], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["qwen3", "all"])
@pytest.mark.parametrize("batch", [1, 3])
def test_published_variants_keep_plain_greedy(tmp_path, variant: str, batch: int) -> None:
    _write(tmp_path, variant)
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base())
    ids, mask = ragged_batch(batch, seed=batch)
    kwargs = {"max_new_tokens": 30, "do_sample": False}
    out = model.generate(
        input_ids=ids, attention_mask=mask, medusa=True, return_dict_in_generate=True, speculative_costs=FREE, **kwargs
    )
    assert torch.equal(out.sequences, model.base.generate(input_ids=ids, attention_mask=mask, **kwargs))
    assert out.speculative.summary()["drafted_tokens"] > 0


@pytest.mark.parametrize("layout", ["published", "speculators"])
def test_variants_export_back_as_vllm_reads_them(tmp_path, layout: str) -> None:
    _write(tmp_path / "release", "all")
    model = MedusaForCausalLM.from_pretrained(tmp_path / "release", base_model=_base())
    export_heads(model, tmp_path / "vllm", "vllm", layout=layout)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    options = {name: config[name] for name in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")}
    assert options == dict.fromkeys(options, True)
    if layout == "published":
        assert config["architectures"] == [QWEN3] and config["model_type"] == "qwen3"
        prefix = "midlayer."
    else:
        assert config["transformer_layer_config"]["model_type"] == "qwen3"  # vLLM picks Eagle3Qwen3ForCausalLM
        prefix = "layers.0."
    weights = load_file(tmp_path / "vllm" / "model.safetensors")
    assert {"input_norm.weight", "fc_norm.0.weight", "fc_norm.2.weight", f"{prefix}self_attn.q_norm.weight"} <= set(
        weights
    )
    loaded = MedusaForCausalLM.from_pretrained(tmp_path / "vllm", base_model=model.base)
    ours, theirs = model.heads.state_dict(), loaded.heads.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours if key != UNUSED_EMBEDDING)


def test_drafts_the_library_would_compute_otherwise_are_refused(tmp_path) -> None:
    base = _base()
    write_eagle3(
        tmp_path / "q_norm", draft_vocabulary(40), LAYERS, weights=eagle3_weights(draft_vocabulary(40), qwen3=True)
    )
    with pytest.raises(ValueError, match="has no q_norm/k_norm"):
        MedusaForCausalLM.from_pretrained(tmp_path / "q_norm", base_model=base)
    write_eagle3(tmp_path / "deepseek", draft_vocabulary(40), LAYERS, architecture="Eagle3DeepseekV2ForCausalLM")
    with pytest.raises(ValueError, match="of architecture Eagle3DeepseekV2ForCausalLM"):
        MedusaForCausalLM.from_pretrained(tmp_path / "deepseek", base_model=base)
    write_eagle1(tmp_path / "qwen2-eagle1", eagle1_weights(bias=False), pickled=False)
    config = json.loads((tmp_path / "qwen2-eagle1" / "config.json").read_text())
    (tmp_path / "qwen2-eagle1" / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    with pytest.raises(ValueError, match="EAGLE-1 draft's layers are 'qwen2' layers"):
        MedusaForCausalLM.from_pretrained(tmp_path / "qwen2-eagle1", base_model=base)
    folder = tmp_path / "no_fusion"
    write_eagle3(folder, draft_vocabulary(40), LAYERS)
    config = json.loads((folder / "config.json").read_text())
    config["eagle_config"]["use_aux_hidden_state"] = False
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="use_aux_hidden_state"):
        MedusaForCausalLM.from_pretrained(folder, base_model=base)
    for name, window in {
        "listed": {"layer_types": ["sliding_attention"]},
        "from_the_first_layer": {"use_sliding_window": True, "max_window_layers": 0, "sliding_window": 8},
    }.items():
        write_eagle3(tmp_path / name, draft_vocabulary(40), LAYERS, architecture=QWEN3, **window)
        with pytest.raises(ValueError, match="sliding window"):
            MedusaForCausalLM.from_pretrained(tmp_path / name, base_model=base)


def test_an_input_norm_the_config_does_not_use_is_not_read_as_in_vllm(tmp_path) -> None:
    weights = eagle3_weights(draft_vocabulary(40), norm_before_fc=True)
    write_eagle3(tmp_path, draft_vocabulary(40), LAYERS, weights=weights)  # no norm_before_fc in the config
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base())
    assert model.heads.input_norm is None and not model.config.norm_before_fc


def test_heads_fusing_layers_out_of_order_export_their_norms_in_vllms_order(tmp_path) -> None:
    base = _base()
    options = {"norm_before_fc": True, "fc_norm": True, "norm_output": True}
    config = MedusaConfig(head_type="eagle3", num_heads=3, feature_layers=[4, 1, 3], **options)
    model = MedusaForCausalLM.from_base(base, config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.heads.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    export_heads(model, tmp_path, "vllm")
    loaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert loaded.heads.feature_layers == (1, 3, 4)
    tokens = torch.randint(4, base.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        states = base(tokens, output_hidden_states=True).hidden_states
        ours = model.heads.from_target(torch.cat([states[i] for i in (4, 1, 3)], dim=-1))
        theirs = loaded.heads.from_target(torch.cat([states[i] for i in (1, 3, 4)], dim=-1))
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    repeated = MedusaForCausalLM.from_base(
        base, MedusaConfig(head_type="eagle3", feature_layers=[1, 3, 3], fc_norm=True)
    )
    with pytest.raises(ValueError, match="one of them twice"):
        export_heads(repeated, tmp_path / "repeated", "vllm")


def test_heads_of_a_qwen3_layer_train_save_and_load(tmp_path) -> None:
    base = _base()
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle3", layer_config={"model_type": "qwen3"}))
    layer = model.heads.layer_config
    assert type(layer).__name__ == "Qwen3Config" and layer.hidden_size == base.config.hidden_size
    assert model.heads.midlayer.self_attn.q_norm.weight.shape == (layer.head_dim,)
    model.freeze_base()
    ids, mask = ragged_batch(2, seed=1)
    loss = model(input_ids=ids, attention_mask=mask, labels=ids)["loss"]
    loss.backward()
    assert model.heads.midlayer.self_attn.q_norm.weight.grad is not None
    model.save_pretrained(tmp_path)
    loaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert loaded.config.layer_config == model.config.layer_config
    assert all(torch.equal(a, b) for a, b in zip(model.heads.parameters(), loaded.heads.parameters(), strict=True))
    training = MedusaTrainingConfig(base="smollm2-135m", data="d.jsonl", head_type="eagle3", head_layer_type="qwen3")
    assert training.head_config().layer_config == {"model_type": "qwen3"}
    with pytest.raises(ValueError, match="--head_layer_type chooses EAGLE-3"):
        MedusaTrainingConfig(base="smollm2-135m", data="d.jsonl", head_type="eagle", head_layer_type="qwen3")
    with pytest.raises(ValueError, match="--head_layer_type is one of"):
        MedusaTrainingConfig(base="smollm2-135m", data="d.jsonl", head_type="eagle3", head_layer_type="gemma")
