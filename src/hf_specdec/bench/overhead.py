"""What speculative decoding costs the host, beside plain `generate()`: host time per generated token and host
reads per step, on tiny random Llamas whose forwards cost little, so that the host's own work shows.

- Host time: the wall time of a generation less the time spent inside model forwards (the outermost
  `nn.Module` calls: target, draft, heads), per generated token. On a GPU this is the time in which the host,
  not the device, decides how fast decoding goes.
- Host reads (see `host_reads`): device values the host reads per decoding step; on a GPU each one waits for
  every kernel queued before it.
- Host operations (see `host_ops`): tensor operations dispatched outside model forwards per generated token, the
  machine-independent counterpart of host time.

The drafts are perfect (the draft model is a copy of the target, Medusa and EAGLE heads are untrained but every
step drafts), so each path runs its whole step every time. `hf-specdec overhead` prints the table.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from hf_specdec.api.mixin import speculative
from hf_specdec.bench.cost_curve import synchronize
from hf_specdec.bench.host_ops import count_host_ops
from hf_specdec.bench.host_reads import count_host_reads
from hf_specdec.generation.decisions import SpeculativeCosts
from hf_specdec.medusa.config import MedusaConfig
from hf_specdec.medusa.model import MedusaForCausalLM

#: The paths measured, with the `generate()` arguments each adds to plain greedy decoding: a draft model drafting
#: 4 tokens every step, or with its adaptive length; prompt lookup; a draft model's tree of 8 nodes; Medusa and
#: EAGLE heads (3 heads, their default trees).
PATHS: dict[str, dict[str, Any]] = {
    "plain": {},
    "assistant-constant": {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant"},
    "assistant": {},
    "lookup": {"prompt_lookup_num_tokens": 4},
    "tree-8": {"tree": 8},
    "medusa": {"medusa": True},
    "eagle": {"medusa": True},
}
_FREE = SpeculativeCosts(0.0, 0.0)  # every step drafts, whatever the clock says


@dataclass(frozen=True)
class Overhead:
    """One path's costs to the host.

    Attributes:
        path (`str`): the path (a key of `PATHS`).
        host_ms_per_token (`float`): host time per generated token (median over the repeats), milliseconds.
        relative (`float`): that, over plain decoding's.
        reads_per_step (`float`): host reads per decoding step (a target forward), the prefill's included.
        tokens_per_step (`float`): tokens generated per decoding step, per row.
        ops_per_token (`float`): tensor operations dispatched outside model forwards per generated token.
        ops_relative (`float`): that, over plain decoding's.
    """

    path: str
    host_ms_per_token: float
    relative: float
    reads_per_step: float
    tokens_per_step: float
    ops_per_token: float = 0.0
    ops_relative: float = 1.0


def tiny_llama(seed: int = 0) -> PreTrainedModel:
    """A random two-layer Llama (hidden size 64, 96 tokens) in float32, peaked so that greedy text varies."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=1,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model


@contextlib.contextmanager
def forward_time(device: torch.device | None = None) -> Iterator[list[float]]:
    """Seconds spent inside outermost `nn.Module` calls while the block runs (`[total]`); on a GPU each call is
    waited for, so that its kernels count as forward time, not as the host's."""
    total, depth, started = [0.0], [0], [0.0]

    def before(module: nn.Module, args: Any) -> None:
        if depth[0] == 0:
            started[0] = time.perf_counter()
        depth[0] += 1

    def after(module: nn.Module, args: Any, output: Any) -> None:
        depth[0] -= 1
        if depth[0] == 0:
            if device is not None:
                synchronize(device)
            total[0] += time.perf_counter() - started[0]

    handles = [
        nn.modules.module.register_module_forward_pre_hook(before),
        nn.modules.module.register_module_forward_hook(after),
    ]
    try:
        yield total
    finally:
        for handle in handles:
            handle.remove()


def measure_overhead(
    paths: list[str] | None = None,
    new_tokens: int = 128,
    batch_size: int = 1,
    repeats: int = 5,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> list[Overhead]:
    """Host time per token and host reads per step of each path (see the module's docstring), plain first.

    Args:
        paths (`list[str]`, *optional*): keys of `PATHS`; all by default. Plain decoding is always measured.
        new_tokens (`int`): tokens generated per row and call.
        batch_size (`int`): rows per call (random prompts of 16 tokens, no padding).
        repeats (`int`): timed calls per path, after one warm-up, the paths taking turns; the median counts.
        seed (`int`): seeds the models and the prompts.
        device (`str` or `torch.device`): where the models run (on a GPU, the host time is what the device
            waits for when the host is the bottleneck).
    """
    names = ["plain", *[p for p in (paths or list(PATHS)) if p != "plain"]]
    unknown = sorted(set(names) - set(PATHS))
    if unknown:
        raise ValueError(f"Unknown overhead paths {unknown}; choose from {list(PATHS)}.")
    base = tiny_llama(seed).to(device)
    prompts = torch.randint(4, 96, (batch_size, 16), generator=torch.Generator().manual_seed(seed)).to(device)
    calls = {name: _caller(name, base, prompts, new_tokens) for name in names}
    generated = batch_size * new_tokens
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in names:
        calls[name]()  # warm-up
    # Paths take turns, repeat after repeat: a machine whose speed drifts slows them all alike.
    for _ in range(repeats):
        for name in names:
            with forward_time(base.device) as inside:
                start = time.perf_counter()
                calls[name]()
                synchronize(base.device)
                wall = time.perf_counter() - start
            times[name].append((wall - inside[0]) / generated)
    rows: list[Overhead] = []
    plain_ms = plain_ops = 0.0
    for name in names:
        with count_host_reads() as reads:
            out = calls[name]()
        with count_host_ops() as operations:
            calls[name]()
        stats = getattr(out, "speculative", None)
        # The prefill is a step of plain decoding too.
        steps = float(stats.target_forwards.max()) + 1.0 if stats is not None else float(new_tokens)
        ms, ops = statistics.median(times[name]) * 1e3, operations[0] / generated
        plain_ms, plain_ops = (ms, ops) if name == "plain" else (plain_ms, plain_ops)
        reads_per_step = sum(reads.values()) / steps
        rows.append(Overhead(name, ms, ms / plain_ms, reads_per_step, new_tokens / steps, ops, ops / plain_ops))
    return rows


def _caller(name: str, base: PreTrainedModel, prompts: torch.Tensor, new_tokens: int) -> Callable[[], Any]:
    common: dict[str, Any] = dict(input_ids=prompts, max_new_tokens=new_tokens, do_sample=False)
    if name == "plain":
        return lambda: base.generate(**common)
    speculating = dict(common, return_dict_in_generate=True, speculative_costs=_FREE, **PATHS[name])
    if name in ("medusa", "eagle"):
        model = MedusaForCausalLM.from_base(copy.deepcopy(base), MedusaConfig(num_heads=3, head_type=name))
        return lambda: model.generate(**speculating)
    target = speculative(copy.deepcopy(base))
    if name != "lookup":
        speculating["assistant"] = copy.deepcopy(base)  # a perfect draft: every step runs whole
    return lambda: target.generate(**speculating)


def format_overhead(rows: list[Overhead]) -> str:
    """The table `hf-specdec overhead` prints."""
    lines = [
        "| path | host ms per token | vs plain | host ops per token | vs plain | host reads per step "
        "| tokens per step |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.path} | {row.host_ms_per_token:.3f} | {row.relative:.2f}x | {row.ops_per_token:.1f} | "
            f"{row.ops_relative:.2f}x | {row.reads_per_step:.2f} | {row.tokens_per_step:.2f} |"
        )
    return "\n".join(lines)
