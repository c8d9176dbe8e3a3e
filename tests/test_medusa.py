"""MedusaForCausalLM: greedy identity, heads that are right, batches, checkpoints, errors."""

from __future__ import annotations

import json

import pytest
import torch

from hf_specdec import MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.medusa.loss import IGNORE_INDEX, head_accuracy, head_labels
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model


def _generate(model, ids, mask, **kwargs):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False, **kwargs)


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree", ["chain", "medium"])
def test_random_heads_keep_plain_greedy(arch: str, batch: int, tree: str) -> None:
    base = tiny_model(arch, seed=0, sharpen=4.0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, share_lm_head=arch != "gpt2"))
    ids, mask = ragged_batch(batch, seed=batch)
    plain = _generate(base, ids, mask)
    assert torch.equal(_generate(model, ids, mask, medusa=True, tree=tree), plain)


def _fit_heads(model: MedusaForCausalLM, sequences: torch.Tensor, steps: int = 150, lr: float = 3e-2) -> None:
    """Train the heads (of either kind) on the base's own greedy continuations until they are (mostly) right."""
    optimizer = torch.optim.Adam(model.heads.parameters(), lr=lr)
    with torch.no_grad():
        hidden = model.base(sequences, output_hidden_states=True).hidden_states[-1]
    for _ in range(steps):
        loss = model(input_ids=sequences, labels=sequences, hidden_states=hidden)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_heads_that_are_right_accept_long_paths_and_keep_identity() -> None:
    base = tiny_model("llama", seed=0, sharpen=4.0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, num_layers=1, share_lm_head=False))
    ids, mask = ragged_batch(3, seed=4)
    plain = _generate(base, ids, mask)
    _fit_heads(model, plain)
    free = SpeculativeCosts(0.0, 0.0)  # every step drafts, whatever the clock says
    out = _generate(model, ids, mask, medusa=True, tree="small", return_dict_in_generate=True, speculative_costs=free)
    assert torch.equal(out.sequences, plain)
    assert out.speculative.summary()["tau"] > 2.5


def test_head_labels_by_hand() -> None:
    labels = torch.tensor([[10, 11, 12, 13, 14]])
    assert head_labels(labels, 0).tolist() == [[12, 13, 14, IGNORE_INDEX, IGNORE_INDEX]]
    assert head_labels(labels, 2).tolist() == [[14] + [IGNORE_INDEX] * 4]
    assert head_labels(labels, 5).tolist() == [[IGNORE_INDEX] * 5]


def test_accuracy_of_a_perfect_head() -> None:
    labels = torch.tensor([[1, 2, 3, 4, 0, 1]])
    logits = torch.full((1, 1, 6, 5), -10.0)
    for i, token in enumerate(head_labels(labels, 0)[0].tolist()):
        if token != IGNORE_INDEX:
            logits[0, 0, i, token] = 10.0
    assert head_accuracy(logits, labels).tolist() == [1.0]


def test_heads_have_independent_weights() -> None:
    model = MedusaForCausalLM.from_base(tiny_model("llama", seed=0), MedusaConfig(num_heads=2, num_layers=2))
    blocks = [block for head in model.heads.blocks for block in head]
    assert len({id(b.linear.weight) for b in blocks}) == 4


def test_save_and_load_round_trip(tmp_path) -> None:
    base = tiny_model("qwen2", seed=0, sharpen=4.0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, share_lm_head=False, tree=[[0], [1], [0, 0]]))
    with torch.no_grad():
        for parameter in model.heads.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "medusa_config.json", "medusa_heads.safetensors"]
    reloaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    for (name, a), (_, b) in zip(model.heads.state_dict().items(), reloaded.heads.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert reloaded.default_tree().choices == ((0,), (1,), (0, 0))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no heads there"):
        MedusaForCausalLM.from_pretrained(tmp_path / "empty", base_model=base)
    ids, mask = ragged_batch(2)
    assert torch.equal(_generate(reloaded, ids, mask, medusa=True), _generate(base, ids, mask))


def test_loading_the_original_medusa_format(tmp_path) -> None:
    """`medusa_lm_head.pt` holds `ModuleList(Sequential(ResBlock, ..., Linear))` weights."""
    base = tiny_model("llama", seed=0)
    hidden, vocab = base.config.hidden_size, base.config.vocab_size
    state = {}
    for head in range(2):
        state[f"{head}.0.linear.weight"] = torch.randn(hidden, hidden)
        state[f"{head}.0.linear.bias"] = torch.randn(hidden)
        state[f"{head}.1.weight"] = torch.randn(vocab, hidden)
    torch.save(state, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    model = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert torch.equal(model.heads.projections[1].weight, state["1.1.weight"])
    assert torch.equal(model.heads.blocks[0][0].linear.bias, state["0.0.linear.bias"])


def test_errors() -> None:
    base = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="belong to another base model"):
        MedusaForCausalLM(base, MedusaConfig(num_heads=2, hidden_size=999))
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2))
    ids, mask = ragged_batch(1)
    with pytest.raises(ValueError, match="only 2 heads"):
        _generate(model, ids, mask, medusa=True, tree=[[0], [0, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="no parent"):
        _generate(model, ids, mask, medusa=True, tree=[[0, 0]])
    with pytest.raises(ValueError, match="sampling rule"):
        _generate(model, ids, mask, medusa=True, medusa_acceptance="typical")
    with pytest.raises(ValueError, match="apply with `medusa=True` only"):
        _generate(model, ids, mask, tree="small")
    with pytest.raises(ValueError, match="num_heads"):
        MedusaConfig(num_heads=0)


@pytest.mark.parametrize(
    "processing", [{"repetition_penalty": 1.5}, {"min_new_tokens": 12, "eos_token_id": 5}, {"no_repeat_ngram_size": 2}]
)
def test_prefix_reading_processors_see_each_paths_prefix(processing: dict) -> None:
    """Processors that read the generated prefix are applied path by path: identity with plain greedy
    holds with heads that are right (long accepted paths) and a branching tree."""
    base = tiny_model("llama", seed=0, sharpen=4.0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, share_lm_head=False))
    ids, mask = ragged_batch(3, seed=11)
    _fit_heads(model, _generate(base, ids, mask), steps=80)
    kwargs = dict(pad_token_id=0, **processing)
    free = SpeculativeCosts(0.0, 0.0)  # every step drafts: the tiny heads cost as much as the tiny base here
    out = _generate(
        model, ids, mask, medusa=True, tree="medium", return_dict_in_generate=True, speculative_costs=free, **kwargs
    )
    assert torch.equal(out.sequences, _generate(base, ids, mask, **kwargs))
    assert out.speculative.summary()["tau"] > 1.3


def test_trees_sized_from_measured_accuracies() -> None:
    base = tiny_model("llama", seed=0, sharpen=4.0)
    measured = [[0.6, 0.2, 0.1], [0.3, 0.2, 0.1], [0.1, 0.05, 0.0]]
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3, measured_accuracy=measured))
    tree = model.sized_tree(4)
    assert tree.num_nodes == 5  # the root and 4 candidates
    assert set(tree.choices) == {(0,), (1,), (0, 0), (0, 1)}  # the four likeliest paths: .6, .2, .18, .12
    assert set(tree.choices) <= set(model.sized_tree(6).choices)
    ids, mask = ragged_batch(2, seed=5)
    plain = _generate(base, ids, mask)
    assert torch.equal(_generate(model, ids, mask, medusa=True, tree=4), plain)
    with pytest.raises(ValueError, match="positive number"):
        model.sized_tree(0)


def test_a_heads_model_answers_like_a_transformers_model() -> None:
    """`.device`, `.dtype` and `.generation_config` are the base's, as code written for transformers models reads
    them; setting the generation config sets the base's, which `generate()` starts from."""
    from transformers import GenerationConfig

    base = tiny_model("llama", seed=0).to(torch.bfloat16)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2))
    assert model.device == base.device and model.dtype == torch.bfloat16
    config = GenerationConfig(max_new_tokens=3, do_sample=False)
    model.generation_config = config
    assert base.generation_config is config and model.generation_config is config
