"""Draft vocabularies: frequency counts, the chosen ids, and Medusa heads that propose only them."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from hf_specdec import MedusaConfig, MedusaForCausalLM
from hf_specdec.drafters.vocab import VocabularyRows, check_token_ids, count_tokens, frequent_tokens, vocab_index
from hf_specdec.medusa.heads import MedusaHeads
from hf_specdec.medusa.loss import IGNORE_INDEX, medusa_objective
from tests.tiny_models import VOCAB, ragged_batch, tiny_model, tiny_target


def test_counts_skip_ignored_labels_and_refuse_ids_past_the_vocabulary() -> None:
    counts = count_tokens([[1, 2, 2, -100], torch.tensor([2, 4])], vocab_size=5)
    assert counts.tolist() == [0, 1, 3, 0, 1]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        count_tokens([[5]], vocab_size=5)


def test_frequent_tokens_by_count_then_lower_id_with_forced_ids() -> None:
    counts = torch.tensor([5, 0, 7, 5, 1, 0])
    assert frequent_tokens(counts, 3).tolist() == [0, 2, 3]
    assert frequent_tokens(counts, 3, always=[5]).tolist() == [0, 2, 5]  # 5 never seen but kept; 3 drops
    with pytest.raises(ValueError, match="between 1 and 6"):
        frequent_tokens(counts, 7)
    with pytest.raises(ValueError, match="do not fit"):
        frequent_tokens(counts, 1, always=[1, 2])


def test_vocab_index_and_checks() -> None:
    index = vocab_index(torch.tensor([1, 4]), 6)
    assert index.tolist() == [-1, 0, -1, -1, 1, -1]
    assert check_token_ids(torch.tensor([4, 1]), 6).tolist() == [1, 4]
    for bad, message in [([1, 1], "repeated"), ([6], "outside"), ([], "non-empty"), ([[1]], "1-D")]:
        with pytest.raises(ValueError, match=message):
            check_token_ids(torch.tensor(bad, dtype=torch.long), 6)


@pytest.mark.parametrize("share_lm_head", [True, False])
def test_heads_with_a_draft_vocabulary_give_the_full_heads_columns(share_lm_head: bool) -> None:
    base = tiny_model("llama", seed=0)
    lm_head = base.get_output_embeddings()
    ids = torch.tensor([3, 7, 20, 50, 95])
    torch.manual_seed(0)
    full = MedusaHeads(2, 1, base.config.hidden_size, VOCAB, share_lm_head)
    subset = MedusaHeads(2, 1, base.config.hidden_size, VOCAB, share_lm_head, token_ids=ids)
    full.init_projections_from(lm_head)
    subset.init_projections_from(lm_head)
    with torch.no_grad():
        for block_full, block_subset in zip(full.blocks, subset.blocks, strict=True):
            block_full[0].linear.weight.normal_()
            block_subset.load_state_dict(block_full.state_dict())
    hidden = torch.randn(2, 4, base.config.hidden_size)
    with torch.no_grad():
        expected = full(hidden, lm_head)[..., ids]
        assert torch.allclose(subset(hidden, lm_head), expected, atol=1e-6)
    assert subset.to_token_ids(torch.tensor([0, 4])).tolist() == [3, 95]
    assert subset.to_head_index(torch.tensor([7, 8, IGNORE_INDEX])).tolist() == [1, -1, -1]


def test_labels_outside_the_draft_vocabulary_add_no_loss_and_count_as_misses() -> None:
    base = tiny_model("llama", seed=0)
    heads = MedusaHeads(1, 1, base.config.hidden_size, VOCAB, True, token_ids=torch.tensor([5, 6]))
    hidden = torch.randn(1, 4, base.config.hidden_size)
    labels = torch.tensor([[1, 2, 5, 9]])  # head 0 sees labels 5 (learnable) and 9 (outside)
    objective = medusa_objective(heads, base.get_output_embeddings(), hidden, labels)
    per_head = objective.per_head
    outputs = objective.outputs
    logits, targets = outputs[0]
    assert targets.tolist() == [0, -1]
    expected = torch.nn.functional.cross_entropy(logits[:1].float(), targets[:1])
    assert torch.allclose(per_head[0], expected)


def test_greedy_identity_save_and_load_with_a_draft_vocabulary(tmp_path) -> None:
    base = tiny_model("qwen2", seed=0, sharpen=4.0)
    ids, mask = ragged_batch(3, seed=2)
    plain = base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False)
    # A vocabulary from what the base writes (so the heads can be right), missing some of its tokens.
    counts = count_tokens(plain[:, ids.shape[1] :], VOCAB)
    token_ids = frequent_tokens(counts, 24, always=[3])
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=3), token_ids=token_ids)
    assert model.config.head_vocab_size == 24
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False, medusa=True)
    assert torch.equal(out, plain)
    model.save_pretrained(tmp_path)
    reloaded = MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert torch.equal(reloaded.heads.token_ids, token_ids)
    assert reloaded.heads.to_head_index(token_ids).tolist() == list(range(24))
    out = reloaded.generate(input_ids=ids, attention_mask=mask, max_new_tokens=30, do_sample=False, medusa=True)
    assert torch.equal(out, plain)


def test_float32_heads_decode_on_a_bfloat16_base() -> None:
    """Training leaves heads in float32 on a bfloat16 base; decoding with them straight away must work."""
    base = tiny_model("llama", seed=0, sharpen=4.0).to(torch.bfloat16)
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2), token_ids=torch.arange(0, VOCAB, 2))
    model.heads.float()
    ids, mask = ragged_batch(2, seed=1)
    plain = base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, medusa=True)
    assert out.shape == plain.shape


def test_vocabulary_errors(tmp_path) -> None:
    base = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="pass `token_ids=`"):
        MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, head_vocab_size=8))
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2), token_ids=torch.arange(4))
    with pytest.raises(ValueError, match="narrower tree"):
        model.generate(input_ids=torch.tensor([[5, 6]]), max_new_tokens=3, medusa=True, tree=[[0], [4]])
    with pytest.raises(ValueError, match="existing `heads`"):
        MedusaForCausalLM(base, MedusaConfig(num_heads=2), heads=model.heads, token_ids=torch.arange(4))
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "medusa_config.json").read_text())
    (tmp_path / "medusa_config.json").write_text(json.dumps({**config, "head_vocab_size": 5}))
    with pytest.raises(ValueError, match="inconsistent"):
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)


def test_assistant_vocab_refused_for_drafts_that_rescale_their_logits() -> None:
    target, draft = tiny_target("llama"), tiny_model("llama", seed=0, num_layers=1)
    draft.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        target.generate(input_ids=torch.tensor([[5, 6]]), max_new_tokens=3, assistant=draft, assistant_vocab=[1, 3])


def test_vocabulary_rows_are_gathered_once_and_again_when_anything_changes() -> None:
    lm_head = torch.nn.Linear(4, 10, bias=False).requires_grad_(False)
    rows = VocabularyRows()
    ids = torch.tensor([1, 3])
    first, _ = rows(lm_head, ids)
    assert torch.equal(first, lm_head.weight[ids]) and rows(lm_head, ids.clone())[0] is first  # cached
    ids[0] = 2  # the caller's tensor changes in place: the cache must not follow it silently
    assert torch.equal(rows(lm_head, ids)[0], lm_head.weight[torch.tensor([2, 3])])
    with torch.no_grad():
        lm_head.weight.add_(1.0)  # in-place weight update
    assert torch.equal(rows(lm_head, ids)[0], lm_head.weight[ids])
    assert rows(lm_head, ids, torch.float64)[0].dtype == torch.float64
    assert pickle.loads(pickle.dumps(rows))._rows is None
    with pytest.raises(ValueError, match=r"gathers rows of the output layer.s weight"):
        rows(torch.nn.Identity(), ids)
