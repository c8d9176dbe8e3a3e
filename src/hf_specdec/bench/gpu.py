"""`hf-specdec gpu`: measure what is hardware-specific on a device, and predict each method's speedup there.

On a device (typically a GPU lent for a few minutes, with no network), for each target/draft pair of
`real_sizes.PAIRS` built with random weights in the published shapes:

- the target's verification cost V(n): one forward over n new tokens after a cached prefix, through the
  decoding loop's own cache and masks, eager and compiled (`cache_implementation="static"` with transformers'
  `torch.compile` of the forward, at some of the bucketed widths the loop feeds it; a width between two
  measured ones is priced at the wider);
- the draft's forward over one token, and its cost ratio to the target's;
- EAGLE-3 heads on the target (random weights in the published shape: one layer of the target's width, a
  32,000-token draft vocabulary): one forward over `HEADS_WIDTH` tokens after a cached context, with the
  projection, which is what the heads' recorded forwards are priced at (eager only);
- the host's time per step of each path and its reads per step (`overhead`, tiny models on the device).

Acceptance is a property of models and prompts, not of hardware: it comes from `acceptance_record.json`
(real models' greedy runs on a CPU). The two combine into a **predicted** speedup per method: the recorded
counts' verification widths and draft forwards, priced at the device's forward times, against plain decoding
at its own (`StepRecord.predicted_speedup`). Everything stops measuring at a deadline, so that the command fits
the few minutes a GPU may be lent for; what was not measured is said so in the table.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from hf_specdec.bench.acceptance_record import StepRecord, load_record
from hf_specdec.bench.cost_curve import median_seconds, time_forwards
from hf_specdec.bench.overhead import Overhead, measure_overhead
from hf_specdec.bench.real_sizes import build_random
from hf_specdec.generation.kv_cache import CachedSequence, bucket
from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.trees.masks import chain_structure

# Which `overhead` path's host cost stands for each recorded method's.
HOST_PATH = {
    "draft-chain": "assistant-constant",
    "draft-tree": "tree-8",
    "lookup": "lookup",
    "draft-lookup": "assistant",
    "heads-tree": "eagle",
    "heads-lookup": "eagle",
}
HEADS_WIDTH = 4  # tokens per heads forward priced: a tree's frontier (the default EAGLE trees keep 4 or fewer)
HEADS_VOCAB = 32_000  # the draft vocabulary of published EAGLE-3 heads
EAGER_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
COMPILED_WIDTHS = (1, 4, 8, 16, 24)


@dataclass
class PairCosts:
    """One pair's forward times on the device, seconds by width (a width missing was not measured)."""

    target: str
    draft: str
    eager: dict[int, float] = field(default_factory=dict)
    compiled: dict[int, float] = field(default_factory=dict)
    draft_eager: float | None = None
    draft_compiled: float | None = None
    heads_eager: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Prediction:
    pair: str
    method: str
    tau: float
    eager: float | None
    compiled: float | None


@torch.no_grad()
def time_heads(target: PreTrainedModel, deadline: float, prefix: int = 256, repeats: int = 5) -> float | None:
    """Median seconds of one forward of EAGLE-3 heads on `target` (random weights, `HEADS_VOCAB` draft tokens) over
    `HEADS_WIDTH` new tokens after a `prefix`-token cache, with the projection and the log-softmax a tree's
    growth takes; `None` past `deadline`."""
    from hf_specdec.medusa import MedusaConfig, MedusaForCausalLM

    if time.perf_counter() > deadline:
        return None
    vocab = min(HEADS_VOCAB, target.config.get_text_config(decoder=True).vocab_size)
    config = MedusaConfig(head_type="eagle3", head_vocab_size=vocab)
    heads = MedusaForCausalLM.from_base(target, config, token_ids=torch.arange(vocab)).heads.to(target.dtype)
    device, width = target.device, 2 * heads.fc.out_features
    seq = CachedSequence(heads.decoder, 1, device)
    generator = torch.Generator().manual_seed(0)

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(1, n, width, generator=generator).to(device, target.dtype)

    ones = torch.ones(1, prefix, dtype=torch.bool, device=device)
    seq.forward(
        None,
        ones,
        torch.arange(prefix, device=device)[None],
        chain_structure(prefix, device),
        inputs_embeds=inputs(prefix),
    )
    n = HEADS_WIDTH
    args = (torch.ones(1, n, dtype=torch.bool, device=device), prefix + torch.arange(n, device=device)[None])
    structure, embeds = chain_structure(n, device), inputs(n)

    def step() -> torch.Tensor:
        out = seq.forward(None, *args, structure, inputs_embeds=embeds).last_hidden_state
        return torch.log_softmax(heads.project(out, None).float(), dim=-1)

    return median_seconds(step, seq, n, repeats, device)


def measure_pair(
    costs: PairCosts,
    device: torch.device,
    dtype: torch.dtype,
    deadline: float,
    compiled_widths: tuple[int, ...] = (),
    tiny: bool = False,
) -> None:
    """Fill in a pair's eager forward times (no `compiled_widths`: the target over `EAGER_WIDTHS`, the draft
    over one token) or its compiled ones (the target over `compiled_widths`, the draft over one token)."""
    compiled = bool(compiled_widths)
    target = build_random(costs.target, device, dtype, tiny)
    times = time_forwards(target, compiled_widths or EAGER_WIDTHS, compiled=compiled, deadline=deadline)
    if not compiled:
        costs.heads_eager = time_heads(target, deadline)
    del target
    draft = build_random(costs.draft, device, dtype, tiny)
    draft_time = time_forwards(draft, (1,), compiled=compiled, deadline=deadline).get(1)
    del draft
    if compiled:
        costs.compiled, costs.draft_compiled = times, draft_time
    else:
        costs.eager, costs.draft_eager = times, draft_time
    unmeasured = draft_time is None or (not compiled and costs.heads_eager is None)
    if len(times) < len(compiled_widths or EAGER_WIDTHS) or unmeasured:
        costs.notes.append("the deadline stopped some measurements: blank cells were not measured")
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _curve(times: dict[int, float], compiled: bool) -> Callable[[int], float] | None:
    """V(n) from measured points, `None` without a one-token point. Compiled: the forward is fed the bucketed
    width (`bucket`), priced at the narrowest measured width that holds it (an upper bound where that bucket
    itself was not measured). Eager: the simulator's `CostCurve` (linear between measured widths, the last
    segment extended, never downwards)."""
    if 1 not in times:
        return None
    points = sorted(times.items())

    def compiled_curve(n: int) -> float:
        wide_enough = [t for width, t in points if width >= bucket(n)]
        if not wide_enough:
            raise KeyError(n)
        return wide_enough[0]

    return compiled_curve if compiled else CostCurve.from_points(times, unit="s").time


def _family(method: str) -> str:
    return method.rsplit("-", 1)[0]


def predict(
    costs: PairCosts, records: list[StepRecord], overhead: dict[str, Overhead], max_gamma: int = 8
) -> list[Prediction]:
    """Each recorded method's predicted speedup on this pair, eager and compiled (heads: eager only); a
    draft-model chain at the draft length that predicts best (from 1 to `max_gamma`)."""
    plain = overhead["plain"]
    plain_host = plain.host_ms_per_token * plain.tokens_per_step / 1e3
    out = []
    for record in records:
        host_row = overhead.get(HOST_PATH.get(_family(record.method), ""))
        host = plain_host if host_row is None else host_row.host_ms_per_token * host_row.tokens_per_step / 1e3
        candidates = [record]
        if record.method.startswith("draft-chain"):
            candidates = [record.truncated(g) for g in range(1, max_gamma + 1)]
        speedups: dict[str, tuple[float | None, StepRecord | None]] = {}
        heads = record.method.startswith("heads")
        for mode, times, draft in (
            ("eager", costs.eager, costs.heads_eager if heads else costs.draft_eager),
            ("compiled", costs.compiled, None if heads else costs.draft_compiled),
        ):
            curve = _curve(times, mode == "compiled")
            best: tuple[float | None, StepRecord | None] = (None, None)
            for candidate in candidates:
                needs_draft = candidate.draft_forwards > 0
                if curve is None or (needs_draft and draft is None):
                    continue
                try:
                    value = candidate.predicted_speedup(curve, draft or 0.0, host, plain_host)
                except (KeyError, IndexError):
                    continue  # a width this mode did not measure
                if best[0] is None or value > best[0]:
                    best = (value, candidate)
            speedups[mode] = best
        chosen, compiled = speedups["eager"][1] or record, speedups["compiled"][1]
        name = chosen.method
        if compiled is not None and compiled.method != chosen.method:  # another draft length pays when compiled
            name += f" (compiled: {compiled.method}, tau {compiled.tau:.2f})"
        pair = f"{costs.target} / {costs.draft}"
        out.append(Prediction(pair, name, chosen.tau, speedups["eager"][0], speedups["compiled"][0]))
    return out


def run_device_check(
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    pairs: tuple[tuple[str, str], ...] | None = None,
    compiled_widths: tuple[int, ...] = COMPILED_WIDTHS,
    budget_seconds: float = 240.0,
    tiny: bool = False,
) -> dict[str, Any]:
    """Measure and predict (see the module's docstring); returns everything `format_device_check` prints."""
    from hf_specdec.bench.real_sizes import PAIRS

    torch_device = torch.device(device)
    start = time.perf_counter()
    deadline = start + budget_seconds
    setting, records = load_record()
    overhead_rows = measure_overhead(
        ["assistant-constant", "assistant", "lookup", "tree-8", "eagle"], new_tokens=64, repeats=3, device=torch_device
    )
    overhead = {row.path: row for row in overhead_rows}
    chosen = pairs or PAIRS
    measured = [PairCosts(target, draft) for target, draft in chosen]
    # Eager first (quick), then compiled (each width compiles once), the time left shared among the pairs.
    eager_deadline = start + budget_seconds / 2
    for costs in measured:
        measure_pair(costs, torch_device, dtype, eager_deadline, tiny=tiny)
    if compiled_widths:
        for index, costs in enumerate(measured):
            share = (deadline - time.perf_counter()) / (len(measured) - index)
            measure_pair(costs, torch_device, dtype, time.perf_counter() + share, compiled_widths, tiny)
    predictions = [p for costs in measured for p in predict(costs, records, overhead)]
    return {
        "device": _device_name(torch_device),
        "dtype": str(dtype).removeprefix("torch."),
        "tiny": tiny,
        "seconds": time.perf_counter() - start,
        "versions": f"torch {torch.__version__}",
        "record": setting,
        "overhead": [asdict(row) for row in overhead_rows],
        "pairs": [asdict(costs) for costs in measured],
        "predictions": [asdict(p) for p in predictions],
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(device)


def _ms(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value * 1e3:.2f}"


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def format_device_check(result: dict[str, Any]) -> str:
    """The markdown tables of a device check (blank cells: not measured before the deadline)."""
    lines = [
        f"Device: {result['device']}, {result['dtype']}{' (tiny models)' if result['tiny'] else ''}; "
        f"{result['versions']}; {result['seconds']:.0f} s",
        "",
        "Verification cost V(n), ms per forward of n new tokens after 256 cached (eager | compiled):",
        "",
    ]
    widths = sorted({int(n) for p in result["pairs"] for n in [*p["eager"], *p["compiled"]]})
    lines.append("| target | " + " | ".join(f"n={n}" for n in widths) + " |")
    lines.append("|---|" + "---|" * len(widths))
    for pair in result["pairs"]:
        cells = [f"{_ms(pair['eager'].get(n))} \\| {_ms(pair['compiled'].get(n))}" for n in widths]
        lines.append(f"| {pair['target']} | " + " | ".join(cells) + " |")
    lines += ["", "| draft | ms per token, eager | compiled | cost ratio c, eager | compiled |"]
    lines.append("|---|---|---|---|---|")
    for pair in result["pairs"]:
        ratios = [
            _x(d / t[1]).rstrip("x") if d is not None and 1 in t else ""
            for d, t in ((pair["draft_eager"], pair["eager"]), (pair["draft_compiled"], pair["compiled"]))
        ]
        lines.append(
            f"| {pair['draft']} | {_ms(pair['draft_eager'])} | {_ms(pair['draft_compiled'])} | {ratios[0]} | "
            f"{ratios[1]} |"
        )
    for pair in result["pairs"]:
        heads = pair.get("heads_eager")
        ratio = _x(heads / pair["eager"][1]).rstrip("x") if heads is not None and 1 in pair["eager"] else ""
        lines.append(f"| EAGLE-3 heads on {pair['target']}, {HEADS_WIDTH} tokens | {_ms(heads)} | | {ratio} | |")
    lines += ["", "Host (tiny models on this device):", "", "| path | host ms per token | reads per step |"]
    lines.append("|---|---|---|")
    for row in result["overhead"]:
        lines.append(f"| {row['path']} | {row['host_ms_per_token']:.3f} | {row['reads_per_step']:.2f} |")
    record = result["record"]
    lines += [
        "",
        f"Predicted speedup over plain decoding on this device (a prediction: acceptance recorded with "
        f"{record['target']} / {record['draft']}, {record['prompts']}, {record['dtype']}):",
        "",
        "| pair | method | tau | eager | compiled |",
        "|---|---|---|---|---|",
    ]
    for p in result["predictions"]:
        lines.append(f"| {p['pair']} | {p['method']} | {p['tau']:.2f} | {_x(p['eager'])} | {_x(p['compiled'])} |")
    notes = sorted({note for pair in result["pairs"] for note in pair["notes"]})
    if notes:
        lines += ["", *[f"Note: {note}." for note in notes]]
    return "\n".join(lines)
