"""The package's layout: no import cycles among its modules, and model code independent of training code."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from import_cycles import import_graph, layers, package_graph, strongly_connected  # noqa: E402

PACKAGE = ROOT / "src" / "hf_specdec"


def test_no_import_cycles_even_counting_deferred_imports() -> None:
    graph = import_graph(PACKAGE, deferred=True)
    cycles = [component for component in strongly_connected(graph) if len(component) > 1]
    assert not cycles, cycles


def test_subpackages_stack_in_layers_with_the_front_doors_above_the_drafters_above_the_loop() -> None:
    """No subpackage imports one that imports it back (directly or around a circle), deferred imports counted."""
    packages = package_graph(import_graph(PACKAGE, deferred=True), "hf_specdec")
    assert not strongly_connected(packages), strongly_connected(packages)
    level = {name.rsplit(".", 1)[1]: k for k, layer in enumerate(layers(packages)) for name in layer}
    assert level["generation"] < level["drafters"] < level["medusa"] < level["mtp"] < level["api"]
    assert level["trees"] < level["generation"]


def test_a_package_cycle_is_found_between_modules_that_do_not_cycle() -> None:
    graph = {"p": {}, "p.a.x": {"p.b.y": 3}, "p.b.y": {}, "p.b.z": {"p.a.w": 7}, "p.a.w": {}}
    assert not strongly_connected(graph)
    assert strongly_connected(package_graph(graph, "p")) == [["p.a", "p.b"]]


def test_model_and_decoding_code_do_not_import_training_code() -> None:
    """Loading heads to generate never needs the training stack (datasets, peft, the loss)."""
    graph = import_graph(PACKAGE)
    for module, imports in graph.items():
        decoding = (
            "hf_specdec.api",
            "hf_specdec.generation",
            "hf_specdec.drafters",
            "hf_specdec.mtp",
            "hf_specdec.trees",
        )
        if module.startswith(decoding) or module in (
            "hf_specdec.medusa.model",
            "hf_specdec.medusa.heads",
            "hf_specdec.medusa.recurrent",
        ):
            banned = [name for name in imports if name.startswith("hf_specdec.training") or name.endswith(".loss")]
            assert not banned, (module, banned)
