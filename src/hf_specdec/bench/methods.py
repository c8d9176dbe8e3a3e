"""The decoding methods the benchmark compares, each a set of `generate()` keyword arguments."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from hf_specdec.drafters.draft_tree import DEFAULT_DEPTH, DEFAULT_TOP_K
from hf_specdec.trees.dynamic import DynamicTree


@dataclass(frozen=True)
class Method:
    """A way of calling `generate()`.

    Attributes:
        name: short name used in tables, JSON and plots.
        kwargs: extra `generate()` arguments; `"{draft}"` values are replaced by the draft model,
            `"{draft_vocab}"` by the benchmark's draft vocabulary (`hf_specdec.bench.vocabulary`) and
            `"{draft_int8}"` by an int8 copy of the draft (`hf_specdec.bench.quantized`, CPU only).
        uses: `"plain"`, `"hf-assistant"` (transformers' own assisted generation with a draft model),
            `"hf-lookup"` (transformers' own prompt lookup), `"specdec"` (this library with a draft model),
            `"lookup"` (this library's prompt lookup), `"early-exit"` (this library's self-speculation from the
            target's first layers), `"hf-early-exit"` (transformers' own) or `"medusa"` (this library's Medusa
            heads).
        heads: for `"medusa"`, the name of the heads it decodes with (`--medusa NAME=PATH`); `None`: the heads
            given without a name.
    """

    name: str
    uses: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    heads: str | None = None

    def skip_reason(
        self, batch_size: int, has_draft: bool, has_medusa: bool = False, head_names: Collection[str] = ()
    ) -> str | None:
        """Why this method cannot run in this setting, or `None` when it can (`has_medusa`: heads without a name
        are there; `head_names`: the names of the others)."""
        if self.uses == "medusa" and self.heads is not None:
            named = self.heads in head_names
            return None if named else f"needs the heads named {self.heads} (--medusa {self.heads}=PATH)"
        if self.uses == "medusa":
            return None if has_medusa else "needs Medusa heads (--medusa)"
        if self.uses in ("specdec", "hf-assistant") and not has_draft:
            return "needs a draft model (--draft)"
        if self.uses.startswith("hf-") and batch_size > 1:
            return "transformers' assisted generation supports batch size 1 only"
        return None

    @property
    def speculative(self) -> bool:
        """Whether the method decodes through this library's loop (its output carries speculative statistics)."""
        return self.uses in ("specdec", "lookup", "early-exit", "medusa")

    @property
    def needs_draft_vocab(self) -> bool:
        return "{draft_vocab}" in self.kwargs.values()

    @property
    def needs_int8_draft(self) -> bool:
        return "{draft_int8}" in self.kwargs.values()

    def generate_kwargs(
        self,
        draft: PreTrainedModel | None,
        draft_vocab: torch.Tensor | None = None,
        draft_int8: PreTrainedModel | None = None,
    ) -> dict[str, Any]:
        placeholders = {"{draft}": draft, "{draft_vocab}": draft_vocab, "{draft_int8}": draft_int8}
        return {k: placeholders.get(v, v) if isinstance(v, str) else v for k, v in self.kwargs.items()}


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("plain", "plain"),
        Method("hf-assistant", "hf-assistant", {"assistant_model": "{draft}"}),
        Method(
            "hf-assistant-5h",
            "hf-assistant",
            {"assistant_model": "{draft}", "num_assistant_tokens": 5, "num_assistant_tokens_schedule": "heuristic"},
        ),
        Method("specdec", "specdec", {"assistant": "{draft}"}),
        Method("specdec-vocab", "specdec", {"assistant": "{draft}", "assistant_vocab": "{draft_vocab}"}),
        Method("lookup", "lookup", {"prompt_lookup_num_tokens": 10}),
        Method("specdec-lookup", "specdec", {"assistant": "{draft}", "prompt_lookup_num_tokens": 10}),
        Method("specdec-int8", "specdec", {"assistant": "{draft_int8}"}),
        Method("specdec-int8-lookup", "specdec", {"assistant": "{draft_int8}", "prompt_lookup_num_tokens": 10}),
        Method("lookup-3", "lookup", {"prompt_lookup_num_tokens": 3}),
        Method("hf-lookup", "hf-lookup", {"prompt_lookup_num_tokens": 10}),
        Method("medusa", "medusa", {"medusa": True}),
        Method("medusa-chain", "medusa", {"medusa": True, "tree": "chain"}),
        Method(
            "specdec-k4",
            "specdec",
            {"assistant": "{draft}", "num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant"},
        ),
    ]
}


PATTERNS: dict[str, str] = {
    "medusa-N": "Medusa heads, the best tree of N nodes for their measured accuracies",
    "medusa-N-lookup": "the same, with prompt lookup's continuation (up to 10 tokens) grafted on",
    "medusa-dynN": "Medusa heads, a dynamic tree of N nodes",
    "medusa-dynN-lookup": "the same, with prompt lookup's continuation grafted on",
    "specdec-treeN": "a draft model's tree of N nodes, in the default shape",
    "specdec-treeN-dD-kK": "a draft model's tree of N nodes, D deep, K children per node (either part may go)",
    "specdec-treeN-vocab": "a draft model's tree over the benchmark's draft vocabulary (-dD-kK before -vocab too)",
    "specdec-treeN-lookup": "a draft model's tree with prompt lookup's continuation grafted on (-dD-kK, -vocab before)",
    "early-exit-N": "self-speculation: drafts from the target's first N layers",
    "early-exit-N-lookup": "the same, with prompt lookup beside it",
    "hf-early-exit-N": "transformers' own self-speculation from the target's first N layers",
}
"""The methods named by pattern, beside `METHODS`: N, D and K stand for whole numbers >= 1. `method_by_name`
accepts each of them."""

NAMED_HEADS = "NAME-N, NAME-N-lookup, NAME-dynN, NAME-dynN-lookup"
"""The methods of heads given a name (`--medusa NAME=PATH`): the `medusa-...` patterns with the heads named NAME,
so that one run compares several heads on the same prompts."""


def method_names() -> list[str]:
    """Every method `method_by_name` accepts: the names of `METHODS`, sorted, then the patterns of `PATTERNS`."""
    return [*sorted(METHODS), *PATTERNS]


# Medusa trees of any size, by name: `medusa-N` (the best N-node tree for the heads' measured accuracies),
# `medusa-dynN` (a DynamicTree of N nodes), either with `-lookup` (prompt lookup's continuation grafted on,
# up to 10 tokens); `NAME-N` and the others the same with the heads named NAME.
_MEDUSA_TREE = re.compile(r"([a-z][a-z0-9_]*)-(dyn)?([1-9][0-9]*)(-lookup)?")
_HEADS_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Draft-model trees by size: `specdec-treeN` (N nodes, the default shape), `specdec-treeN-dD-kK` (depth D, top_k K),
# with `-vocab` over the benchmark's draft vocabulary (as `specdec-vocab`), with `-lookup` prompt lookup's continuation
# (up to 10 tokens) grafted on.
# Self-speculation from the target's first N layers: `early-exit-N` (this library), `hf-early-exit-N` (transformers'
# own), with `-lookup` (prompt lookup beside it, this library only).
_EARLY_EXIT = re.compile(r"(hf-)?early-exit-([1-9][0-9]*)(-lookup)?")
_DRAFT_TREE = re.compile(r"specdec-tree([1-9][0-9]*)(?:-d([1-9][0-9]*))?(?:-k([1-9][0-9]*))?(-vocab)?(-lookup)?")


def heads_name(text: str) -> str:
    """A name for heads in method names (`eagle3` makes `eagle3-8`): lower-case letters, digits and `_`, starting
    with a letter, and not the first word of another method (`medusa`, `specdec`, `lookup`, ...).

    Raises:
        `ValueError`: for any other name.
    """
    taken = _first_words()
    if not _HEADS_NAME.fullmatch(text):
        raise ValueError(f"heads name {text!r}: use lower-case letters, digits and _, starting with a letter")
    if text in taken:
        raise ValueError(f"heads name {text!r} is the first word of other methods ({', '.join(taken)}): pick another")
    return text


def _first_words() -> list[str]:
    """The first words of the methods' names (`medusa`, `specdec`, ...), which no heads may be named."""
    return sorted({name.split("-")[0] for name in [*METHODS, *PATTERNS]})


def names_heads(name: str) -> bool:
    """Whether `name` is a method of heads given a name (`eagle3-8`, not `medusa-8` nor `specdec-8`), whatever the
    name."""
    match = _MEDUSA_TREE.fullmatch(name)
    return match is not None and match.group(1) not in _first_words()


def method_by_name(name: str, heads: Collection[str] = ()) -> Method:
    """The method called `name`: one of `METHODS`, or one of `PATTERNS` with its numbers, such as a Medusa tree size
    (`medusa-8`, `medusa-5-lookup`, `medusa-dyn12`), a draft model's tree (`specdec-tree8`, `specdec-tree10-d5-k2`,
    `specdec-tree16-vocab`, `specdec-tree16-lookup`) or self-speculation (`early-exit-4`, `hf-early-exit-4`); with
    `heads` (names of heads, see `heads_name`), a tree of the heads of one of them (`eagle3-8`, `eagle3-16-lookup`)."""
    if name in METHODS:
        return METHODS[name]
    early_exit = _EARLY_EXIT.fullmatch(name)
    if early_exit is not None and not (early_exit.group(1) and early_exit.group(3)):
        theirs, layers, lookup = early_exit.groups()
        kwargs = {"assistant_early_exit": int(layers)} | ({"prompt_lookup_num_tokens": 10} if lookup else {})
        return Method(name, "hf-early-exit" if theirs else "early-exit", kwargs)
    tree = _DRAFT_TREE.fullmatch(name)
    if tree is not None:
        size, depth, top_k, vocab, lookup = tree.groups()
        spec: DynamicTree | int = int(size)  # generate() grows the default shape of that many nodes
        if depth is not None or top_k is not None:
            spec = DynamicTree(
                num_nodes=int(size), depth=int(depth or DEFAULT_DEPTH), top_k=int(top_k or DEFAULT_TOP_K)
            )
        kwargs = {"assistant": "{draft}", "tree": spec} | ({"assistant_vocab": "{draft_vocab}"} if vocab else {})
        kwargs |= {"prompt_lookup_num_tokens": 10} if lookup else {}
        return Method(name, "specdec", kwargs)
    match = _MEDUSA_TREE.fullmatch(name)
    named = f" (heads named: {', '.join(heads)})" if heads else ""
    if match is not None and names_heads(name) and match.group(1) not in heads:
        raise ValueError(
            f"Unknown method {name!r}: no heads are named {match.group(1)}{named}; name heads with "
            f"--medusa {match.group(1)}=PATH, or use medusa-... for the heads given without a name."
        )
    if match is None or match.group(1) not in ("medusa", *heads):
        raise ValueError(
            f"Unknown method {name!r}; choose from {', '.join(sorted(METHODS))}, or a pattern: "
            f"{', '.join(PATTERNS)} (N, D, K: whole numbers >= 1){named}."
        )
    which, dynamic, size, lookup = match.groups()
    kwargs: dict[str, Any] = {"medusa": True, "tree": DynamicTree(num_nodes=int(size)) if dynamic else int(size)}
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = 10
    return Method(name, "medusa", kwargs, heads=None if which == "medusa" else which)
