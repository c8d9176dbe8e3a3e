"""EAGLE heads written for vLLM: EAGLE-3 heads in the published EAGLE-3 layout and in the speculators format, EAGLE-1
drafts loaded from a release written back as EAGLE-1; the files have the published names, shapes and dtypes, and
loading them back gives the same heads and the same greedy output. What vLLM would compute otherwise is refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from hf_specdec import MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.cli import main
from hf_specdec.medusa.eagle_layouts import UNUSED_EMBEDDING
from hf_specdec.serving import export_heads, export_pretrained
from tests.published_drafts import eagle1_weights, write_eagle1
from tests.tiny_models import ragged_batch, tiny_model

FREE = SpeculativeCosts(0.0, 0.0)
HIDDEN, VOCAB = 64, 96
LAYER_KEYS = {
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "hidden_norm.weight",
    "post_attention_layernorm.weight",
}


def _eagle3(token_ids: torch.Tensor | None = None, **config) -> MedusaForCausalLM:
    """EAGLE-3 heads on a 6-layer tiny base, perturbed so that no weight keeps its initial value."""
    base = tiny_model("llama", seed=0, num_layers=6, sharpen=4.0)
    torch.manual_seed(0)
    model = MedusaForCausalLM.from_base(
        base, MedusaConfig(head_type="eagle3", num_heads=3, **config), token_ids=token_ids
    )
    with torch.no_grad():
        for parameter in model.heads.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter) * parameter.abs().mean().clamp_min(0.05))
    return model.eval()


def _greedy(model: MedusaForCausalLM) -> torch.Tensor:
    ids, mask = ragged_batch(2, seed=4)
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False, medusa=True, speculative_costs=FREE
    )


def _same_heads(loaded: MedusaForCausalLM, model: MedusaForCausalLM) -> None:
    """The same weights (but the decoder's one-row embedding, which nothing reads and no draft stores), the same
    fused layers and variant, the same greedy output."""
    ours, theirs = model.heads.state_dict(), loaded.heads.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours if key != UNUSED_EMBEDDING)
    assert loaded.heads.feature_layers == model.heads.feature_layers
    assert loaded.config.norm_before_residual == model.config.norm_before_residual
    assert torch.equal(_greedy(loaded), _greedy(model))


def test_eagle3_heads_written_in_the_published_layout(tmp_path) -> None:
    token_ids = torch.tensor(sorted(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:40].tolist()))
    model = _eagle3(token_ids, feature_layers=[1, 3, 4])
    model.save_pretrained(tmp_path / "heads")
    export_pretrained(tmp_path / "heads", tmp_path / "vllm", "vllm", base_model=model.base)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (config["num_hidden_layers"], config["vocab_size"], config["draft_vocab_size"]) == (1, VOCAB, 40)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["norm_before_residual"] is False and "target_hidden_size" not in config
    layer = LlamaConfig.from_dict(config)  # as vLLM and transformers read it
    assert layer.rope_parameters["rope_theta"] == model.base.config.rope_parameters["rope_theta"]
    assert (layer.hidden_size, layer.head_dim, layer.num_key_value_heads) == (HIDDEN, 16, 2)
    weights = load_file(tmp_path / "vllm" / "model.safetensors")
    assert set(weights) == {f"midlayer.{key}" for key in LAYER_KEYS} | {
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
    }
    assert weights["fc.weight"].shape == (HIDDEN, 3 * HIDDEN)
    assert weights["midlayer.self_attn.q_proj.weight"].shape == (64, 2 * HIDDEN)
    assert weights["lm_head.weight"].shape == (40, HIDDEN) and weights["fc.weight"].dtype == torch.float32
    assert weights["d2t"].dtype == torch.int64 and weights["d2t"].shape == (40,)
    assert weights["t2d"].dtype == torch.bool and weights["t2d"].shape == (VOCAB,)
    assert torch.equal(weights["d2t"] + torch.arange(40), token_ids)
    assert torch.equal(weights["t2d"].nonzero().flatten(), token_ids)
    loaded = MedusaForCausalLM.from_pretrained(tmp_path / "vllm", base_model=model.base)
    _same_heads(loaded, model)


def test_eagle3_heads_over_the_whole_vocabulary_write_no_vocabulary_map(tmp_path) -> None:
    """vLLM has a place for d2t only when the draft vocabulary is smaller than the target's (as SafeAILab saves)."""
    model = _eagle3(norm_before_residual=True)
    export_heads(model, tmp_path, "vllm")
    weights = load_file(tmp_path / "model.safetensors")
    assert "d2t" not in weights and "t2d" not in weights and weights["lm_head.weight"].shape == (VOCAB, HIDDEN)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["draft_vocab_size"] == VOCAB and config["norm_before_residual"] is True
    # A 6-layer base's default layers repeat one (2, 3, 3): vLLM fuses each layer once (see the next test).
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3]
    assert config["num_aux_hidden_states"] == 2 and weights["fc.weight"].shape == (HIDDEN, 2 * HIDDEN)
    loaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=model.base)
    assert loaded.heads.feature_layers == (2, 3)
    assert torch.equal(_greedy(loaded), _greedy(model))


def test_eagle3_fused_layers_are_written_in_the_order_vllm_concatenates_them(tmp_path) -> None:
    """vLLM concatenates the target's states at the config's layers in increasing order, each once; heads fusing
    layers in another order, or one twice, are written with fc's column blocks moved (and summed) to match."""
    model = _eagle3(feature_layers=[4, 1, 4, 3])
    export_heads(model, tmp_path, "vllm")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["num_aux_hidden_states"] == 3
    fc = load_file(tmp_path / "model.safetensors")["fc.weight"]
    states = {layer: torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(layer)) for layer in (1, 3, 4)}
    ours = model.heads.fc(torch.cat([states[layer] for layer in (4, 1, 4, 3)], dim=-1))
    vllm = torch.cat([states[layer] for layer in (1, 3, 4)], dim=-1) @ fc.T
    torch.testing.assert_close(vllm, ours, rtol=1e-5, atol=1e-5)
    loaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=model.base)
    assert loaded.heads.feature_layers == (1, 3, 4)
    assert torch.equal(_greedy(loaded), _greedy(model))
    # A draft listing its layers out of order loads as vLLM reads it: in increasing order.
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [4, 1, 3]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert MedusaForCausalLM.from_pretrained(tmp_path, base_model=model.base).heads.feature_layers == (1, 3, 4)
    # Layers already increasing and distinct keep fc bit for bit.
    ordered = _eagle3(feature_layers=[1, 3, 4])
    export_heads(ordered, tmp_path / "ordered", "vllm", layout="speculators")
    assert torch.equal(load_file(tmp_path / "ordered" / "model.safetensors")["fc.weight"], ordered.heads.fc.weight)


def test_eagle3_heads_written_in_the_speculators_format(tmp_path) -> None:
    model = _eagle3(torch.arange(8, 60), norm_before_residual=False)
    model.config.base_model_name_or_path = "org/base"
    export_heads(model, tmp_path, "vllm", dtype=torch.bfloat16, layout="speculators")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["transformer_layer_config"]["hidden_size"] == HIDDEN
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert (config["draft_vocab_size"], config["norm_before_residual"]) == (52, False)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3]
    assert config["transformer_layer_config"]["num_aux_hidden_states"] == 2
    method = config["speculators_config"]["proposal_methods"][0]
    assert method["speculative_tokens"] == 3 and config["speculators_config"]["verifier"]["name_or_path"] == "org/base"
    weights = load_file(tmp_path / "model.safetensors")
    assert {key for key in weights if key.startswith("layers.0.")} == {f"layers.0.{key}" for key in LAYER_KEYS}
    assert weights["fc.weight"].dtype == torch.bfloat16 and weights["d2t"].dtype == torch.int64
    loaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=model.base, heads_dtype=torch.float32)
    assert loaded.config.num_heads == 3 and loaded.config.base_model_name_or_path == "org/base"
    state = loaded.heads.state_dict()
    for key, value in model.heads.state_dict().items():
        if key == "fc.weight":  # layer 3's two blocks summed
            value = torch.cat([value[:, :HIDDEN], value[:, HIDDEN : 2 * HIDDEN] + value[:, 2 * HIDDEN :]], dim=1)
        expected = value.to(torch.bfloat16).float() if value.is_floating_point() else value
        assert key == UNUSED_EMBEDDING or torch.equal(state[key], expected)


def test_eagle1_drafts_are_written_back_as_eagle1(tmp_path) -> None:
    base = tiny_model("llama", seed=0, num_layers=6, sharpen=4.0)
    release = write_eagle1(tmp_path / "release", eagle1_weights(bias=False), pickled=False)
    model = MedusaForCausalLM.from_pretrained(tmp_path / "release", base_model=base)
    export_heads(model, tmp_path / "vllm", "vllm", dtype=torch.float32)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["bias"] is False and config["vocab_size"] == VOCAB
    weights = load_file(tmp_path / "vllm" / "model.safetensors")
    expected = {k: v for k, v in release.items() if k != "embed_tokens.weight"}  # vLLM takes the target's
    assert set(weights) == set(expected) and all(torch.equal(weights[k], expected[k]) for k in expected)
    assert "layers.0.input_layernorm.weight" not in weights
    _same_heads(MedusaForCausalLM.from_pretrained(tmp_path / "vllm", base_model=base), model)


def test_what_vllm_would_compute_otherwise_is_refused(tmp_path) -> None:
    base = tiny_model("llama", seed=0, num_layers=6)
    write_eagle1(tmp_path / "biased", eagle1_weights(bias=True))
    biased = MedusaForCausalLM.from_pretrained(tmp_path / "biased", base_model=base)
    with pytest.raises(ValueError, match=r"bias on fc, which vLLM 0\.32 drops"):
        export_heads(biased, tmp_path / "out", "vllm")
    own = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle", num_heads=2))
    with pytest.raises(ValueError, match=r"library's own EAGLE heads.*neither EAGLE-1.*nor EAGLE-3"):
        export_heads(own, tmp_path / "out", "vllm")
    eagle3 = _eagle3()
    for engine in ("tgi", "tensorrt-llm"):
        with pytest.raises(ValueError, match=r"serve them with vLLM \(--to vllm\)"):
            export_heads(eagle3, tmp_path / "out", engine)
    with pytest.raises(ValueError, match="Unknown layout 'sglang'"):
        export_heads(eagle3, tmp_path / "out", "vllm", layout="sglang")
    with pytest.raises(ValueError, match="speculators format holds EAGLE-3 drafts"):
        export_heads(biased, tmp_path / "out", "vllm", layout="speculators")
    medusa = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2))
    with pytest.raises(ValueError, match="'speculators' layout holds EAGLE-3 drafts"):
        export_heads(medusa, tmp_path / "out", "vllm", layout="speculators")
    assert not (tmp_path / "out").exists()


def test_eagle3_heads_on_a_lora_trained_base_need_the_merged_base(tmp_path) -> None:
    from peft import LoraConfig, get_peft_model

    model = _eagle3()
    model.base.save_pretrained(tmp_path / "base")
    model.config.base_model_name_or_path = str(tmp_path / "base")
    model.base = get_peft_model(model.base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.save_pretrained(tmp_path / "heads")
    with pytest.raises(ValueError, match=r"LoRA adapters on their base.*--merge-base-into"):
        export_heads(model, tmp_path / "out", "vllm")
    with pytest.raises(ValueError, match="LoRA adapters on their base"):
        export_pretrained(tmp_path / "heads", tmp_path / "out", "vllm", layout="speculators")
    assert not (tmp_path / "out").exists()
    export_pretrained(tmp_path / "heads", tmp_path / "out", "vllm", merged_base_dir=tmp_path / "merged")
    assert (tmp_path / "merged" / "config.json").exists()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "merged")


def test_export_command_writes_either_eagle3_layout(tmp_path, capsys) -> None:
    model = _eagle3(torch.arange(10, 70))
    model.base.save_pretrained(tmp_path / "base")
    model.config.base_model_name_or_path = str(tmp_path / "base")
    model.save_pretrained(tmp_path / "heads")
    for layout, key in (("published", "midlayer.hidden_norm.weight"), ("speculators", "layers.0.hidden_norm.weight")):
        command = ["export", str(tmp_path / "heads"), "--to", "vllm", "--out", str(tmp_path / layout)]
        assert main([*command, "--layout", layout]) == 0
        assert "wrote vllm heads" in capsys.readouterr().out
        weights = load_file(tmp_path / layout / "model.safetensors")
        assert key in weights and weights[key].dtype == torch.bfloat16  # the command's default dtype
    medusa = MedusaForCausalLM.from_base(model.base, MedusaConfig(num_heads=2))
    medusa.save_pretrained(tmp_path / "medusa")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "export",
                str(tmp_path / "medusa"),
                "--to",
                "vllm",
                "--out",
                str(tmp_path / "no"),
                "--layout",
                "speculators",
            ]
        )
    assert exit_info.value.code == 2 and "holds EAGLE-3 drafts" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()
