"""Heads published in FasterDecoding's layouts load: Medusa-1 `.pt`, safetensors, a config that counts fewer
heads than the file holds, Medusa-2 heads that project with the base's lm_head, a folder with the weights alone,
a whole Medusa-2 model; pickles are read with `weights_only=True`."""

from __future__ import annotations

import json
import logging
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_specdec import MedusaForCausalLM
from tests.engine_loaders import vllm_logits
from tests.tiny_models import tiny_model


def _numbered(base, num_heads: int, num_layers: int, projections: bool, prefix: str = "") -> dict[str, torch.Tensor]:
    hidden, vocab = base.config.hidden_size, base.config.vocab_size
    torch.manual_seed(0)
    state = {}
    for head in range(num_heads):
        for layer in range(num_layers):
            state[f"{prefix}{head}.{layer}.linear.weight"] = 0.1 * torch.randn(hidden, hidden)
            state[f"{prefix}{head}.{layer}.linear.bias"] = 0.1 * torch.randn(hidden)
        if projections:
            state[f"{prefix}{head}.{num_layers}.weight"] = torch.randn(vocab, hidden)
    return state


def _reference_logits(state: dict[str, torch.Tensor], hidden: torch.Tensor, lm_head: torch.Tensor, num_heads: int):
    """FasterDecoding's `medusa_head[k](hidden)`: ResBlocks then the head's Linear (the base's lm_head when absent)."""
    out = []
    for k in range(num_heads):
        x, layer = hidden, 0
        while f"{k}.{layer}.linear.weight" in state:
            x = x + torch.nn.functional.silu(
                torch.nn.functional.linear(x, state[f"{k}.{layer}.linear.weight"], state[f"{k}.{layer}.linear.bias"])
            )
            layer += 1
        out.append(torch.nn.functional.linear(x, state.get(f"{k}.{layer}.weight", lm_head)))
    return torch.stack(out)


def _check(model: MedusaForCausalLM, state: dict[str, torch.Tensor], num_heads: int) -> None:
    hidden = torch.randn(3, model.config.hidden_size)
    lm_head = model.base.get_output_embeddings()
    expected = _reference_logits(state, hidden, lm_head.weight, num_heads)
    torch.testing.assert_close(model.heads(hidden, lm_head), expected)


def test_medusa_1_pt_whose_config_counts_fewer_heads_than_it_holds(tmp_path, caplog) -> None:
    """FasterDecoding/medusa-vicuna-7b-v1.3 says `medusa_num_heads: 2` and holds 4 heads."""
    base = tiny_model("llama", seed=0)
    state = _numbered(base, num_heads=4, num_layers=1, projections=True)
    torch.save(state, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with caplog.at_level(logging.WARNING):
        model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert "medusa_num_heads=2 but the weights hold 4" in caplog.text
    assert model.config.num_heads == 4 and not model.config.share_lm_head
    _check(model, state, 4)


def test_safetensors_with_shared_resblocks_of_the_original_trainer(tmp_path) -> None:
    """`[ResBlock(h)] * n` in the original code saves one block under every layer's name."""
    base = tiny_model("qwen2", seed=0)
    state = _numbered(base, num_heads=2, num_layers=2, projections=True)
    for head in range(2):
        state[f"{head}.1.linear.weight"] = state[f"{head}.0.linear.weight"].clone()
        state[f"{head}.1.linear.bias"] = state[f"{head}.0.linear.bias"].clone()
    save_file(state, tmp_path / "medusa_lm_head.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 2}))
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert model.config.num_layers == 2
    _check(model, state, 2)


def test_medusa_2_heads_on_the_base_lm_head_and_weights_alone(tmp_path) -> None:
    """Medusa-2 checkpoints (TGI's "medusa v2") hold residual blocks only; a folder without config loads too."""
    base = tiny_model("llama", seed=0)
    state = _numbered(base, num_heads=3, num_layers=1, projections=False, prefix="medusa_head.")
    save_file(state, tmp_path / "medusa_lm_head.safetensors")
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert model.config.share_lm_head and model.config.num_heads == 3
    _check(model, {k.removeprefix("medusa_head."): v for k, v in state.items()}, 3)
    with pytest.raises(ValueError, match="names no base model: pass `base_model=`"):
        MedusaForCausalLM.from_pretrained(tmp_path)


def test_a_whole_medusa_2_model_is_its_own_base(tmp_path) -> None:
    base = tiny_model("llama", seed=3)
    base.save_pretrained(tmp_path)
    heads = _numbered(base, num_heads=2, num_layers=1, projections=True, prefix="medusa_head.")
    weights = load_file(tmp_path / "model.safetensors")
    save_file({**weights, **heads}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "medusa_num_heads": 2, "medusa_num_layers": 1}))
    model = MedusaForCausalLM.from_pretrained(tmp_path)  # no base_model: the folder holds the trained base
    assert model.config.base_model_name_or_path == str(tmp_path)
    for name, tensor in base.state_dict().items():
        assert torch.equal(model.base.state_dict()[name], tensor), name
    _check(model, {k.removeprefix("medusa_head."): v for k, v in heads.items()}, 2)


def test_pickles_load_tensors_only_and_bad_files_say_why(tmp_path) -> None:
    base = tiny_model("llama", seed=0)
    state = _numbered(base, num_heads=1, num_layers=1, projections=True)
    torch.save({**state, "note": _NotATensor()}, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    torch.save({**state, "0.0.mlp.weight": torch.zeros(1)}, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match=r"unexpected key '0\.0\.mlp\.weight'"):
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    del state["0.0.linear.bias"]
    torch.save(state, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match=r"incomplete, missing \['blocks.0.0.linear.bias'\]"):
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)


def test_vllm_layout_with_a_token_map(tmp_path) -> None:
    """vLLM's draft-vocabulary layout (`truncated_vocab_size`, `token_map`, one full `lm_head.weight`), written by
    hand from its loader: the heads propose those ids, as vLLM's loader would score them."""
    base = tiny_model("llama", seed=0)
    hidden, vocab = base.config.hidden_size, base.config.vocab_size
    token_map = torch.arange(5, 65, 3)
    torch.manual_seed(0)
    weights = {"token_map": token_map, "lm_head.weight": base.get_output_embeddings().weight.detach().clone()}
    for k in range(2):
        weights[f"blocks.{k}.layers.0.weight"] = 0.1 * torch.randn(hidden, hidden)
        weights[f"blocks.{k}.layers.0.bias"] = 0.1 * torch.randn(hidden)
    save_file(weights, tmp_path / "model.safetensors")
    config = {"model_type": "medusa", "hidden_size": hidden, "vocab_size": vocab, "num_heads": 2}
    config |= {"num_hidden_layers": 1, "truncated_vocab_size": len(token_map), "medusa_fc_bias": True}
    (tmp_path / "config.json").write_text(json.dumps({**config, "original_lm_head": True}))
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert model.config.share_lm_head and torch.equal(model.heads.token_ids, token_map)
    states = torch.randn(4, hidden)
    served = vllm_logits(tmp_path, states, 2)[..., token_map]
    torch.testing.assert_close(model.heads(states, base.get_output_embeddings()), served)


class _NotATensor:
    """Pickled by reference: `weights_only=True` refuses to import it."""
