"""EAGLE-3 heads (`MedusaConfig(head_type="eagle3")`): the published architecture computed from its equations,
greedy identity on every architecture and batch size, the sampling distribution, every node's candidates equal
to a from-scratch computation, training that makes them right, checkpoints, errors."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.generation.decisions import SpeculationGate
from hf_specdec.medusa.eagle3 import Eagle3Heads, default_feature_layers
from hf_specdec.medusa.eagle_drafter import EagleDrafter
from tests.eagle_reference import eagle3_step, rms
from tests.test_medusa import _generate
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model

FREE = SpeculativeCosts(0.0, 0.0)  # every step drafts and every tree grows to its depth, whatever the clock says


def _eagle3(arch: str = "llama", noise: float = 0.5, seed: int = 0, num_layers: int = 4, **config) -> MedusaForCausalLM:
    """EAGLE-3 heads on a tiny base, perturbed so that their candidates vary with what they read."""
    base = tiny_model(arch, seed=0, num_layers=num_layers, sharpen=4.0)
    torch.manual_seed(seed)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle3", **{"num_heads": 3, **config}))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.heads.parameters():
            scale = noise * parameter.abs().mean().clamp_min(0.05)
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return model.eval()


def _published_names(heads: Eagle3Heads) -> dict[str, torch.Tensor]:
    return {k.replace("decoder.layers.0.", "midlayer."): v for k, v in heads.state_dict().items()}


def test_first_depth_equals_the_published_equations() -> None:
    model = _eagle3("qwen2", num_layers=6)
    heads, base = model.heads, model.base
    assert heads.feature_layers == (2, 3, 3) == tuple(default_feature_layers(6))
    tokens = torch.randint(0, base.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        states = base(tokens, output_hidden_states=True).hidden_states
        fused = torch.cat([states[i] for i in heads.feature_layers], dim=-1)
        ours = heads.unroll(fused, tokens, base.get_input_embeddings(), depth=1)[0][0]
        following = torch.cat([tokens[0, 1:], tokens[0, :1]])  # the last position's token is never read
        embedded = base.get_input_embeddings()(following)
        reference = eagle3_step(_published_names(heads), heads.decoder.config, embedded, fused[0], torch.arange(9))
        logits = heads.project(ours, base.get_output_embeddings())
        expected = rms(reference, heads.norm.weight, heads.decoder.config.rms_norm_eps) @ heads.lm_head.weight.T
    torch.testing.assert_close(ours[:-1], reference[:-1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[:-1], expected[:-1], rtol=1e-4, atol=1e-5)


def test_second_depth_reads_its_own_output() -> None:
    """Depth 1 at position t is the layer fed its own depth-0 output at t, with the token at t + 2, attending to
    the real entries up to t and to itself."""
    model = _eagle3("llama", num_layers=6)
    heads, base = model.heads, model.base
    tokens = torch.randint(0, base.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(4))
    embeddings = base.get_input_embeddings()
    with torch.no_grad():
        states = base(tokens, output_hidden_states=True).hidden_states
        fused = torch.cat([states[i] for i in heads.feature_layers], dim=-1)
        depth0, depth1 = heads.unroll(fused, tokens, embeddings, depth=2)
        t = 3  # the chain from position 3: depth 1 stands for position 4 and reads token 5
        real = heads.combine(heads.embed(tokens[:, 1 : t + 2], embeddings), heads.from_target(fused[:, : t + 1]))
        own = heads.combine(heads.embed(tokens[:, t + 2 : t + 3], embeddings), depth0[:, t : t + 1])
        out = heads.decoder(
            inputs_embeds=torch.cat([real, own], dim=1), position_ids=torch.arange(t + 2)[None]
        ).last_hidden_state
    torch.testing.assert_close(depth1[0, t], out[0, -1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
def test_random_eagle3_heads_keep_plain_greedy(arch: str, batch: int) -> None:
    model = _eagle3(arch)
    assert isinstance(model.heads, Eagle3Heads)
    ids, mask = ragged_batch(batch, seed=batch)
    out = _generate(model, ids, mask, medusa=True, return_dict_in_generate=True, speculative_costs=FREE)
    assert torch.equal(out.sequences, _generate(model.base, ids, mask))
    assert out.speculative.summary()["drafted_tokens"] > 0


@pytest.mark.parametrize("batch", [1, 3])
def test_a_qwen3_target_keeps_plain_greedy(batch: int) -> None:
    """Qwen3 (q/k norms in the target's attention): the heads' own layer stays Llama's."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.tiny_models import _llama_like

    torch.manual_seed(0)
    base = _llama_like(Qwen3Config, Qwen3ForCausalLM, head_dim=16)(4).eval()
    with torch.no_grad():
        base.lm_head.weight.mul_(4.0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle3", num_heads=3)).eval()
    ids, mask = ragged_batch(batch, seed=batch)
    out = _generate(model, ids, mask, medusa=True, return_dict_in_generate=True, speculative_costs=FREE)
    assert torch.equal(out.sequences, _generate(base, ids, mask))
    assert out.speculative.summary()["drafted_tokens"] > 0


def test_verification_asks_for_the_fused_layers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _eagle3("llama", num_layers=6)
    asked: list[object] = []
    forward = type(model.base).forward

    @functools.wraps(forward)
    def recording(self, *args, **kwargs):
        asked.append(kwargs.get("output_hidden_states"))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model.base), "forward", recording)
    ids, mask = ragged_batch(2, seed=1)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, medusa=True)
    assert asked and all(layers == [2, 3, 3] for layers in asked)


def _fit(model: MedusaForCausalLM, sequences: torch.Tensor, steps: int, lr: float, **objective) -> None:
    """Train the heads on the base's own continuations, the base's states computed once."""
    optimizer = torch.optim.Adam(model.heads.parameters(), lr=lr)
    with torch.no_grad():
        states = model._base_hidden_states(sequences, None)
    for _ in range(steps):
        loss = model(input_ids=sequences, labels=sequences, hidden_states=states, **objective)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("soft_targets", [False, True])
def test_heads_that_are_right_accept_long_paths_and_keep_identity(soft_targets: bool) -> None:
    base = tiny_model("llama", seed=0, num_layers=4, sharpen=4.0)
    torch.manual_seed(0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle3", num_heads=3)).freeze_base()
    ids, mask = ragged_batch(3, seed=4)
    plain = _generate(base, ids, mask)
    _fit(model, plain, steps=120, lr=1e-2, soft_targets=soft_targets)
    out = _generate(model, ids, mask, medusa=True, tree=8, return_dict_in_generate=True, speculative_costs=FREE)
    assert torch.equal(out.sequences, plain)
    assert out.speculative.summary()["tau"] > 2.5, out.speculative.summary()


def test_training_learns_tokens_only_and_trains_only_the_heads() -> None:
    model = _eagle3("gpt2").freeze_base()
    ids = torch.randint(4, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    result = model(input_ids=ids, labels=ids, attention_mask=torch.ones_like(ids))
    assert result["per_head_loss"].shape == (3,) and "per_head_feature_loss" not in result
    result["loss"].backward()
    assert all(p.grad is None for p in model.base.parameters())
    assert model.heads.fc.weight.grad is not None and model.heads.fc.weight.grad.abs().sum() > 0
    assert model.heads.midlayer.hidden_norm.weight.grad is not None
    assert model(input_ids=ids)["head_logits"].shape == (3, 2, 10, 96)
    with pytest.raises(ValueError, match=r"feature_weight=0\.5 weighs a feature regression that Eagle3Heads do not"):
        model(input_ids=ids, labels=ids, feature_weight=0.5)
    with pytest.raises(ValueError, match=r"layers they fuse and then the last.*\(batch, sequence, 256\)"):
        model(input_ids=ids, labels=ids, hidden_states=torch.zeros(2, 10, 64))


def _record_proposals(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    records: list[dict] = []
    propose = EagleDrafter.propose

    def recording(self, buffer, last_token, next_position, costs, max_tokens):
        proposal = propose(self, buffer, last_token, next_position, costs, max_tokens)
        committed = [
            buffer.tokens[row, :n].clone() for row, n in zip(buffer.active, buffer.active_lengths, strict=True)
        ]
        records.append(
            {"rows": buffer.active.clone(), "committed": committed, "nodes": proposal.nodes, "trees": proposal.trees}
        )
        return proposal

    monkeypatch.setattr(EagleDrafter, "propose", recording)
    return records


def _waiting_for_lookup(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The gate keeps two steps of every three plain, in which prompt lookup proposes alone (no lookup grafted on
    the heads' trees, so that every node of theirs is the heads' own); returns, per proposal of the heads, whether
    a lookup step that drafted came just before it."""
    steps, after_lookup, looked_up = itertools.count(), [], [False]

    def speculate(self: SpeculationGate, rows: int) -> bool:
        self.measuring = False
        return next(steps) % 3 == 2

    propose_free, propose = EagleDrafter.propose_free, EagleDrafter.propose

    def free(self, *args, **kwargs):
        proposal = propose_free(self, *args, **kwargs)
        looked_up[0] = looked_up[0] or proposal is not None
        return proposal

    def grown(self, *args, **kwargs):
        after_lookup.append(looked_up[0])
        looked_up[0] = False
        return propose(self, *args, **kwargs)

    monkeypatch.setattr(SpeculationGate, "speculate", speculate)
    monkeypatch.setattr(PromptLookupDrafter, "graft", lambda self, nodes, trees, *args: (nodes, trees, False))
    monkeypatch.setattr(EagleDrafter, "propose_free", free)
    monkeypatch.setattr(EagleDrafter, "propose", grown)
    return after_lookup


@pytest.mark.parametrize("between", ["nothing", "lookup steps"])
def test_every_node_gets_the_candidates_of_its_own_path(between: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Brute force: each node's children are the head's top candidates after its path, computed from scratch by
    unrolling the head over the row's committed tokens and the path (the base's fused states on them). With
    lookup steps between the heads' trees (taken while the gate waits), the heads must have queued the features
    of every token those steps committed."""
    model = _eagle3("qwen2", num_layers=6)
    with torch.no_grad():  # sharp attention: a position or a key off by one changes the candidates
        for name, parameter in model.heads.decoder.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(12.0)
    after_lookup = _waiting_for_lookup(monkeypatch) if between == "lookup steps" else None
    records = _record_proposals(monkeypatch)
    ids, mask = ragged_batch(3, seed=7)
    tree = DynamicTree(num_nodes=8, depth=3, top_k=3)
    lookup = {"prompt_lookup_num_tokens": 4} if after_lookup is not None else {}
    out = _generate(
        model, ids, mask, medusa=True, tree=tree, return_dict_in_generate=True, speculative_costs=FREE, **lookup
    )
    assert torch.equal(out.sequences, _generate(model.base, ids, mask))
    if after_lookup is None:
        checked = records[:6]
    else:
        assert len(after_lookup) == len(records)
        checked = [record for record, follows in zip(records, after_lookup, strict=True) if follows]
        assert len(checked) >= 2, "too few trees grown after lookup steps"
    assert _candidates_checked(model, checked, mask) > 10


def _candidates_checked(model: MedusaForCausalLM, records: list[dict], mask: torch.Tensor) -> int:
    heads, base = model.heads, model.base
    embeddings, padding = base.get_input_embeddings(), (mask == 0).sum(dim=1)
    checked = 0
    for record in records:
        for i, row in enumerate(record["rows"].tolist()):
            committed = record["committed"][i][int(padding[row]) :]
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
                    states = base(tokens, output_hidden_states=True).hidden_states
                    fused = torch.cat([states[j] for j in heads.feature_layers], dim=-1)
                    features = heads.unroll(fused, tokens, embeddings, depth=len(path) + 1)
                    logits = heads.project(features[len(path)][0, committed.numel() - 2], None)
                top = heads.to_token_ids(logits.topk(3).indices)
                assert bool(torch.isin(children, top).all()), (node, children, top)
                checked += 1
    return checked


def test_a_draft_vocabulary_maps_back_to_the_base_ids() -> None:
    base = tiny_model("llama", seed=0, num_layers=4, sharpen=4.0)
    token_ids = torch.arange(0, 96, 3)  # every third id
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle3", num_heads=2), token_ids=token_ids)
    assert model.heads.lm_head.weight.shape == (32, 64)
    torch.testing.assert_close(model.heads.lm_head.weight, base.lm_head.weight[token_ids])  # started from the base's
    ids, mask = ragged_batch(2, seed=2)
    out = _generate(model, ids, mask, medusa=True, return_dict_in_generate=True, speculative_costs=FREE)
    assert torch.equal(out.sequences, _generate(base, ids, mask))


def test_save_and_load_round_trip(tmp_path) -> None:
    model = _eagle3("mistral", feature_layers=[1, 2, 3])
    model.save_pretrained(tmp_path)
    loaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=model.base)
    assert isinstance(loaded.heads, Eagle3Heads) and loaded.heads.feature_layers == (1, 2, 3)
    for (name, a), (_, b) in zip(model.heads.state_dict().items(), loaded.heads.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids, mask = ragged_batch(2, seed=3)
    kwargs = {"medusa": True, "speculative_costs": FREE}
    assert torch.equal(_generate(loaded, ids, mask, **kwargs), _generate(model, ids, mask, **kwargs))


def test_prompt_lookup_grafted_on_eagle3_trees_keeps_plain_greedy() -> None:
    model = _eagle3("llama")
    ids, mask = ragged_batch(3, seed=5)
    ids = torch.cat([ids, ids[:, -6:], ids[:, -6:]], dim=1)  # repeats for the lookup to find
    mask = torch.cat([mask, torch.ones_like(ids[:, :12])], dim=1)
    out = _generate(
        model, ids, mask, medusa=True, prompt_lookup_num_tokens=4, return_dict_in_generate=True, speculative_costs=FREE
    )
    assert torch.equal(out.sequences, _generate(model.base, ids, mask))
    assert out.speculative.lookup_steps > 0


def test_errors_say_what_to_do() -> None:
    base = tiny_model("llama", seed=0, num_layers=4)
    with pytest.raises(ValueError, match="exactly one layer"):
        MedusaConfig(head_type="eagle3", num_layers=2)
    with pytest.raises(ValueError, match="own lm_head"):
        MedusaConfig(head_type="eagle3", share_lm_head=True)
    with pytest.raises(ValueError, match="pass head_type='eagle3'"):
        MedusaConfig(head_type="eagle", feature_layers=[1, 2, 3])
    with pytest.raises(ValueError, match=r"from 0 \(the embeddings' output\) to 3"):
        MedusaForCausalLM.from_base(base, MedusaConfig(head_type="eagle3", feature_layers=[1, 2, 4]))
    with pytest.raises(TypeError, match="feature_layers"):
        MedusaConfig(head_type="eagle3", feature_layers=[1, "2"])
    assert MedusaConfig(head_type="eagle3").share_lm_head is False and MedusaConfig().share_lm_head is True
    with pytest.raises(ValueError, match="norm_before_residual, fc_norm describe EAGLE-3 heads"):
        MedusaConfig(head_type="recurrent", norm_before_residual=True, fc_norm=True)
    with pytest.raises(ValueError, match="EAGLE heads' decoder is Llama layers"):
        MedusaConfig(head_type="eagle", layer_config={"model_type": "qwen3", "hidden_size": 64})
    with pytest.raises(ValueError, match="EAGLE-3 heads' layer is one of"):
        MedusaConfig(head_type="eagle3", layer_config={"model_type": "gemma"})
    from hf_specdec.training import MedusaTrainingConfig

    training = MedusaTrainingConfig(base="b", data="d", head_type="eagle3", norm_before_residual=True)
    assert training.head_config().norm_before_residual and training.head_config().share_lm_head is False
    with pytest.raises(ValueError, match="drop --feature_weight"):
        MedusaTrainingConfig(base="b", data="d", head_type="eagle3", feature_weight=0.0)
    model = _eagle3("llama")
    ids, mask = ragged_batch(1, seed=1)
    with pytest.raises(ValueError, match="grow a tree per row"):
        _generate(model, ids, mask, medusa=True, tree="medium")
