"""Recurrent draft heads (`MedusaConfig(head_type="recurrent")`): every node's candidates come from its own
path, greedy identity, heads that are right, teacher forcing, checkpoints, errors."""

from __future__ import annotations

import pytest
import torch

from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.medusa.heads import MedusaHeads
from hf_specdec.medusa.loss import IGNORE_INDEX, following_tokens, medusa_objective
from hf_specdec.medusa.recurrent import RecurrentHeads
from hf_specdec.trees.static import DraftTree, preset_tree
from tests.test_medusa import _fit_heads, _generate
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model


def _recurrent(arch: str = "llama", noise: float = 0.3, **config) -> MedusaForCausalLM:
    """Recurrent heads on a tiny base, perturbed so that the state really moves with the tokens it reads (fresh
    heads keep the base's hidden state and would propose the same token at every depth)."""
    base = tiny_model(arch, seed=0, sharpen=4.0)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(head_type="recurrent", **{"num_heads": 3, **config}))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.heads.parameters():
            scale = noise * parameter.abs().mean().clamp_min(0.05)
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return model


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree", ["chain", "medium"])
def test_random_recurrent_heads_keep_plain_greedy(arch: str, batch: int, tree: str) -> None:
    model = _recurrent(arch, share_lm_head=arch != "gpt2")
    assert isinstance(model.heads, RecurrentHeads)
    ids, mask = ragged_batch(batch, seed=batch)
    assert torch.equal(_generate(model, ids, mask, medusa=True, tree=tree), _generate(model.base, ids, mask))


def test_every_node_gets_the_candidates_of_its_own_path() -> None:
    """Brute force: walk each node's path from the base's hidden state, one token at a time."""
    model = _recurrent(share_lm_head=False)
    heads, base = model.heads, model.base
    with torch.no_grad():  # states that move a lot with the tokens read (tiny embeddings are small)
        heads.token_in.weight.normal_(0.0, 5.0, generator=torch.Generator().manual_seed(2))
    lm_head, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    tree = preset_tree("medium", 3)
    hidden = torch.randn(2, base.config.hidden_size, generator=torch.Generator().manual_seed(3))
    root = torch.tensor([7, 11])
    nodes = heads.tree_candidates(hidden, root, tree, lm_head, embeddings)
    assert torch.equal(nodes[:, 0], root)
    parents = tree.parents.tolist()
    for node in range(1, tree.num_nodes):
        path = []
        walk = parents[node]
        while walk != -1:
            path.insert(0, walk)
            walk = parents[walk]
        state = hidden
        for ancestor in path:  # the root first, then the drafted nodes above `node`
            state = heads.step(state, nodes[:, ancestor], embeddings)
        rank = int(tree.ranks[node])
        expected = heads.logits(state, lm_head).topk(rank + 1, dim=-1).indices[:, rank]
        assert torch.equal(nodes[:, node], expected), node
    # The candidates really depend on the path: rank 0 under the root's top two candidates differ.
    index = {path: i + 1 for i, path in enumerate(tree.choices)}
    assert not torch.equal(nodes[:, index[(0, 0)]], nodes[:, index[(1, 0)]])


def test_teacher_forcing_is_aligned_with_the_tokens_read() -> None:
    """`forward` at (depth i, position t) reads tokens t+1..t+1+i and predicts t+2+i, like Medusa's head i."""
    model = _recurrent(share_lm_head=False)
    heads, base = model.heads, model.base
    ids = torch.randint(4, base.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    hidden = base(ids, output_hidden_states=True).hidden_states[-1].detach()
    lm_head, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    logits = heads(hidden, lm_head, ids, embeddings)  # (3, 2, 9, V)
    t = 2
    expected = heads.depth_logits(hidden[:, t], ids[:, t + 1 : t + 4], lm_head, embeddings)
    for i in range(3):
        torch.testing.assert_close(logits[i, :, t], expected[i])
    # A chain tree drafts what the teacher-forced logits predict along the chain.
    nodes = heads.tree_candidates(hidden[:, t], ids[:, t + 1], DraftTree.chain(3), lm_head, embeddings)
    chained = heads.depth_logits(hidden[:, t], nodes[:, :3], lm_head, embeddings)
    for i in range(3):
        assert torch.equal(nodes[:, i + 1], chained[i].argmax(dim=-1))


def test_following_tokens_by_hand() -> None:
    labels = torch.tensor([[IGNORE_INDEX, 5, 6, IGNORE_INDEX, 7, 8, 9]])
    window, run = following_tokens(labels, depth=2)
    assert window[0, 0].tolist() == [5, 6, IGNORE_INDEX]
    assert window[0, 3].tolist() == [7, 8, 9]
    assert window[0, 5].tolist() == [9, IGNORE_INDEX, IGNORE_INDEX]
    assert run[0].tolist() == [2, 1, 0, 3, 2, 1, 0]


def test_loss_trains_each_depth_only_on_unbroken_runs() -> None:
    """Depth i at t learns token t+2+i only where tokens t+1..t+2+i are all labelled: a gap (an unlabelled
    user turn) never becomes an input or a target."""
    model = _recurrent(share_lm_head=False)
    base = model.base
    labels = torch.tensor([[IGNORE_INDEX, 5, 6, 7, IGNORE_INDEX, IGNORE_INDEX, 8, 9, 10, 11]])
    hidden = torch.randn(1, labels.shape[1], base.config.hidden_size)
    lm_head, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    objective = medusa_objective(model.heads, lm_head, hidden, labels, embeddings=embeddings)
    outputs = objective.outputs
    targets = [model.heads.to_token_ids(index).tolist() for _, index in outputs]
    assert targets == [[6, 7, 9, 10, 11], [7, 10, 11], [11]]


def test_relabelled_data_trains_only_on_the_bases_own_path() -> None:
    """With relabelled data (labels: the base's predictions on someone else's text), where the data leaves the
    base's path its later labels follow the data: a depth whose inputs cross that point does not train."""
    model = _recurrent(share_lm_head=False)
    base = model.base
    labels = torch.tensor([[IGNORE_INDEX, 5, 6, 7, 8, 4]])  # the base's next-token choices
    input_ids = torch.tensor([[1, 5, 9, 7, 8, 4]])  # the data: token 2 is not the base's choice (6)
    hidden = torch.randn(1, labels.shape[1], base.config.hidden_size)
    lm_head, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    objective = medusa_objective(model.heads, lm_head, hidden, labels, embeddings=embeddings, input_ids=input_ids)
    outputs = objective.outputs
    targets = [model.heads.to_token_ids(index).tolist() for _, index in outputs]
    # Depth 0 at t=0 reads 5 (on the path) and learns 6; at t=1 it would read 6, which the data never wrote.
    assert targets == [[6, 8, 4], [4], []]
    _, run = following_tokens(labels, 2, input_ids)
    assert run[0].tolist() == [1, 0, 3, 2, 1, 0]


def test_heads_that_read_the_data_learn_at_every_labelled_position() -> None:
    """Recurrent heads read the data's own tokens, so off the base's path (relabelled data) they still get a
    consistent example: the base's choice after exactly the tokens read. Medusa heads, blind to those tokens,
    learn on the path only. Metrics stay on the path for both (where a guess matters at decoding time)."""
    labels = torch.tensor([[IGNORE_INDEX, 5, 6, 7, 8, 4]])  # the base's next-token choices
    input_ids = torch.tensor([[1, 5, 9, 7, 8, 4]])  # the data: token 2 is not the base's choice (6)
    recurrent = _recurrent(share_lm_head=False, num_heads=2)
    base = recurrent.base
    hidden = torch.randn(1, labels.shape[1], base.config.hidden_size, generator=torch.Generator().manual_seed(5))
    lm_head, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    objective = medusa_objective(recurrent.heads, lm_head, hidden, labels, embeddings=embeddings, input_ids=input_ids)
    per_head = objective.per_head
    outputs = objective.outputs
    # Depth 0 at t = 0..3 reads the data's token t + 1 (5, 9, 7, 8) and learns the label t + 2.
    expected = recurrent.heads.depth_logits(hidden[0, :4], input_ids[0, 1:5, None], lm_head, embeddings, depth=1)
    torch.testing.assert_close(per_head[0], torch.nn.functional.cross_entropy(expected[0], labels[0, 2:6]))
    # Depth 1 at t = 0..2 reads tokens t + 1, t + 2 of the data and learns label t + 3.
    reads = torch.stack([input_ids[0, 1:4], input_ids[0, 2:5]], dim=-1)
    expected = recurrent.heads.depth_logits(hidden[0, :3], reads, lm_head, embeddings)[1]
    torch.testing.assert_close(per_head[1], torch.nn.functional.cross_entropy(expected, labels[0, 3:6]))
    assert [recurrent.heads.to_token_ids(index).tolist() for _, index in outputs] == [[6, 8, 4], [4]]

    medusa = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, share_lm_head=False))
    objective = medusa_objective(medusa.heads, lm_head, hidden, labels, input_ids=input_ids)
    per_head = objective.per_head
    # Head 0 learns at t = 0, 2, 3, where token t + 1 is the base's own (5, 7, 8), not at t = 1 (9).
    unread = torch.zeros(3, 1, dtype=torch.long)  # Medusa heads do not read the tokens
    logits = torch.stack(medusa.heads.depth_logits(hidden[0, [0, 2, 3]], unread, lm_head, None))
    torch.testing.assert_close(per_head[0], torch.nn.functional.cross_entropy(logits[0], labels[0, [2, 4, 5]]))


@pytest.mark.parametrize("head_type", ["medusa", "recurrent"])
@pytest.mark.parametrize("vocabulary", [None, [0, 3, 5, 6, 7, 8, 9, 11, 20, 31]])
@pytest.mark.parametrize("share_lm_head", [True, False])
def test_soft_targets_are_the_bases_distribution_before_each_label(
    head_type: str, vocabulary, share_lm_head: bool
) -> None:
    """Depth k at t learns the base's distribution at t + 1 + k (which predicts label t + 2 + k), over the draft
    vocabulary: KL from softmax(lm_head(h[t + 1 + k])) restricted and renormalised."""
    base = tiny_model("llama", seed=0, sharpen=4.0)
    token_ids = None if vocabulary is None else torch.tensor(vocabulary)
    config = MedusaConfig(head_type=head_type, num_heads=2, share_lm_head=share_lm_head)
    model = MedusaForCausalLM.from_base(base, config, token_ids=token_ids)  # own projections: perturbed below
    with torch.no_grad():
        for parameter in model.heads.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)))
    ids = torch.tensor([[1, 5, 9, 7, 8, 4, 6]])
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 9, 7, 8, 4, 6]])
    with torch.no_grad():
        hidden = base(ids, output_hidden_states=True).hidden_states[-1]
    lm_head, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    objective = medusa_objective(
        model.heads, lm_head, hidden, labels, embeddings=embeddings, input_ids=ids, soft_targets=True
    )
    per_head = objective.per_head
    full = lm_head(hidden[0])  # (T, V)
    teacher = full if token_ids is None else full[:, token_ids]
    for k in range(2):
        positions = torch.arange(1, labels.shape[1] - 2 - k)  # labels t + 1 .. t + 2 + k all present
        reads = torch.stack([ids[0, positions + 1 + i] for i in range(k + 1)], dim=-1)
        student = model.heads.depth_logits(hidden[0, positions], reads, lm_head, embeddings, depth=k + 1)[k]
        expected = torch.nn.functional.kl_div(
            student.log_softmax(-1), teacher[positions + 1 + k].log_softmax(-1), log_target=True, reduction="batchmean"
        )
        torch.testing.assert_close(per_head[k], expected)
        assert per_head[k] > 0


def test_heads_that_are_right_accept_long_paths_and_keep_identity() -> None:
    model = _recurrent(noise=0.0, share_lm_head=False)
    ids, mask = ragged_batch(3, seed=4)
    plain = _generate(model.base, ids, mask)
    _fit_heads(model, plain, steps=200, lr=2e-2)
    free = {"speculative_costs": SpeculativeCosts(0.0, 0.0)}  # every step drafts, whatever the clock says
    out = _generate(model, ids, mask, medusa=True, tree="small", return_dict_in_generate=True, **free)
    assert torch.equal(out.sequences, plain)
    assert out.speculative.summary()["tau"] > 2.5
    # The same 8 nodes grown per step where the drafter is sure (DynamicTree), 6 deep: past the 3 depths the
    # heads were trained for and the static tree reaches.
    spec = DynamicTree(8, depth=6, top_k=2)
    grown = _generate(model, ids, mask, medusa=True, tree=spec, return_dict_in_generate=True, **free)
    assert torch.equal(grown.sequences, plain)
    assert grown.speculative.summary()["tau"] > out.speculative.summary()["tau"]
    assert int(grown.speculative.accepted_at_position[3:].sum()) > 0


def test_save_and_load_round_trip_with_a_draft_vocabulary(tmp_path) -> None:
    model = _recurrent(tree=[[0], [1], [0, 0], [0, 0, 0]])
    token_ids = torch.arange(0, model.config.vocab_size, 2)
    fresh = MedusaForCausalLM.from_base(
        model.base, MedusaConfig(num_heads=3, head_type="recurrent", share_lm_head=False), token_ids=token_ids
    )
    with torch.no_grad():
        for parameter in fresh.heads.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    for source in (model, fresh):
        source.save_pretrained(tmp_path / str(id(source)))
        reloaded = MedusaForCausalLM.from_pretrained(tmp_path / str(id(source)), base_model=source.base)
        assert isinstance(reloaded.heads, RecurrentHeads) and reloaded.config.head_type == "recurrent"
        before, after = source.heads.state_dict(), reloaded.heads.state_dict()
        assert before.keys() == after.keys()
        for name in before:
            assert torch.equal(before[name], after[name]), name
        ids, mask = ragged_batch(2)
        assert torch.equal(_generate(reloaded, ids, mask, medusa=True), _generate(source.base, ids, mask))
    assert "# Recurrent draft heads" in (tmp_path / str(id(fresh)) / "README.md").read_text()


def test_errors() -> None:
    with pytest.raises(ValueError, match="head_type must be one of"):
        MedusaConfig(head_type="hydra")
    base = tiny_model("llama", seed=0)
    medusa_heads = MedusaHeads(2, 1, base.config.hidden_size, base.config.vocab_size, share_lm_head=True)
    with pytest.raises(ValueError, match="head_type is 'recurrent' but the heads are MedusaHeads"):
        MedusaForCausalLM(base, MedusaConfig(num_heads=2, head_type="recurrent"), heads=medusa_heads)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, head_type="recurrent"))
    with pytest.raises(ValueError, match="pass `input_ids` or `labels`"):
        model(hidden_states=torch.zeros(1, 3, base.config.hidden_size))
