"""EAGLE-3 heads (`MedusaConfig(head_type="eagle3")`): the published architecture computed from its equations,
greedy identity on every architecture and batch size, the sampling distribution, every node's candidates equal
to a from-scratch computation, training that makes them right, checkpoints, errors."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.nn import functional

from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM, SpeculativeCosts
from hf_specdec.medusa.eagle3 import Eagle3Heads, default_feature_layers
from hf_specdec.medusa.eagle_drafter import EagleDrafter
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


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding as Llama applies it (halves rotated), for `x` `(heads, T, d)` at `positions` `(T,)`."""
    d = x.shape[-1]
    inverse = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions[:, None].float() * inverse[None]  # (T, d/2)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * cos + half * sin


def reference_eagle3_step(
    state: dict[str, torch.Tensor], config, embedded, fused, positions, norm_before_residual: bool = False
) -> torch.Tensor:
    """EAGLE-3's draft forward over one sequence, written from the paper's equations (causal attention over
    its own inputs): `fc` fuses the target's three states, the midlayer attends over
    [input_layernorm(embedding); hidden_norm(g)] with residual g (hidden_norm(g) with `norm_before_residual`, as
    vLLM and speculators offer), then the MLP; returns the pre-norm output."""
    eps, heads, kv_heads = config.rms_norm_eps, config.num_attention_heads, config.num_key_value_heads
    d = config.head_dim
    g = fused @ state["fc.weight"].T  # (T, H)
    x = torch.cat(
        [
            _rms(embedded, state["midlayer.input_layernorm.weight"], eps),
            _rms(g, state["midlayer.hidden_norm.weight"], eps),
        ],
        dim=-1,
    )
    length = x.shape[0]
    q = (x @ state["midlayer.self_attn.q_proj.weight"].T).view(length, heads, d).transpose(0, 1)
    k = (x @ state["midlayer.self_attn.k_proj.weight"].T).view(length, kv_heads, d).transpose(0, 1)
    v = (x @ state["midlayer.self_attn.v_proj.weight"].T).view(length, kv_heads, d).transpose(0, 1)
    theta = config.rope_parameters["rope_theta"]
    q, k = _rotate(q, positions, theta), _rotate(k, positions, theta)
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = q @ k.transpose(1, 2) / d**0.5
    scores = scores.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(length, heads * d)
    residual = _rms(g, state["midlayer.hidden_norm.weight"], eps) if norm_before_residual else g
    a = residual + attended @ state["midlayer.self_attn.o_proj.weight"].T
    m = _rms(a, state["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = m @ state["midlayer.mlp.gate_proj.weight"].T, m @ state["midlayer.mlp.up_proj.weight"].T
    return a + (functional.silu(gate) * up) @ state["midlayer.mlp.down_proj.weight"].T


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
        reference = reference_eagle3_step(
            _published_names(heads), heads.decoder.config, embedded, fused[0], torch.arange(9)
        )
        logits = heads.project(ours, base.get_output_embeddings())
        expected = _rms(reference, heads.norm.weight, heads.decoder.config.rms_norm_eps) @ heads.lm_head.weight.T
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
