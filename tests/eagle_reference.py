"""EAGLE-1's and EAGLE-3's draft forwards written from the papers' equations, over one sequence with causal
attention, independently of the library: what the loaded and the library's own heads are checked against."""

from __future__ import annotations

import torch
from torch.nn import functional


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding as Llama applies it (halves rotated), for `x` `(heads, T, d)` at `positions` `(T,)`."""
    d = x.shape[-1]
    inverse = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions[:, None].float() * inverse[None]  # (T, d/2)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * cos + half * sin


def llama_layer(
    state: dict[str, torch.Tensor], prefix: str, config, x: torch.Tensor, residual: torch.Tensor, positions
) -> torch.Tensor:
    """A Llama layer's causal attention over the (already normed) inputs `x` `(T, width)`, added to `residual`
    `(T, H)`, then its MLP on the post-attention norm; weights under `prefix` (e.g. `"midlayer."`). A Qwen3 layer
    (`self_attn.q_norm.weight` and `k_norm.weight` among the weights) RMS-normalises each head's queries and keys
    before the rotation."""
    eps, heads, kv_heads, d = (
        config.rms_norm_eps,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    length = x.shape[0]
    q = (x @ state[prefix + "self_attn.q_proj.weight"].T).view(length, heads, d).transpose(0, 1)
    k = (x @ state[prefix + "self_attn.k_proj.weight"].T).view(length, kv_heads, d).transpose(0, 1)
    v = (x @ state[prefix + "self_attn.v_proj.weight"].T).view(length, kv_heads, d).transpose(0, 1)
    if prefix + "self_attn.q_norm.weight" in state:
        q = rms(q, state[prefix + "self_attn.q_norm.weight"], eps)
        k = rms(k, state[prefix + "self_attn.k_norm.weight"], eps)
    theta = config.rope_parameters["rope_theta"]
    q, k = rotate(q, positions, theta), rotate(k, positions, theta)
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = q @ k.transpose(1, 2) / d**0.5
    scores = scores.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(length, heads * d)
    a = residual + attended @ state[prefix + "self_attn.o_proj.weight"].T
    m = rms(a, state[prefix + "post_attention_layernorm.weight"], eps)
    gate, up = m @ state[prefix + "mlp.gate_proj.weight"].T, m @ state[prefix + "mlp.up_proj.weight"].T
    return a + (functional.silu(gate) * up) @ state[prefix + "mlp.down_proj.weight"].T


def eagle3_fuse(state: dict[str, torch.Tensor], config, fused: torch.Tensor, count: int = 3) -> torch.Tensor:
    """EAGLE-3's g: `fc` over the target's `count` concatenated states, after vLLM's optional norms: one over the
    whole concatenation (`input_norm.weight`, `norm_before_fc`), then one on each state (`fc_norm.{i}.weight`)."""
    eps = config.rms_norm_eps
    if "input_norm.weight" in state:
        fused = rms(fused, state["input_norm.weight"], eps)
    if "fc_norm.0.weight" in state:
        chunks = fused.chunk(count, dim=-1)
        fused = torch.cat([rms(chunk, state[f"fc_norm.{i}.weight"], eps) for i, chunk in enumerate(chunks)], -1)
    return fused @ state["fc.weight"].T


def eagle3_step(
    state: dict[str, torch.Tensor], config, embedded, fused, positions, norm_before_residual: bool = False
) -> torch.Tensor:
    """EAGLE-3: `fc` fuses the target's three states into g (`eagle3_fuse`), then `eagle3_layer`."""
    return eagle3_layer(state, config, embedded, eagle3_fuse(state, config, fused), positions, norm_before_residual)


def eagle3_layer(
    state: dict[str, torch.Tensor], config, embedded, g, positions, norm_before_residual: bool = False
) -> torch.Tensor:
    """EAGLE-3's midlayer on g `(T, H)`: attention over [input_layernorm(embedding); hidden_norm(g)] with residual
    g (hidden_norm(g) with `norm_before_residual`, as vLLM and speculators offer), then the MLP; returns the
    pre-norm output (its logits: lm_head(norm(output)); what the next depth reads: the output, or its norm with
    vLLM's `norm_output`)."""
    eps = config.rms_norm_eps
    normed = rms(g, state["midlayer.hidden_norm.weight"], eps)
    x = torch.cat([rms(embedded, state["midlayer.input_layernorm.weight"], eps), normed], dim=-1)
    return llama_layer(state, "midlayer.", config, x, normed if norm_before_residual else g, positions)


def eagle1_step(state: dict[str, torch.Tensor], config, embedded, feature, positions) -> torch.Tensor:
    """EAGLE-1: `h = fc([e(token_{t+1}); f_t])` (with its bias), then one Llama layer with no input norm
    (attention over h, residual h, then the MLP), no final norm; returns the predicted feature, which the base's
    lm_head projects."""
    h = torch.cat([embedded, feature], dim=-1) @ state["fc.weight"].T + state.get("fc.bias", 0.0)
    return llama_layer(state, "layers.0.", config, h, h, positions)
