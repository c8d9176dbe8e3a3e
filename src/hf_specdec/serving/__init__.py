"""Serving trained heads beyond one process: export to vLLM, TGI and TensorRT-LLM (see docs/serving.md).

Reading heads published in those engines' layouts and FasterDecoding's is part of loading heads
(`hf_specdec.medusa.importer`); `read_heads` and `ImportedHeads` are re-exported here as before."""

from hf_specdec.medusa.importer import ImportedHeads, read_heads
from hf_specdec.serving.export import ENGINES, check_exportable, export_heads, export_pretrained

__all__ = ["ENGINES", "ImportedHeads", "check_exportable", "export_heads", "export_pretrained", "read_heads"]
