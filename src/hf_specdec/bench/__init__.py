"""The benchmark: real models and real prompts, methods interleaved prompt by prompt in one process."""

from hf_specdec.bench.methods import METHODS, Method, method_by_name
from hf_specdec.bench.prompts import CATEGORIES, Prompt, load_prompts
from hf_specdec.bench.report import BenchmarkResult
from hf_specdec.bench.runner import run_benchmark

__all__ = [
    "CATEGORIES",
    "METHODS",
    "BenchmarkResult",
    "Method",
    "Prompt",
    "load_prompts",
    "method_by_name",
    "run_benchmark",
]
