"""EAGLE-style heads (`MedusaConfig(head_type="eagle")`): greedy identity on every architecture, every tree node's
candidates equal to a from-scratch computation (cache, pending entries and plain steps included), training
unrolled as decoding drafts, heads that are right, checkpoints, errors."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.generation.decisions import SpeculationGate
from hf_specdec.medusa.eagle import EagleHeads, drop_final_norm, eagle_tree
from hf_specdec.medusa.eagle_drafter import EagleDrafter
from hf_specdec.medusa.sequence_heads import chain_starts, context_visibility, unrolled_visibility
from tests.test_medusa import _fit_heads, _generate
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model

FREE = SpeculativeCosts(0.0, 0.0)  # every step drafts and every tree grows to its depth, whatever the clock says


def _eagle(arch: str = "llama", noise: float = 0.5, seed: int = 0, **config) -> MedusaForCausalLM:
    """EAGLE heads on a tiny base, perturbed so that their candidates vary with what they read."""
    base = tiny_model(arch, seed=0, sharpen=4.0)
    torch.manual_seed(seed)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle", **{"num_heads": 3, **config}))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.heads.parameters():
            scale = noise * parameter.abs().mean().clamp_min(0.05)
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return model.eval()


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
def test_random_eagle_heads_keep_plain_greedy(arch: str, batch: int) -> None:
    model = _eagle(arch, share_lm_head=arch != "gpt2")
    assert isinstance(model.heads, EagleHeads)
    ids, mask = ragged_batch(batch, seed=batch)
    out = _generate(model, ids, mask, medusa=True, return_dict_in_generate=True, speculative_costs=FREE)
    assert torch.equal(out.sequences, _generate(model.base, ids, mask))


def _record_proposals(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every proposal EagleDrafter makes, with the committed tokens of each active row at that moment."""
    records: list[dict] = []
    propose = EagleDrafter.propose

    def recording(self, buffer, last_token, next_position, costs, max_tokens):
        proposal = propose(self, buffer, last_token, next_position, costs, max_tokens)
        lengths = buffer.active_lengths
        committed = [buffer.tokens[row, :length].clone() for row, length in zip(buffer.active, lengths, strict=True)]
        records.append(
            {"rows": buffer.active.clone(), "committed": committed, "nodes": proposal.nodes, "trees": proposal.trees}
        )
        return proposal

    monkeypatch.setattr(EagleDrafter, "propose", recording)
    return records


@pytest.mark.parametrize("plain_every", [0, 2])
def test_every_node_gets_the_candidates_of_its_own_path(plain_every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Brute force: each node's children are the head's top candidates after its path, computed from scratch by
    unrolling the head over the row's committed tokens and the path (the base's features on them): the cache,
    its rollback after every step, the pending entries and plain steps all have to be right for this to hold."""
    model = _eagle("qwen2")
    with torch.no_grad():  # sharp attention: a position or a key off by one changes the candidates
        for name, parameter in model.heads.decoder.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(12.0)
    records = _record_proposals(monkeypatch)
    if plain_every:
        calls = iter(range(10**6))

        def sometimes_plain(self: SpeculationGate, rows: int) -> bool:
            return next(calls) % plain_every != 1

        monkeypatch.setattr(SpeculationGate, "speculate", sometimes_plain)
    ids, mask = ragged_batch(3, seed=7)
    tree = DynamicTree(num_nodes=8, depth=3, top_k=3)
    out = _generate(model, ids, mask, medusa=True, tree=tree, return_dict_in_generate=True, speculative_costs=FREE)
    assert torch.equal(out.sequences, _generate(model.base, ids, mask))
    heads, base = model.heads, model.base
    lm_head, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    padding = (mask == 0).sum(dim=1)
    checked = 0
    for record in records[:6]:
        for i, row in enumerate(record["rows"].tolist()):
            committed = record["committed"][i][int(padding[row]) :]  # the row's real tokens, the root last
            nodes, parents = record["nodes"][i], record["trees"].parents[i]
            for node in range(nodes.shape[0]):
                children = nodes[1:][parents[1:] == node]
                if children.numel() == 0:
                    continue
                path, walk = [], node
                while walk > 0:
                    path.insert(0, int(nodes[walk]))
                    walk = int(parents[walk])
                tokens = torch.cat([committed, torch.tensor(path, dtype=torch.long)])[None]
                with torch.no_grad():
                    hidden = base(tokens, output_hidden_states=True).hidden_states[-1]
                    features = heads.unroll(hidden, tokens, embeddings, depth=len(path) + 1)
                    logits = heads.project(features[len(path)][0, committed.numel() - 2], lm_head)
                top = logits.topk(3).indices
                assert bool(torch.isin(children, top).all()), (node, children, top)
                assert int(top[0]) in children.tolist()
                checked += 1
    assert checked > 10
    assert out.speculative.plain_steps > 0 if plain_every else out.speculative.plain_steps == 0


def test_unrolled_depths_see_their_chain_only() -> None:
    valid = torch.tensor([[True, True, True, True, False]])
    starts, slots = chain_starts(torch.ones_like(valid))  # every position starts a chain
    live = [slots & (starts + d < 5) for d in range(3)]
    seen = unrolled_visibility(valid, starts, live)[0]  # (5 chains, 5 keys of depth 0 + 2 depths x 5 chains)
    # The chain from position 1, at depth 2 (it stands for position 3), drafts from the real features up to 1: it
    # sees keys 0-1 of depth 0, its own entry of depth 1 and itself.
    assert seen[1].nonzero().flatten().tolist() == [0, 1, 5 + 1, 10 + 1]
    assert not seen[:, 4].any()  # padding is never a key of depth 0
    assert not seen[3, :5].any() and seen[3, 10 + 3]  # past the end: no context, but itself (no NaN)
    assert bool(context_visibility(valid)[0].diagonal().all())  # every query of depth 0 sees itself


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_unrolling_only_the_needed_chains_changes_none_of_their_features(arch: str) -> None:
    """Training unrolls the later depths only from labelled positions: their features are those of the whole
    unroll, on ragged rows."""
    model = _eagle(arch)
    heads = model.heads
    ids, mask = ragged_batch(3, seed=5)
    with torch.no_grad():
        hidden = model.base(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        embeddings = model.base.get_input_embeddings()
        everything = heads.unroll(hidden, ids, embeddings, mask, depth=3)
        needed = torch.zeros_like(mask, dtype=torch.bool)
        needed[0, 4:7] = needed[1, -3:] = needed[2, 7] = True
        needed[2, -1] = True  # a chain with no room for later depths
        some = heads.unroll(hidden, ids, embeddings, mask, depth=3, needed=needed)
    for depth, (full, part) in enumerate(zip(everything, some, strict=True)):
        torch.testing.assert_close(part[needed], full[needed], rtol=1e-5, atol=1e-5)
        assert depth == 0 or not part[~needed].any()  # the later depths ran only the needed chains
    assert not some[1][2, -1].any()  # past the end: zeros, as in the whole unroll
    assert some[1][needed].abs().sum() > 0


def test_heads_that_are_right_accept_long_paths_and_keep_identity() -> None:
    base = tiny_model("llama", seed=0, sharpen=4.0)
    torch.manual_seed(0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle", num_heads=3, share_lm_head=False))
    model.freeze_base()
    ids, mask = ragged_batch(3, seed=4)
    plain = _generate(base, ids, mask)
    _fit_heads(model, plain, steps=120, lr=1e-2)
    out = _generate(model, ids, mask, medusa=True, tree=8, return_dict_in_generate=True, speculative_costs=FREE)
    assert torch.equal(out.sequences, plain)
    assert out.speculative.summary()["tau"] > 2.5, out.speculative.summary()


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_the_head_leaves_its_decoder_unnormalised(arch: str) -> None:
    """EAGLE-1's layout: no final norm, so the output's scale is the decoder's to learn (see drop_final_norm)."""
    decoder = _eagle(arch).heads.decoder
    outside_layers = [
        name
        for name, module in decoder.named_modules()
        if "norm" in type(module).__name__.lower() and not any(part.isdigit() for part in name.split("."))
    ]
    assert outside_layers == []
    inputs = torch.randn(1, 4, decoder.config.hidden_size)
    with torch.no_grad():
        small, large = (decoder(inputs_embeds=x).last_hidden_state for x in (inputs, 10 * inputs))
    assert large.norm() > 5 * small.norm()  # a final norm would make them the same size


def test_a_decoder_without_one_final_norm_is_refused() -> None:
    decoder = _eagle("llama").heads.decoder
    with pytest.raises(ValueError, match="final norm"):
        drop_final_norm(decoder)  # already dropped: no norm left outside the layers


def test_training_reports_the_feature_loss_and_trains_only_the_head() -> None:
    model = _eagle("gpt2", share_lm_head=False).freeze_base()
    ids = torch.randint(4, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    result = model(input_ids=ids, labels=ids, attention_mask=torch.ones_like(ids))
    assert result["per_head_loss"].shape == (3,) and result["per_head_feature_loss"].shape == (3,)
    result["loss"].backward()
    assert all(p.grad is None for p in model.base.parameters())
    assert model.heads.fc.weight.grad is not None and model.heads.fc.weight.grad.abs().sum() > 0
    logits = model(input_ids=ids)["head_logits"]
    assert logits.shape == (3, 2, 10, 96)


def test_save_and_load_round_trip(tmp_path) -> None:
    model = _eagle("mistral", num_layers=1)
    model.save_pretrained(tmp_path)
    loaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=model.base)
    assert isinstance(loaded.heads, EagleHeads) and loaded.config.head_type == "eagle"
    for (name, a), (_, b) in zip(model.heads.state_dict().items(), loaded.heads.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids, mask = ragged_batch(2, seed=3)
    kwargs = {"medusa": True, "speculative_costs": FREE}
    assert torch.equal(_generate(loaded, ids, mask, **kwargs), _generate(model, ids, mask, **kwargs))


def test_heads_saved_with_a_final_norm_are_refused_with_what_to_do(tmp_path) -> None:
    """EAGLE heads saved before the decoder lost its final norm carry its weight: loading says to retrain."""
    from safetensors.torch import load_file, save_file

    model = _eagle("llama", num_layers=1)
    model.save_pretrained(tmp_path)
    weights = tmp_path / "medusa_heads.safetensors"
    state = load_file(weights)
    state["decoder.norm.weight"] = torch.ones(model.base.config.hidden_size)
    save_file(state, weights)
    with pytest.raises(ValueError, match=r"unexpected.*decoder\.norm\.weight.*retrain them"):
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=model.base)


def test_prompt_lookup_grafted_on_eagle_trees_keeps_plain_greedy() -> None:
    model = _eagle("llama")
    ids, mask = ragged_batch(3, seed=5)
    ids = torch.cat([ids, ids[:, -6:], ids[:, -6:]], dim=1)  # repeats for the lookup to find
    mask = torch.cat([mask, torch.ones_like(ids[:, :12])], dim=1)
    out = _generate(
        model, ids, mask, medusa=True, prompt_lookup_num_tokens=4, return_dict_in_generate=True, speculative_costs=FREE
    )
    assert torch.equal(out.sequences, _generate(model.base, ids, mask))
    assert out.speculative.lookup_steps > 0


def test_trees_and_errors() -> None:
    assert eagle_tree(None, 5) == DynamicTree(num_nodes=16, depth=5, top_k=4)
    assert eagle_tree(6, 2) == DynamicTree(num_nodes=6, depth=2, top_k=4)
    assert eagle_tree(DynamicTree(num_nodes=4, top_k=2), 3) == DynamicTree(num_nodes=4, depth=3, top_k=2)
    model = _eagle("llama")
    ids, mask = ragged_batch(1, seed=1)
    with pytest.raises(ValueError, match="grow a tree per row"):
        _generate(model, ids, mask, medusa=True, tree="medium")
    with pytest.raises(ValueError, match="at least one decoder layer"):
        MedusaForCausalLM.from_base(model.base, MedusaConfig(head_type="eagle", num_layers=0))
