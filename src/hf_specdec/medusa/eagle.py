"""EAGLE-style draft heads: a small decoder that drafts the base's next *feature* autoregressively (Li et al.
2024, EAGLE-1 and EAGLE-2; trained with EAGLE-3's training-time test, Li et al. 2025).

Medusa's and recurrent heads guess from the base's hidden state at one position. An EAGLE head reads the whole
sequence of the base's features, with its own attention and KV cache, and one token ahead of them:

    x_t      = fc([n_e(e(token_{t+1})); n_f(f_t)])    f_t: the base's last hidden state at t; e: its embeddings
    f'_{t+1} = Decoder(x_0 .. x_t)_t                   a decoder of the base's own architecture (one layer), its
                                                       final norm removed, as in EAGLE-1 (`drop_final_norm`)
    logits   = W f'_{t+1}                               the base's lm_head (a draft vocabulary's rows) or an own one

`n_e` and `n_f` are RMS norms with learnt scales, as in EAGLE-3: a model's embeddings are orders of magnitude
smaller than its hidden states (Qwen2.5-1.5B: 0.017 against 4.3), and unscaled the token would barely count.
Drafting one token further feeds the head its own prediction `f'_{t+1}` with the drafted token; after a step,
the head's entries for the drafted nodes are dropped and the accepted positions are fed again with the base's
real features (`hf_specdec.medusa.eagle_drafter`).

Training (`unroll`) follows decoding exactly: depth 0 reads the base's features; depth i reads the head's own
predictions of depth i - 1 (the training-time test), attending to the real features up to the position it
drafts from and to its own earlier predictions along the chain, as the drafted nodes of a tree do.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoModel, DynamicCache, LlamaConfig, PretrainedConfig, PreTrainedModel

from hf_specdec.medusa.sequence_heads import SequenceHeads
from hf_specdec.trees.dynamic import DynamicTree

# The tree EAGLE heads grow by default, or when `tree=` gives only its size: children per expanded node, and
# nodes verified. Growing stops where one more depth does not pay (`hf_specdec.drafters.draft_tree.growth_rule`).
DEFAULT_TOP_K = 4
DEFAULT_NUM_NODES = 16


def eagle_tree(tree: DynamicTree | str | int | None, depth: int) -> DynamicTree:
    """The tree EAGLE heads grow for `generate(medusa=True, tree=...)`: a `DynamicTree` (depth `depth`, the
    heads' own, when unset), `"dynamic"` or `None` (the defaults), a number of nodes, or `"chain"`: the top token
    at every depth (what a base with recurrent layers verifies)."""
    if tree == "chain":
        return DynamicTree(num_nodes=depth, depth=depth, top_k=1)
    if tree is None or tree == "dynamic":
        tree = DEFAULT_NUM_NODES
    if isinstance(tree, int) and not isinstance(tree, bool):
        if tree < 1:
            raise ValueError(f"A tree size is a positive number of nodes, got {tree}.")
        return DynamicTree.at_most(tree, depth, DEFAULT_TOP_K)
    if isinstance(tree, DynamicTree):
        return tree if tree.depth is not None else DynamicTree(tree.num_nodes, depth, tree.top_k)
    raise ValueError(
        f"EAGLE heads grow a tree per row and step: pass tree=<number of nodes>, 'dynamic', 'chain' or a "
        f"DynamicTree, not {tree!r} (static trees and presets are for Medusa and recurrent heads)."
    )


class EagleHeads(SequenceHeads):
    """An EAGLE-style drafter on the base's features (see the module's docstring).

    Args:
        num_heads (`int`): the depth it drafts to by default, and the depths the training-time test unrolls.
        num_layers (`int`): decoder layers (EAGLE uses one).
        hidden_size (`int`): the base's hidden size.
        vocab_size (`int`): the base's number of logits.
        share_lm_head (`bool`): project with the base's `lm_head` instead of an own projection.
        base_config (`PretrainedConfig`): the base's config: the decoder is built from it (same family, attention,
            positions), with `num_layers` layers, full attention and no vocabulary of its own.
        embedding_size (`int`): the width of the base's input embeddings (its hidden size for most models).
        token_ids (`torch.LongTensor`, *optional*): the draft vocabulary; all `vocab_size` ids when `None`.
        intermediate_size (`int`, *optional*): the decoder's MLP width; the base's when `None`.
        input_norms (`bool`): scale the token and the feature with RMS norms before `fc` (the library's design);
            `False`: EAGLE-1's, `fc` reads them as they are and the decoder's first layer has no input norm.
        fc_bias (`bool`): give `fc` a bias (EAGLE-1 and 2 as released for Llama-2 and Vicuna).
        layer_config (`LlamaConfig`, *optional*): build the decoder as Llama layers of this config (a published
            EAGLE-1 checkpoint's own) instead of the base's architecture.
    """

    def __init__(
        self,
        num_heads: int,
        num_layers: int,
        hidden_size: int,
        vocab_size: int,
        share_lm_head: bool,
        base_config: PretrainedConfig,
        embedding_size: int,
        token_ids: torch.Tensor | None = None,
        intermediate_size: int | None = None,
        input_norms: bool = True,
        fc_bias: bool = False,
        layer_config: LlamaConfig | None = None,
    ) -> None:
        super().__init__(hidden_size, vocab_size, 0 if share_lm_head else 1, token_ids)
        if num_layers < 1:
            raise ValueError("EAGLE heads need at least one decoder layer: pass num_layers >= 1.")
        self.depth = num_heads
        self.token_norm: nn.Module = nn.RMSNorm(embedding_size, eps=1e-6) if input_norms else nn.Identity()
        self.feature_norm: nn.Module = nn.RMSNorm(hidden_size, eps=1e-6) if input_norms else nn.Identity()
        self.fc = nn.Linear(embedding_size + hidden_size, hidden_size, bias=fc_bias)
        if layer_config is None:
            config = decoder_config(base_config, num_layers, intermediate_size)
        else:
            config = copy.deepcopy(layer_config)
            config.num_hidden_layers = num_layers
        self.decoder: PreTrainedModel = AutoModel.from_config(config)
        self.decoder.get_input_embeddings().requires_grad_(False)  # fed vectors: it embeds no token
        drop_final_norm(self.decoder)
        if not input_norms:
            drop_first_input_norm(self.decoder)
        if layer_config is None:
            _check_runs(self.decoder, hidden_size)

    def embed(self, tokens: torch.Tensor, embeddings: nn.Module) -> torch.Tensor:
        embedded = embeddings(tokens).to(device=self.fc.weight.device, dtype=self.dtype)
        return self.token_norm(embedded)

    def combine(self, token_part: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([token_part, self.feature_norm(features.to(self.dtype))], dim=-1))


def _check_runs(decoder: PreTrainedModel, hidden_size: int) -> None:
    """Raise `ValueError` when a decoder built from the base's family cannot run a forward of its own (a family
    that lays out its layers from fields a cut config leaves inconsistent, as Zamba2's)."""
    if any(parameter.is_meta for parameter in decoder.parameters()):
        return
    dtype = next(decoder.parameters()).dtype
    try:
        with torch.no_grad():
            decoder(
                inputs_embeds=torch.zeros(1, 2, hidden_size, dtype=dtype),
                attention_mask=torch.zeros(1, 1, 2, 2, dtype=dtype),  # a 4D mask, as decoding passes one
                position_ids=torch.arange(2)[None],
                cache=DynamicCache(),
                use_cache=True,
            )
    except (RuntimeError, IndexError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(
            f"EAGLE heads build their decoder from the base's own family, and {type(decoder).__name__} cannot run as "
            f"a decoder of {decoder.config.num_hidden_layers} full-attention layer(s) ({type(error).__name__}: "
            f"{error}): use head_type='eagle3' (a Llama layer of the base's width), or Medusa or recurrent heads."
        ) from error


def decoder_config(
    base_config: PretrainedConfig, num_layers: int, intermediate_size: int | None = None
) -> PretrainedConfig:
    """The config of an EAGLE head's decoder: the base's text config with `num_layers` layers (and MLPs
    `intermediate_size` wide if given), full attention (training unrolls under its own masks; a window would make
    decoding differ from it), and a one-row vocabulary (the head is fed vectors, never ids)."""
    config = copy.deepcopy(base_config.get_text_config(decoder=True))
    base_layers = config.num_hidden_layers
    config.num_hidden_layers = num_layers
    for name, value in vars(config).items():  # per-layer settings (SmolLM3's `no_rope_layers`), cycled to fit
        if isinstance(value, list) and len(value) == base_layers and name != "layer_types":
            setattr(config, name, [value[i % base_layers] for i in range(num_layers)])
    if intermediate_size is not None:
        names = [name for name in ("intermediate_size", "n_inner", "ffn_dim") if hasattr(config, name)]
        if not names:
            raise ValueError(f"{type(config).__name__} names no MLP width this library knows: drop intermediate_size.")
        setattr(config, names[0], intermediate_size)
    config.vocab_size = 1
    config.pad_token_id = None
    if getattr(config, "layer_types", None) is not None:
        try:
            config.layer_types = ["full_attention"] * num_layers
        except AttributeError as error:  # derived from other fields (Jamba's, Mamba's): no attention layer to build
            raise ValueError(
                f"EAGLE heads build their decoder layer from the base's own family with full attention, and "
                f"{type(config).__name__} derives its layer types from other fields: use head_type='eagle3' (a "
                "Llama layer of the base's width), or Medusa or recurrent heads."
            ) from error
    for name in ("sliding_window", "use_sliding_window"):
        if hasattr(config, name):
            try:
                setattr(config, name, None if name == "sliding_window" else False)
            except Exception:  # a config that validates its fields (Lara-Mini's): a window past any text
                setattr(config, name, max(int(getattr(config, "max_position_embeddings", 0) or 0), 1 << 20))
    # The base's own attention where it is eager (some models run no other), else SDPA: both take 4D masks.
    config._attn_implementation = "eager" if getattr(base_config, "_attn_implementation", None) == "eager" else "sdpa"
    return config


def drop_final_norm(decoder: PreTrainedModel) -> None:
    """Replace the decoder's final norm by the identity, as EAGLE-1 and 2 do: the head's output goes to the
    base's lm_head as the decoder's residual stream leaves it. A final norm would fix the output's scale to its
    gain, which starts at 1 and which Adam moves by about the learning rate per step, while the base's features
    that the lm_head expects are several times larger (Qwen2.5-1.5B's final norm weighs 4.6 on average): the
    head's distributions would stay far too flat for most of a short training. Without it, the scale follows the
    decoder's matrices, which reach it within a few steps. Measured (docs/training.md): higher held-out top-1 for
    the same training steps."""
    found = [
        (parent, name)
        for parent in (decoder, *decoder.children())
        for name, child in parent.named_children()
        if "norm" in type(child).__name__.lower()
    ]
    if len(found) != 1:
        raise ValueError(
            f"Cannot tell the final norm of {type(decoder).__name__} (found {[name for _, name in found]}): EAGLE "
            "heads need a decoder whose final norm is its one norm outside the layers."
        )
    parent, name = found[0]
    setattr(parent, name, nn.Identity())


def drop_first_input_norm(decoder: PreTrainedModel) -> None:
    """Replace the norm on the decoder's first layer's input by the identity, as EAGLE-1 does: the layer reads
    `fc`'s output as it is (published EAGLE-1 checkpoints hold no `layers.0.input_layernorm`)."""
    layers = getattr(decoder, "layers", None)
    first = layers[0] if isinstance(layers, nn.ModuleList) and len(layers) else None
    if first is None or not isinstance(getattr(first, "input_layernorm", None), nn.Module):
        raise ValueError(
            f"{type(decoder).__name__} has no `layers[0].input_layernorm`: EAGLE heads without input norms "
            "(input_norms=False) need a Llama-style decoder (pass layer_config, or keep input_norms=True)."
        )
    first.input_layernorm = nn.Identity()
