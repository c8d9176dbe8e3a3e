"""Serving trained heads beyond one process: export to vLLM, TGI and TensorRT-LLM, and import of the layouts
those engines and FasterDecoding's releases use (see docs/serving.md)."""

from hf_specdec.serving.export import ENGINES, check_exportable, export_heads, export_pretrained
from hf_specdec.serving.importer import ImportedHeads, read_heads

__all__ = ["ENGINES", "ImportedHeads", "check_exportable", "export_heads", "export_pretrained", "read_heads"]
