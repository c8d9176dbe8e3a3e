"""Published EAGLE drafts load through `MedusaForCausalLM.from_pretrained`: EAGLE-3 as SafeAILab, SpecForge and
AngelSlim release it, EAGLE-3 in the speculators format, EAGLE-1 as SafeAILab releases it and in vLLM's layout.
Random weights written in each layout compute what the papers' equations compute; drafts whose proposals are
known in closed form are accepted exactly as often as that form says; greedy output stays the base's."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig

from hf_specdec import DynamicTree, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.medusa.eagle import EagleHeads
from hf_specdec.medusa.eagle3 import Eagle3Heads
from tests.eagle_reference import eagle1_step, eagle3_step, rms
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

FREE = SpeculativeCosts(0.0, 0.0)  # every step drafts and every tree grows to its depth, whatever the clock says
NUM_LAYERS = 6  # the base's: EAGLE-3's default fused states are then the inputs of layers 2, 3 and 3


def _base(seed: int = 0):
    return tiny_model("llama", seed=seed, num_layers=NUM_LAYERS, sharpen=4.0)


def _states(base, length: int = 9, seed: int = 3) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    tokens = torch.randint(4, base.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return tokens, base(tokens, output_hidden_states=True).hidden_states


def _following(tokens: torch.Tensor) -> torch.Tensor:
    """The token after each position (the last position's is never read)."""
    return torch.cat([tokens[0, 1:], tokens[0, :1]])


def _check_eagle3(model, weights: dict, layer_ids: list[int], norm_before_residual: bool, prefix: str) -> None:
    """The loaded heads' first depth (features and draft-vocabulary logits) against EAGLE-3's equations."""
    heads, base = model.heads, model.base
    assert isinstance(heads, Eagle3Heads) and heads.feature_layers == tuple(layer_ids)
    published = {k.replace(prefix, "midlayer."): v for k, v in weights.items()}
    tokens, states = _states(base)
    fused = torch.cat([states[i] for i in layer_ids], dim=-1)
    config = LlamaConfig(**layer_config())
    with torch.no_grad():
        ours = heads.unroll(fused, tokens, base.get_input_embeddings(), depth=1)[0][0]
        logits = heads.project(ours, base.get_output_embeddings())
        embedded = base.get_input_embeddings()(_following(tokens))
        expected = eagle3_step(published, config, embedded, fused[0], torch.arange(9), norm_before_residual)
        expected_logits = rms(expected, weights["norm.weight"], config.rms_norm_eps) @ weights["lm_head.weight"].T
    torch.testing.assert_close(ours[:-1], expected[:-1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[:-1], expected_logits[:-1], rtol=1e-4, atol=1e-5)
    if "d2t" in weights:
        assert torch.equal(heads.token_ids, torch.arange(weights["d2t"].numel()) + weights["d2t"])


@pytest.mark.parametrize("pickled", [False, True])
def test_eagle3_release_computes_the_published_equations(tmp_path, pickled: bool) -> None:
    token_ids = draft_vocabulary(40)
    weights = write_eagle3(tmp_path, token_ids, layer_ids=[1, 2, 4], pickled=pickled)
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base())
    assert model.config.head_vocab_size == 40 and not model.config.norm_before_residual
    _check_eagle3(model, weights, [1, 2, 4], norm_before_residual=False, prefix="midlayer.")


def test_eagle3_release_without_layer_ids_fuses_the_default_states(tmp_path) -> None:
    weights = write_eagle3(tmp_path, None)  # the whole vocabulary: no d2t / t2d, as SafeAILab then saves
    assert "d2t" not in weights
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base())
    assert model.config.head_vocab_size is None and model.heads.token_ids is None
    _check_eagle3(model, weights, [2, 3, 3], norm_before_residual=False, prefix="midlayer.")


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_speculators_draft_computes_the_published_equations(tmp_path, norm_before_residual: bool) -> None:
    token_ids = draft_vocabulary(32, seed=1)
    weights = write_speculators(tmp_path, token_ids, [0, 3, 5], norm_before_residual)
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base())
    assert model.config.num_heads == 3  # the proposal's speculative_tokens
    assert model.config.norm_before_residual == norm_before_residual
    _check_eagle3(model, weights, [0, 3, 5], norm_before_residual, prefix="layers.0.")


@pytest.mark.parametrize(("bias", "pickled"), [(True, True), (False, False)])
def test_eagle1_release_computes_the_published_equations(tmp_path, bias: bool, pickled: bool) -> None:
    """SafeAILab's release (fc with a bias, pytorch_model.bin) and vLLM's layout (no bias, safetensors)."""
    weights = write_eagle1(tmp_path, eagle1_weights(bias=bias), pickled=pickled)
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base())
    heads, base = model.heads, model.base
    assert isinstance(heads, EagleHeads)
    assert (model.config.input_norms, model.config.fc_bias, model.config.share_lm_head) == (False, bias, True)
    tokens, states = _states(base)
    feature = states[-1]  # the base's last hidden state, after its final norm
    config = LlamaConfig(**layer_config(rms_norm_eps=1e-6))
    with torch.no_grad():
        ours = heads.unroll(feature, tokens, base.get_input_embeddings(), depth=1)[0][0]
        logits = heads.project(ours, base.get_output_embeddings())
        embedded = base.get_input_embeddings()(_following(tokens))
        expected = eagle1_step(weights, config, embedded, feature[0], torch.arange(9))
        expected_logits = base.get_output_embeddings()(expected)
    torch.testing.assert_close(ours[:-1], expected[:-1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[:-1], expected_logits[:-1], rtol=1e-4, atol=1e-5)


def _loaded(tmp_path, layout: str):
    base = _base()
    if layout == "eagle3":
        write_eagle3(tmp_path, draft_vocabulary(40), layer_ids=[1, 2, 4])
    elif layout == "speculators":
        write_speculators(tmp_path, draft_vocabulary(40), None, norm_before_residual=True)
    else:
        write_eagle1(tmp_path, eagle1_weights(bias=layout == "eagle1"), pickled=layout == "eagle1")
    return MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)


@pytest.mark.parametrize("layout", ["eagle3", "speculators", "eagle1", "eagle1-vllm"])
@pytest.mark.parametrize("batch", [1, 3])
def test_loaded_drafts_keep_plain_greedy(tmp_path, layout: str, batch: int) -> None:
    model = _loaded(tmp_path, layout)
    ids, mask = ragged_batch(batch, seed=batch)
    kwargs = {"max_new_tokens": 30, "do_sample": False}
    out = model.generate(
        input_ids=ids, attention_mask=mask, medusa=True, return_dict_in_generate=True, speculative_costs=FREE, **kwargs
    )
    assert torch.equal(out.sequences, model.base.generate(input_ids=ids, attention_mask=mask, **kwargs))
    assert out.speculative.summary()["drafted_tokens"] > 0


def _expected_accepted(sequence: list[int], prompt: int, depth: int, max_length: int, proposal) -> int:
    """Tokens a chain of `depth` drafts gets accepted over a greedy decode of `sequence` when every draft token is
    `proposal(last committed token)`: at each step the longest run of the next tokens equal to the proposal (no
    longer than the depth, nor than what still fits before `max_length`), then the base's own token."""
    accepted, length = 0, prompt
    while length < len(sequence):
        guess, run = proposal(sequence[length - 1]), 0
        budget = min(depth, max_length - 1 - length)
        while run < budget and length + run < len(sequence) and sequence[length + run] == guess:
            run += 1
        accepted += run
        length += run + 1
    return accepted


def _oracle_run(model, proposal) -> None:
    """Decode greedily with a chain of 3 drafts per step; the accepted tokens are what the closed form says."""
    depth, new = 3, 40
    ids, mask = ragged_batch(1, seed=5)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new,
        do_sample=False,
        medusa=True,
        tree=DynamicTree(num_nodes=depth, depth=depth, top_k=1),
        num_assistant_tokens_schedule="constant",
        speculative_costs=FREE,
        return_dict_in_generate=True,
    )
    plain = model.base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    assert torch.equal(out.sequences, plain)
    sequence = out.sequences[0].tolist()
    expected = _expected_accepted(sequence, ids.shape[1], depth, ids.shape[1] + new, proposal)
    assert expected > 0  # the base repeats itself: the check is not vacuous
    assert out.speculative.summary()["accepted_tokens"] == expected


def _silence_last_layer(base) -> None:
    """Make the base's last layer the identity (its attention and MLP add nothing), so that the input of that
    layer, after the final norm, is what the base's lm_head reads."""
    layer = base.model.layers[-1]
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


def test_eagle1_draft_repeating_the_last_token_is_accepted_as_its_closed_form_says(tmp_path) -> None:
    """fc = [0 | I] and a layer that adds nothing: the draft's feature is the base's last feature, and the base's
    lm_head on it proposes the token the base already chose, at every depth."""
    weights = eagle1_weights(bias=True)
    weights["fc.weight"] = torch.cat([torch.zeros(64, 64), torch.eye(64)], dim=1)
    weights["fc.bias"].zero_()
    weights["layers.0.self_attn.o_proj.weight"].zero_()
    weights["layers.0.mlp.down_proj.weight"].zero_()
    write_eagle1(tmp_path, weights)
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base(seed=2))
    _oracle_run(model, lambda last: last)


def test_eagle3_draft_repeating_the_last_token_is_accepted_as_its_closed_form_says(tmp_path) -> None:
    """fc picks the input of the base's last layer (which adds nothing), the layer adds nothing, and norm and
    lm_head are the base's: over the whole vocabulary, the draft proposes the token the base already chose."""
    base = _base(seed=0)
    _silence_last_layer(base)
    weights = eagle3_weights(None)
    weights["fc.weight"] = torch.cat([torch.zeros(64, 128), torch.eye(64)], dim=1)
    weights["midlayer.self_attn.o_proj.weight"].zero_()
    weights["midlayer.mlp.down_proj.weight"].zero_()
    weights["norm.weight"] = base.model.norm.weight.detach().clone()
    weights["lm_head.weight"] = base.lm_head.weight.detach().clone()
    write_eagle3(tmp_path, None, layer_ids=[1, 2, NUM_LAYERS - 1], weights=weights)
    config = tmp_path / "config.json"
    config.write_text(
        config.read_text().replace('"rms_norm_eps": 1e-05', f'"rms_norm_eps": {base.config.rms_norm_eps}')
    )
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    _oracle_run(model, lambda last: last)


def test_eagle3_draft_with_a_zero_lm_head_proposes_its_first_token(tmp_path) -> None:
    """A zero lm_head scores the draft vocabulary alike: the draft proposes its first token, d2t[0], every time."""
    base = _base(seed=2)
    ids, mask = ragged_batch(1, seed=5)
    plain = base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False)[0].tolist()
    frequent = max(set(plain[ids.shape[1] :]), key=plain[ids.shape[1] :].count)
    token_ids = torch.tensor(sorted({frequent, 95, 90, 91}))[:3]  # the frequent token first
    assert token_ids[0] == frequent
    weights = eagle3_weights(token_ids)
    weights["lm_head.weight"].zero_()
    write_eagle3(tmp_path, token_ids, weights=weights)
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    _oracle_run(model, lambda last: frequent)


def test_stored_embeddings_are_not_read(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """The drafts read the base's embeddings, as the published code and vLLM do; a log line says so when the
    stored ones differ."""
    weights = write_eagle3(tmp_path, draft_vocabulary(40))
    base = _base()
    with caplog.at_level(logging.INFO, logger="hf_specdec.medusa.eagle_importer"):
        model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert "the base's are used" in caplog.text
    assert not any(torch.equal(p, weights["embed_tokens.weight"]) for p in model.heads.state_dict().values())


def test_a_folder_of_no_known_layout_lists_every_layout_and_its_files(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}')
    (tmp_path / "notes.txt").write_text("weights elsewhere")
    with pytest.raises(ValueError, match="no heads there") as error:
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=_base())
    message = str(error.value)
    for layout in (
        "medusa_config.json",
        "medusa_lm_head.pt",
        "model_type: medusa",
        "LlamaForCausalLMEagle3",
        "speculators_model_type: eagle3",
        "EAGLE-1",
        "medusa_num_heads",
    ):
        assert layout in message
    assert "Found there: config.json, notes.txt" in message


def test_drafts_this_library_cannot_compute_are_refused_with_the_reason(tmp_path) -> None:
    write_eagle3(tmp_path / "no-weights", None)
    (tmp_path / "no-weights" / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="an EAGLE-3 config but no weights"):
        MedusaForCausalLM.from_pretrained(tmp_path / "no-weights", base_model=_base())
    write_eagle3(tmp_path / "fc-norm", None)
    config = tmp_path / "fc-norm" / "config.json"
    config.write_text(config.read_text().replace('"hidden_size"', '"norm_before_fc": true, "hidden_size"'))
    with pytest.raises(ValueError, match=r"the EAGLE-3 draft has no 'input_norm\.weight'"):
        MedusaForCausalLM.from_pretrained(tmp_path / "fc-norm", base_model=_base())
    token_ids = draft_vocabulary(40)
    weights = eagle3_weights(token_ids)
    weights["t2d"] = weights["t2d"].roll(1)
    write_eagle3(tmp_path / "t2d", token_ids, weights=weights)
    with pytest.raises(ValueError, match="`t2d` and `d2t` describe different draft vocabularies"):
        MedusaForCausalLM.from_pretrained(tmp_path / "t2d", base_model=_base())
    weights = eagle1_weights()
    weights["layers.0.input_layernorm.weight"] = torch.ones(64)
    write_eagle1(tmp_path / "input-norm", weights)
    with pytest.raises(ValueError, match=r"unexpected key 'layers\.0\.input_layernorm\.weight'"):
        MedusaForCausalLM.from_pretrained(tmp_path / "input-norm", base_model=_base())


def test_eagle1_options_belong_to_eagle_heads() -> None:
    from hf_specdec import MedusaConfig

    for options in ({"input_norms": False}, {"fc_bias": True}):
        with pytest.raises(ValueError, match="describe EAGLE heads' input"):
            MedusaConfig(head_type="eagle3", **options)
    with pytest.raises(TypeError, match="input_norms must be True or False"):
        MedusaConfig(head_type="eagle", input_norms="no")
    base = tiny_model("qwen2", seed=0, sharpen=4.0)  # EAGLE-1's options on a decoder of the base's architecture
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle", input_norms=False, fc_bias=True))
    assert model.heads.fc.bias is not None and isinstance(model.heads.token_norm, torch.nn.Identity)
    assert isinstance(model.heads.decoder.layers[0].input_layernorm, torch.nn.Identity)
    ids, mask = ragged_batch(2, seed=1)
    kwargs = {"max_new_tokens": 20, "do_sample": False}
    out = model.generate(input_ids=ids, attention_mask=mask, medusa=True, speculative_costs=FREE, **kwargs)
    assert torch.equal(out, base.generate(input_ids=ids, attention_mask=mask, **kwargs))
    with pytest.raises(ValueError, match="need a Llama-style decoder"):
        MedusaForCausalLM.from_base(tiny_model("gpt2", seed=0), MedusaConfig(head_type="eagle", input_norms=False))


def test_the_recipe_fine_tunes_a_published_eagle3_draft(tmp_path, capsys) -> None:
    """`--init_heads` with a published EAGLE-3 folder: the data work keeps the states its layers fuse, training
    starts from its weights, and the heads saved are EAGLE-3 heads of the same layers and draft vocabulary."""
    import json

    import safetensors.torch

    from tests.recipe import recipe_main
    from tests.test_training import _conversations, tiny_tokenizer

    base_dir, draft_dir, out = tmp_path / "base", tmp_path / "draft", tmp_path / "out"
    _base().save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    token_ids = draft_vocabulary(40)
    weights = write_eagle3(draft_dir, token_ids, layer_ids=[1, 2, 4])
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(12, seed=3)))
    recipe_main()(
        [
            "--base", str(base_dir), "--data", str(data), "--cache_hidden_states", "--init_heads", str(draft_dir),
            "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--learning_rate", "1e-2", "--eval_fraction", "0.25", "--report_to", "none", "--save_strategy", "no",
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out  # the recipe ends with what it measured and how to benchmark the heads
    assert "Held-out accuracy by depth: top-1 " in printed and f"--medusa {out} " in printed
    config = json.loads((out / "medusa_config.json").read_text())
    assert config["head_type"] == "eagle3" and config["feature_layers"] == [1, 2, 4]
    assert config["extra"]["initialised_from"] == str(draft_dir) and config["measured_top1"]
    trained = MedusaForCausalLM.from_pretrained(out, base_model=_base())
    assert torch.equal(trained.heads.token_ids, token_ids)
    heads = safetensors.torch.load_file(out / "medusa_heads.safetensors")
    fc = next(v for k, v in heads.items() if k.endswith("fc.weight"))
    assert fc.shape == weights["fc.weight"].shape and not torch.equal(fc, weights["fc.weight"])  # it trained
