"""EAGLE-3 draft heads (Li et al. 2025), in the published architecture, whatever the target's:

    g_t      = fc([h^low_t; h^mid_t; h^high_t])          three of the target's layers at t, fused (3H -> H)
    x_t      = [n_in(e(token_{t+1})); n_h(g_t)]           e: the target's input embeddings; n_in, n_h: RMS norms
    a_t      = g_t + Attention(x_t | x_0 .. x_t)          q/k/v read the 2H-wide x; the residual is g_t
    f'_{t+1} = a_t + MLP(n_post(a_t))                     one Llama-style layer ("midlayer")
    logits   = lm_head(norm(f'_{t+1}))                    an own lm_head over a draft vocabulary (d2t/t2d)

Drafting one token further feeds the layer its own output `f'_{t+1}` (before the final norm) in place of `g`,
with the drafted token; after a step the accepted positions are fed again with the target's fused states
(`hf_specdec.medusa.eagle_drafter`, as for the library's other EAGLE heads).

The variants vLLM serves, each an option here as in its config: `norm_before_residual` (the residual starts at
`n_h(g_t)`), `norm_before_fc` (one RMS norm over the concatenated states before `fc`, `input_norm`), `fc_norm` (an
RMS norm on each fused state, `fc_norm.i`), `norm_output` (the layer feeds itself `norm(f')`, the state its
logits read, instead of `f'`), and a Qwen3 layer (`layer_config` of `model_type` `"qwen3"`: RMS norms on each
attention head's queries and keys, `q_norm` and `k_norm`).

The fused layers are the *inputs* of target layers `feature_layers` (indices of `output_hidden_states`, where 0 is
the embeddings' output): by default (2, L // 2, L - 3) of an L-layer target, as EAGLE-3, SpecForge and vLLM take
them. The verification forward asks for those three states only (transformers' `output_hidden_states=[...]`),
so verifying costs what it costs for any other drafter.

Names follow the published checkpoints (`fc`, the decoder's `layers.0` being EAGLE-3's `midlayer`, `norm`,
`lm_head`); the draft vocabulary is the heads' `token_ids` (EAGLE-3's `d2t`/`t2d`: `token_ids[i] = i + d2t[i]`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import Cache, LlamaConfig, LlamaModel, PretrainedConfig, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

from hf_specdec.medusa.config import EAGLE3_LAYER_TYPES
from hf_specdec.medusa.sequence_heads import SequenceHeads


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE-3's fused layers for an `num_layers`-layer target: the inputs of layers 2, L // 2 and L - 3 (vLLM's and
    SpecForge's default), each kept within the target's layers (a target of fewer than 6 layers repeats some)."""
    return [min(max(index, 0), num_layers - 1) for index in (2, num_layers // 2, num_layers - 3)]


LayerConfig = LlamaConfig | Qwen3Config


def eagle3_layer_config(
    base_config: PretrainedConfig, intermediate_size: int | None = None, layer_type: str = "llama"
) -> LayerConfig:
    """The config of an EAGLE-3 head's one layer for a base: a Llama layer (a Qwen3 one with `layer_type="qwen3"`)
    of the base's width, heads, head size, norm epsilon and rope base (plain rope: a base without rope, GPT-2's
    learnt positions, gets Llama's), with MLPs `intermediate_size` wide (default: the base's) and no vocabulary of
    its own (the head is fed vectors)."""
    if layer_type not in EAGLE3_LAYER_TYPES:
        raise ValueError(f"EAGLE-3 layers are one of {EAGLE3_LAYER_TYPES}, got {layer_type!r}.")
    text = base_config.get_text_config(decoder=True)
    hidden = text.hidden_size
    heads = getattr(text, "num_attention_heads", None)
    if not isinstance(heads, int):
        raise ValueError(
            f"An EAGLE-3 head's layer takes the base's number of attention heads, and {type(text).__name__} has none "
            "(a model without attention): use Medusa or recurrent heads."
        )
    rope = getattr(text, "rope_parameters", None)
    theta = rope.get("rope_theta", 10000.0) if isinstance(rope, dict) else 10000.0
    width = intermediate_size or next(
        (
            value
            for name in ("intermediate_size", "n_inner", "ffn_dim")
            if isinstance(value := getattr(text, name, None), int)
        ),
        4 * hidden,
    )
    # Grouped key/value heads where the base has them; a count that does not group the query heads (multi-head
    # latent attention's configs carry an unused one) gives as many as query heads.
    kv_heads = getattr(text, "num_key_value_heads", None)
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        kv_heads = heads
    config = one_layer_config(
        layer_type,
        hidden_size=hidden,
        intermediate_size=width,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=getattr(text, "head_dim", None) or hidden // heads,
        rms_norm_eps=getattr(text, "rms_norm_eps", None) or 1e-6,
        max_position_embeddings=getattr(text, "max_position_embeddings", None) or 4096,
        rope_parameters={"rope_type": "default", "rope_theta": float(theta)},
    )
    # The base's own attention where it is eager, else SDPA: both take the 4D masks trees need.
    config._attn_implementation = "eager" if getattr(base_config, "_attn_implementation", None) == "eager" else "sdpa"
    return config


def one_layer_config(layer_type: str, **fields: Any) -> LayerConfig:
    """A one-layer config of `layer_type` (`"qwen3"`: a `Qwen3Config`, else a `LlamaConfig`) with `fields` and no
    vocabulary of its own: an EAGLE layer is fed vectors."""
    return (Qwen3Config if layer_type == "qwen3" else LlamaConfig)(
        **fields,
        num_hidden_layers=1,
        vocab_size=1,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    )


def layer_config_to_dict(config: LayerConfig) -> dict[str, Any]:
    """What `MedusaConfig.layer_config` keeps of a layer's config: the fields that differ from its class's
    defaults, and `model_type` for a layer other than Llama's."""
    fields = config.to_diff_dict()
    for name in ("transformers_version", "_attn_implementation_autoset", "model_type"):
        fields.pop(name, None)
    if isinstance(config, Qwen3Config):
        fields["model_type"] = "qwen3"
    return fields


def layer_config_from_dict(fields: dict[str, Any], base_config: PretrainedConfig | None = None) -> LayerConfig:
    """The layer's config from `MedusaConfig.layer_config` (a `LlamaConfig`, or a `Qwen3Config` where its
    `model_type` says so), one layer, with the base's attention (eager where the base's is, else SDPA).

    Raises:
        `ValueError`: for a `model_type` of no layer in `EAGLE3_LAYER_TYPES`.
    """
    kind = fields.get("model_type", "llama")
    if kind not in EAGLE3_LAYER_TYPES:
        raise ValueError(f"MedusaConfig.layer_config: a {kind!r} layer; EAGLE-3 layers are {EAGLE3_LAYER_TYPES}.")
    rest = {key: value for key, value in fields.items() if key != "model_type"}
    config = (Qwen3Config if kind == "qwen3" else LlamaConfig)(**{**rest, "num_hidden_layers": 1})
    eager = base_config is not None and getattr(base_config, "_attn_implementation", None) == "eager"
    config._attn_implementation = "eager" if eager else "sdpa"
    return config


def as_llama(config: LayerConfig) -> LlamaConfig:
    """A Qwen3 layer's config as Llama's (its attention aside, the two layers are the same: norms, MLP, rope);
    a `LlamaConfig` as it is."""
    if isinstance(config, LlamaConfig):
        return config
    llama = one_layer_config(
        "llama",
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act=config.hidden_act,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters=config.rope_parameters,
        attention_bias=config.attention_bias,
    )
    assert isinstance(llama, LlamaConfig)
    llama._attn_implementation = config._attn_implementation
    return llama


class Eagle3Layer(LlamaDecoderLayer):
    """EAGLE-3's `midlayer`: a Llama decoder layer (with Qwen3's attention for a `Qwen3Config`) whose attention
    reads `[n_in(embedding); n_h(hidden)]` (2H wide) and whose residual stream starts at `hidden` (or at
    `n_h(hidden)` with `norm_before_residual`, as some published checkpoints say). It is fed the two halves
    concatenated, `[embedding; hidden]`, as `inputs_embeds`.
    """

    def __init__(self, config: LayerConfig, layer_idx: int = 0, norm_before_residual: bool = False) -> None:
        super().__init__(as_llama(config), layer_idx)
        if isinstance(config, Qwen3Config):
            self.self_attn = Qwen3Attention(config, layer_idx)  # per-head norms of the queries and keys
        attention, width = self.self_attn, 2 * config.hidden_size
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attention, name)
            setattr(attention, name, nn.Linear(width, old.out_features, bias=old.bias is not None))
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(  # type: ignore[override]
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        embedded, hidden = hidden_states.chunk(2, dim=-1)
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        attended, _ = self.self_attn(
            hidden_states=torch.cat([self.input_layernorm(embedded), normed], dim=-1),
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Decoder(LlamaModel):
    """A one-layer `LlamaModel` whose layer is `Eagle3Layer`, with no final norm of its own (the heads' norm is
    applied before their lm_head, and to the features fed back only with `norm_output`): what `CachedSequence`
    runs with a KV cache and tree masks, as it runs any base model. `layer_config` is the layer's own config
    (a `Qwen3Config` for a Qwen3 layer; `config` is Llama's in any case)."""

    def __init__(self, config: LayerConfig, norm_before_residual: bool = False) -> None:
        super().__init__(as_llama(config))
        self.layer_config = config
        self.layers = nn.ModuleList([Eagle3Layer(config, 0, norm_before_residual)])
        self.norm = nn.Identity()
        self.post_init()
        self.embed_tokens.requires_grad_(False)  # fed vectors: it embeds no token


class _NormOf(nn.Module):
    """Applies another module's RMS norm without owning its weight (no second copy in the state dict)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self._norm = [norm]  # a list: not registered as a submodule

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._norm[0](hidden_states)


class Eagle3Heads(SequenceHeads):
    """EAGLE-3 heads (see the module's docstring).

    Args:
        num_heads (`int`): the depth it drafts to by default, and the depths the training-time test unrolls.
        layer_config (`LlamaConfig`): its layer's config (`eagle3_layer_config` for a base).
        target_hidden_size (`int`): the width of each fused target state.
        feature_layers (`list[int]`): which of the target's `output_hidden_states` it fuses, in order.
        vocab_size (`int`): the target's number of logits.
        token_ids (`torch.LongTensor`, *optional*): the draft vocabulary (increasing ids); all `vocab_size` ids
            when `None`.
        norm_before_residual (`bool`): start the layer's residual stream at the normed hidden state.
        norm_before_fc (`bool`): an RMS norm (`input_norm`) over the concatenated fused states before `fc`.
        fc_norm (`bool`): an RMS norm (`fc_norm.i`) on each fused state before `fc` (after `input_norm`).
        norm_output (`bool`): feed the layer its normed output (what the lm_head reads) at the next depth.
    """

    predicts_features = False  # EAGLE-3 learns tokens only: its features are free to differ from the target's

    def __init__(
        self,
        num_heads: int,
        layer_config: LlamaConfig,
        target_hidden_size: int,
        feature_layers: list[int] | tuple[int, ...],
        vocab_size: int,
        token_ids: torch.Tensor | None = None,
        norm_before_residual: bool = False,
        norm_before_fc: bool = False,
        fc_norm: bool = False,
        norm_output: bool = False,
    ) -> None:
        hidden, eps = layer_config.hidden_size, layer_config.rms_norm_eps
        super().__init__(hidden, vocab_size, 0, token_ids)
        if not feature_layers:
            raise ValueError("EAGLE-3 heads fuse at least one of the target's layers: pass feature_layers.")
        self.depth = num_heads
        self._feature_layers = tuple(int(i) for i in feature_layers)
        fused = len(self._feature_layers) * target_hidden_size
        self.input_norm = LlamaRMSNorm(fused, eps=eps) if norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList(LlamaRMSNorm(target_hidden_size, eps=eps) for _ in self._feature_layers) if fc_norm else None
        )
        self.fc = nn.Linear(fused, hidden, bias=False)
        self.decoder = Eagle3Decoder(layer_config, norm_before_residual)
        self.norm = LlamaRMSNorm(hidden, eps=eps)
        self.norm_output = norm_output
        if norm_output:  # the decoder's output is then the normed state: what is fed back and what lm_head reads
            self.decoder.norm = _NormOf(self.norm)
        self.lm_head = nn.Linear(hidden, self.head_vocab_size, bias=False)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self._feature_layers

    @property
    def reads_base_lm_head(self) -> bool:
        return False

    @property
    def midlayer(self) -> Eagle3Layer:
        """The one layer (published checkpoints' `midlayer`)."""
        layer = self.decoder.layers[0]
        assert isinstance(layer, Eagle3Layer)
        return layer

    @property
    def layer_config(self) -> LayerConfig:
        """The config of the one layer (a `Qwen3Config` for a Qwen3 layer, else a `LlamaConfig`)."""
        return self.decoder.layer_config

    def from_target(self, states: torch.Tensor) -> torch.Tensor:
        states = states.to(device=self.fc.weight.device, dtype=self.dtype)
        if self.input_norm is not None:
            states = self.input_norm(states)
        if self.fc_norm is not None:
            chunks = states.chunk(len(self.fc_norm), dim=-1)
            states = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(states)

    def embed(self, tokens: torch.Tensor, embeddings: nn.Module) -> torch.Tensor:
        return embeddings(tokens).to(device=self.fc.weight.device, dtype=self.dtype)

    def combine(self, token_part: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return torch.cat([token_part, features.to(self.dtype)], dim=-1)

    def project(self, state: torch.Tensor, lm_head: nn.Module, projection: int = 0) -> torch.Tensor:
        """Logits over the draft vocabulary `(..., head_vocab_size)`: the own lm_head after the final norm (which
        the decoder applied already with `norm_output`)."""
        state = state.to(self.dtype)
        return self.lm_head(state if self.norm_output else self.norm(state))

    def init_projections_from(self, lm_head: nn.Module) -> None:
        """Start the own lm_head from the base's rows of the draft vocabulary (its final norm starting at 1)."""
        with torch.no_grad():
            weight = lm_head.weight
            if self.token_ids is not None:
                weight = weight[self.token_ids.to(weight.device)]
            self.lm_head.weight.copy_(weight)
