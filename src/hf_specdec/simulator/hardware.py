"""A roofline model of what a forward pass costs on a device, for "what if" questions about hardware.

Decoding one token at batch size 1 streams every weight from memory once and does about 2 FLOPs per
weight per token (Kaplan et al. 2020; attention's FLOPs are left out). So a forward over n tokens takes

    t(n) = max(weight bytes / bandwidth, 2 * params * n / peak FLOP/s) + overhead      (GPU: overlapped)
    t(n) = weight bytes / bandwidth + 2 * params * n / peak FLOP/s + overhead          (CPU: serial)

plus, optionally, the KV cache read for the context. While the weight traffic dominates, verifying n
tokens costs what one costs; this is what makes speculative decoding pay. A GPU overlaps memory traffic
with tensor-core math, hence the max; a CPU does not: the curve measured on 2 threads of an AMD EPYC
(`CPU_QWEN_1_5B_BF16`, and the device fitted to it, `EPYC_2_THREADS`) is a straight line in n from the first
token on, which the serial sum fits.

Example: a 70B target in bf16 on an H100 streams 140 GB per forward; at 3.35 TB/s that is 42 ms per
token before any overhead, and verifying 64 tokens (9 TFLOP, 9 ms of math) is no slower.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.validation import check_nonnegative, check_positive


@dataclass(frozen=True)
class Device:
    """A device's roofline.

    Args:
        name (`str`): a short name, as the CLI's `--device` takes it.
        memory_bandwidth (`float`): bytes per second the weights stream at.
        peak_flops (`float`): FLOP/s of dense matrix multiplication in the model's dtype.
        overhead (`float`): seconds every forward adds on top (kernel launches, Python, synchronisation).
        overlap (`bool`): memory traffic and math overlap (the time is their max) or not (their sum).
        source (`str`): where the figures come from.
    """

    name: str
    memory_bandwidth: float
    peak_flops: float
    overhead: float = 0.0
    overlap: bool = True
    source: str = ""

    def __post_init__(self) -> None:
        check_positive("memory_bandwidth", self.memory_bandwidth, "bytes per second, e.g. 3.35e12 for an H100")
        check_positive("peak_flops", self.peak_flops, "FLOP/s, e.g. 989e12 for an H100 in bf16")
        check_nonnegative("overhead", self.overhead, "seconds added to every forward")


@dataclass(frozen=True)
class ModelSpec:
    """What the roofline needs to know about a model.

    Args:
        params (`float`): parameters read per forward (the embedding table is only gathered from, so it can
            be left out; a separate lm_head counts).
        bytes_per_param (`float`): 2 for bf16/fp16, 1 for int8/fp8, about 0.5 for 4-bit.
        kv_bytes_per_token (`float`): KV cache bytes per context token (2 * layers * kv_heads * head_dim *
            bytes), read once per forward; 0 ignores the KV cache.
        name (`str`): for display.
    """

    params: float
    bytes_per_param: float = 2.0
    kv_bytes_per_token: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        check_positive("params", self.params, "the parameter count, e.g. 70e9")
        check_positive("bytes_per_param", self.bytes_per_param, "2 for bf16, 1 for int8")
        check_nonnegative("kv_bytes_per_token", self.kv_bytes_per_token, "KV cache bytes per context token")


def forward_time(
    model: ModelSpec, device: Device, num_tokens: int = 1, *, batch_size: int = 1, context_length: int = 0
) -> float:
    """Seconds of one forward over `num_tokens` new tokens per row, for `batch_size` rows."""
    if num_tokens < 1 or batch_size < 1 or context_length < 0:
        raise ValueError(
            f"Need num_tokens >= 1, batch_size >= 1 and context_length >= 0, got {num_tokens}, {batch_size}, "
            f"{context_length}."
        )
    traffic = model.params * model.bytes_per_param + model.kv_bytes_per_token * context_length * batch_size
    memory = traffic / device.memory_bandwidth
    compute = 2.0 * model.params * num_tokens * batch_size / device.peak_flops
    body = max(memory, compute) if device.overlap else memory + compute
    return body + device.overhead


@dataclass(frozen=True)
class DeviceCosts:
    """A target/draft pair's costs on a device, in the closed forms' terms.

    Args:
        target_seconds (`float`): one target forward over one token (plain decoding's time per token).
        cost_ratio (`float`): c, one draft forward over one token in target forwards (0 without a draft).
        verify_cost (`CostCurve`): V(n), the target's forward over n tokens relative to one token.
    """

    target_seconds: float
    cost_ratio: float
    verify_cost: CostCurve


def device_costs(
    target: ModelSpec,
    draft: ModelSpec | None,
    device: Device,
    *,
    max_tokens: int = 128,
    batch_size: int = 1,
    context_length: int = 0,
) -> DeviceCosts:
    """The roofline's c and V(n), n = 1..`max_tokens`, for `target` verifying what `draft` proposes."""
    kwargs = {"batch_size": batch_size, "context_length": context_length}
    times = tuple(forward_time(target, device, n, **kwargs) for n in range(1, max_tokens + 1))
    draft_seconds = 0.0 if draft is None else forward_time(draft, device, 1, **kwargs)
    curve = CostCurve(tuple(range(1, max_tokens + 1)), times, unit="s", source=f"roofline of {device.name}")
    return DeviceCosts(times[0], draft_seconds / times[0], curve)


def fit_serial_device(
    name: str,
    model: ModelSpec,
    curve: CostCurve,
    seconds_per_unit: float,
    draft: tuple[ModelSpec, float] | None = None,
    source: str = "",
) -> Device:
    """Fit a serial (CPU-like) roofline to a measured cost curve.

    A least-squares line through the curve gives the time per token (the math: peak FLOP/s) and the time at
    zero tokens (weight traffic plus overhead). A second model's one-token time, `draft = (spec, seconds)`,
    separates the two: both pay the same overhead but stream different bytes. Without it the overhead is 0.

    Args:
        name (`str`): the device's name.
        model (`ModelSpec`): the model the curve was measured on.
        curve (`CostCurve`): its measured forward times.
        seconds_per_unit (`float`): 1e-3 when the curve is in milliseconds.
        draft (`tuple[ModelSpec, float]`, *optional*): another model and its measured one-token seconds.
        source (`str`): where the measurements come from.
    """
    n = [float(t) for t in curve.tokens]
    t = [x * seconds_per_unit for x in curve.times]
    mean_n, mean_t = sum(n) / len(n), sum(t) / len(t)
    var_n = sum((x - mean_n) ** 2 for x in n)
    if len(n) < 2 or var_n == 0:
        raise ValueError("Fitting a device needs a cost curve with at least two token counts.")
    slope = sum((x - mean_n) * (y - mean_t) for x, y in zip(n, t, strict=True)) / var_n  # seconds per token
    intercept = mean_t - slope * mean_n  # seconds at 0 tokens: traffic + overhead
    if slope <= 0 or intercept <= 0:
        raise ValueError(f"The cost curve does not rise with n (slope {slope:.3g} s/token); it cannot be fitted.")
    weight_bytes = model.params * model.bytes_per_param
    overhead, traffic_seconds = 0.0, intercept
    if draft is not None:
        spec, seconds = draft
        draft_zero = seconds - slope * spec.params / model.params  # minus the draft's own math for one token
        bandwidth = (weight_bytes - spec.params * spec.bytes_per_param) / (intercept - draft_zero)
        traffic_seconds = weight_bytes / bandwidth
        overhead = intercept - traffic_seconds
        if not (bandwidth > 0 and overhead >= 0):
            raise ValueError("The draft's time is inconsistent with the curve (negative bandwidth or overhead).")
    return Device(
        name=name,
        memory_bandwidth=weight_bytes / traffic_seconds,
        peak_flops=2.0 * model.params / slope,
        overhead=overhead,
        overlap=False,
        source=source,
    )


QWEN_1_5B = ModelSpec(1.5437e9, 2.0, name="Qwen2.5-Coder-1.5B (bf16, without the embedding table)")
QWEN_0_5B = ModelSpec(0.4940e9, 2.0, name="Qwen2.5-Coder-0.5B (bf16, without the embedding table)")

EPYC_2_THREADS = Device(
    name="cpu",
    memory_bandwidth=33.22e9,
    peak_flops=854.8e9,
    overhead=0.02410,
    overlap=False,
    source=(
        "fit_serial_device on CPU_QWEN_1_5B_BF16 (Qwen2.5-Coder-1.5B forwards, n = 1..64) and the 0.5B's 55 ms "
        "per token, 2 threads of an AMD EPYC, bf16, transformers eager: effective, not peak, figures"
    ),
)
"""Two threads of an AMD EPYC server CPU, fitted to forwards measured there (bf16, transformers eager): effective
figures, not the chip's peaks. The CLI's `--device cpu`."""
A100_80GB = Device(
    "a100", 2.039e12, 312e12, source="NVIDIA A100 datasheet, SXM4 80GB: 2,039 GB/s HBM2e, 312 TFLOP/s bf16 dense"
)
H100_SXM = Device(
    "h100", 3.35e12, 989e12, source="NVIDIA H100 datasheet, SXM5 80GB: 3.35 TB/s HBM3, 989 TFLOP/s bf16 dense"
)
H200 = Device("h200", 4.8e12, 989e12, source="NVIDIA H200 datasheet, SXM 141GB: 4.8 TB/s HBM3e, 989 TFLOP/s bf16 dense")

DEVICES = {device.name: device for device in (EPYC_2_THREADS, A100_80GB, H100_SXM, H200)}
"""Presets by name. The GPU figures are data-sheet peaks with no overhead: real runs reach perhaps 80-90%
of the bandwidth, and eager transformers adds milliseconds per forward (pass `overhead`, or the CLI's
`--overhead-ms`)."""
