"""What rolling back recurrent states costs in a verify step, on a real-shaped hybrid with random weights.

A Qwen3.5-style model of about 0.8B parameters (hidden 1024, 24 layers, three gated-delta-net layers to one full
attention layer; the fields are below) is prefilled with a prompt, then verifies chains of k tokens as the decoding
loop does, each followed by a decision that keeps a random number of them per row. Per k it reports the median of:

- `forward`: the verify forward with the state after every token recorded (transformers' per-token recurrence over
  the k tokens),
- `forward, unrecorded`: the same forward without recording (the chunked kernel, states after the last token only:
  what a model without rollback would run),
- `bookkeeping`: collecting the per-token states and giving each row its own (`RecurrentStates.fed` and `.keep`),

and the bookkeeping's share of a step. Nothing else may run on the machine meanwhile.

    python tools/recurrent_cost.py --dtype bfloat16 --batch 1 --widths 1 2 4 8

With `--tree small`, also a static tree of 4 heads verified path by path against a chain as deep; with
`--draft-frontier F`, also one depth of a tree this model grows as a draft, its frontier F rows a row.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers import logging as transformers_logging

from hf_specdec.generation.branches import branches
from hf_specdec.generation.kv_cache import CachedSequence
from hf_specdec.trees.masks import chain_structure
from hf_specdec.trees.static import preset_tree

SHAPE = {
    "hidden_size": 1024, "num_hidden_layers": 24, "intermediate_size": 3584, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 16,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "vocab_size": 248320,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "max_position_embeddings": 4096,
}  # fmt: skip


def build(dtype: torch.dtype) -> Qwen3_5ForCausalLM:
    shape = dict(SHAPE)
    shape["layer_types"] = shape["layer_types"] * (shape["num_hidden_layers"] // 4)
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**shape)).to(dtype).eval()


@torch.no_grad()
def measure(model: Qwen3_5ForCausalLM, batch: int, prompt: int, width: int, steps: int) -> dict[str, float]:
    """Median seconds of a verify step's parts at `width` tokens (see the module's docstring)."""
    seq = CachedSequence(model, batch, torch.device("cpu"))
    assert seq.recurrent is not None
    ids = torch.randint(10, 1000, (batch, prompt))
    positions = torch.arange(prompt).expand(batch, -1)
    seq.forward(ids, None, positions, chain_structure(prompt, "cpu"), logits_to_keep=1)
    generator = torch.Generator().manual_seed(0)
    timings: dict[str, list[float]] = {"forward": [], "forward, unrecorded": [], "bookkeeping": []}
    next_position = prompt
    for _ in range(steps):
        new = torch.randint(10, 1000, (batch, width))
        new_positions = (next_position + torch.arange(width)).expand(batch, -1)
        mask = seq._mask(None, new_positions, chain_structure(width, "cpu"), None)
        call = seq._call_arguments(mask, new_positions)
        # The same forward without recording, on a copy of the states it would change (then put back).
        saved = [(layer.conv_states[0].clone(), layer.recurrent_states[0].clone()) for layer in seq.recurrent.layers]
        for layer in seq.recurrent.layers:
            layer.record_past, layer.recurrent_states_to_keep = False, 0
        start = time.perf_counter()
        model(input_ids=new, **call, logits_to_keep=0)
        timings["forward, unrecorded"].append(time.perf_counter() - start)
        for layer, (conv, state) in zip(seq.recurrent.layers, saved, strict=True):
            layer.conv_states[0] = conv
            layer.recurrent_states[0].copy_(state)
            layer.cumulative_length_linear.sub_(width)
        _crop_attention(seq, width)
        # The loop's forward: recorded, then the states collected and each row's kept.
        seq.recurrent.record(width)
        start = time.perf_counter()
        model(input_ids=new, **call, logits_to_keep=0)
        middle = time.perf_counter()
        seq.recurrent.fed(None, width)
        seq.valid = torch.cat([seq.valid, torch.ones(batch, width, dtype=torch.bool)], dim=1)
        keep = torch.randint(1, width + 1, (batch,), generator=generator)
        seq.keep_prefix(width, keep, int(keep.max()), real_kept=keep.tolist())  # as the loop decides
        end = time.perf_counter()
        timings["forward"].append(middle - start)
        timings["bookkeeping"].append(end - middle)
        seq.compact()
        next_position += width
    return {name: statistics.median(values) for name, values in timings.items()}


@torch.no_grad()
def measure_tree(model: Qwen3_5ForCausalLM, batch: int, prompt: int, preset: str, steps: int) -> dict[str, float]:
    """Median seconds of verifying a static tree (`preset`, 4 heads) path by path, as the decoding loop does on a
    model with recurrent layers (`generation.branches`: the rows repeated per path, one forward, the accepted path's
    row kept), against verifying a chain as deep."""
    tree = preset_tree(preset, 4).row_trees().expand(batch)
    depth = tree.depth + 1
    timings: dict[str, list[float]] = {"tree": [], "chain": []}
    for kind in ("tree", "chain"):
        seq = CachedSequence(model, batch, torch.device("cpu"))
        ids = torch.randint(10, 1000, (batch, prompt))
        seq.forward(ids, None, torch.arange(prompt).expand(batch, -1), chain_structure(prompt, "cpu"), 1)
        next_position = torch.full((batch,), prompt + 1)
        for _ in range(steps):
            start = time.perf_counter()
            keep = torch.ones(batch, dtype=torch.long)  # the root: the cheapest decision, the same for both
            if kind == "tree":
                nodes = torch.randint(10, 1000, (batch, tree.num_nodes))
                cut = branches(nodes, tree, next_position, 4095)
                seq.fork(cut.num_paths)
                seq.forward(cut.tokens, cut.valid, cut.positions, chain_structure(depth, "cpu"))
                seq.join(cut.kept_rows(torch.zeros(batch, dtype=torch.long)))
            else:
                new_positions = (next_position[:, None] - 1 + torch.arange(depth)).contiguous()
                seq.forward(torch.randint(10, 1000, (batch, depth)), None, new_positions, chain_structure(depth, "cpu"))
            seq.keep_prefix(depth, keep, 1, real_kept=keep.tolist())
            timings[kind].append(time.perf_counter() - start)
            next_position = next_position + 1
    return {name: statistics.median(values) for name, values in timings.items()}


@torch.no_grad()
def measure_draft_depth(model: Qwen3_5ForCausalLM, batch: int, prompt: int, frontier: int, steps: int) -> dict:
    """Median seconds of one depth of a tree grown by this model as a draft (`drafters.recurrent_tree`): every row
    copied `frontier` times (its frontier nodes' rows) and one token fed to each, against one token fed to each row
    (a chain's draft step)."""
    timings: dict[str, list[float]] = {"tree depth": [], "chain step": []}
    for kind in timings:
        seq = CachedSequence(model, batch, torch.device("cpu"))
        ids = torch.randint(10, 1000, (batch, prompt))
        seq.forward(ids, None, torch.arange(prompt).expand(batch, -1), chain_structure(prompt, "cpu"), 1)
        for step in range(steps):
            copies = frontier if kind == "tree depth" else 1
            start = time.perf_counter()
            if copies > 1:
                seq.fork(copies)
            rows = batch * copies
            seq.forward(
                torch.randint(10, 1000, (rows, 1)), None, torch.full((rows, 1), prompt + step),
                chain_structure(1, "cpu"), 1,
            )  # fmt: skip
            timings[kind].append(time.perf_counter() - start)
            if copies > 1:
                seq.join(torch.arange(batch) * copies)
            seq.keep_prefix(1, torch.ones(batch, dtype=torch.long), 1, real_kept=[1] * batch)
    return {name: statistics.median(values) for name, values in timings.items()}


def _crop_attention(seq: CachedSequence, width: int) -> None:
    for layer in seq.cache.layers:
        if getattr(layer, "keys", None) is not None:
            layer.keys, layer.values = layer.keys[:, :, :-width], layer.values[:, :, :-width]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--tree", default=None, help="also time a static tree preset (small, medium) path by path")
    parser.add_argument("--draft-frontier", type=int, default=None, help="also time a draft tree's depth of F rows")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    transformers_logging.set_verbosity_error()
    model = build(getattr(torch, args.dtype))
    print("| k | forward (s) | forward, unrecorded (s) | bookkeeping (s) | bookkeeping / step | step / k=1 step |")
    print("|---|---|---|---|---|---|")
    if args.draft_frontier:
        t = measure_draft_depth(model, args.batch, args.prompt, args.draft_frontier, args.steps)
        print(f"draft tree depth of {args.draft_frontier} rows a row: {t['tree depth']:.3f} s; a chain step: "
              f"{t['chain step']:.3f} s")  # fmt: skip
    if args.tree:
        t = measure_tree(model, args.batch, args.prompt, args.tree, args.steps)
        print(f"tree {args.tree!r} path by path: {t['tree']:.3f} s; a chain as deep: {t['chain']:.3f} s")
    base = None
    for width in args.widths:
        t = measure(model, args.batch, args.prompt, width, args.steps)
        step = t["forward"] + t["bookkeeping"]
        base = base or step
        print(
            f"| {width} | {t['forward']:.3f} | {t['forward, unrecorded']:.3f} | {t['bookkeeping']:.4f} | "
            f"{t['bookkeeping'] / step:.1%} | {step / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
