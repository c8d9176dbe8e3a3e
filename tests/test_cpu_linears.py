"""Linear layers through oneDNN on a CPU (`pack_linears`): the same outputs up to float rounding, speculative
decoding of a packed model token for token plain greedy's, training and in-place changes still right, copies,
pickles and the int8 draft unaffected, and what cannot be packed refused with what to do."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from hf_specdec import SpeculativeCosts, cpu_linears, pack_linears, unpack_linears
from hf_specdec.bench.quantized import int8_draft
from hf_specdec.cli import build_parser
from hf_specdec.cpu_linears import PackedLinear
from tests.tiny_models import ragged_batch, tiny_model, tiny_target

NEW = 32


def _linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def _logits(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_packed_layers_compute_what_they_computed(arch: str, packed: bool) -> None:
    model = tiny_model(arch, seed=0)
    ids, mask = ragged_batch(3, seed=1)
    before, keys = _logits(model, ids, mask), list(model.state_dict())
    assert pack_linears(model, packed=packed) == len(_linears(model))
    assert all(type(m) is PackedLinear for m in _linears(model))
    after = _logits(model, ids, mask)
    assert torch.allclose(after, before, atol=1e-4, rtol=1e-4), (after - before).abs().max()
    assert list(model.state_dict()) == keys  # nothing added to what save_pretrained writes
    assert unpack_linears(model) == len(_linears(model))
    assert all(type(m) is nn.Linear for m in _linears(model))
    assert torch.equal(_logits(model, ids, mask), before)


@pytest.mark.parametrize("batch", [1, 3])
def test_speculative_decoding_of_packed_models_is_plain_greedy_of_them(batch: int) -> None:
    target, draft = tiny_target("llama"), tiny_model("llama", seed=3, num_layers=1, sharpen=4.0)
    pack_linears(target)
    pack_linears(draft)
    ids, mask = ragged_batch(batch, seed=4)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": NEW, "do_sample": False}
    plain = target.generate(**kwargs)
    kwargs["speculative_costs"] = SpeculativeCosts(draft_forward=0.1, verify_per_token=0.01)  # drafting pays
    for extra in (
        {"assistant": draft},
        {"assistant": draft, "prompt_lookup_num_tokens": 4},
        {"assistant": draft, "tree": 8},
    ):
        out = target.generate(**kwargs, **extra, return_dict_in_generate=True)
        assert torch.equal(out.sequences, plain), extra
        assert out.speculative.drafted_tokens.sum() > 0, extra


def test_a_packed_model_trains_and_follows_its_changed_weights() -> None:
    model = tiny_model("llama", seed=0)
    pack_linears(model)
    ids, mask = ragged_batch(2, seed=2)
    _logits(model, ids, mask)  # packs every layer
    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in _linears(model)[:-1])
    torch.optim.SGD(model.parameters(), lr=0.5).step()  # in place: the packed copies are now stale
    trained = _logits(model, ids, mask)
    unpack_linears(model)
    assert torch.allclose(trained, _logits(model, ids, mask), atol=1e-4, rtol=1e-4)


def test_packed_models_copy_and_pickle_after_use() -> None:
    model = tiny_model("llama", seed=0)
    pack_linears(model)
    ids, mask = ragged_batch(2, seed=2)
    expected = _logits(model, ids, mask)
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all(type(m) is PackedLinear and m._pack is None for m in _linears(copied))
        assert torch.allclose(_logits(copied, ids, mask), expected, atol=1e-6)


def test_the_int8_draft_of_a_packed_draft_quantises_every_linear_layer() -> None:
    draft = tiny_model("llama", seed=3, num_layers=1)
    pack_linears(draft)
    quantised = int8_draft(draft)
    assert not _linears(quantised), [type(m).__name__ for m in _linears(quantised)]
    assert all(type(m) is PackedLinear for m in _linears(draft))  # the draft itself is untouched


def test_what_cannot_be_packed_is_refused_or_left_as_it_is() -> None:
    with pytest.raises(ValueError, match=r"dtype=torch\.float32"):
        pack_linears(tiny_model("llama", seed=0).to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"no nn\.Linear"):
        pack_linears(nn.Sequential(nn.ReLU()))
    mixed = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).to(torch.bfloat16))
    assert pack_linears(mixed) == 1
    assert [type(m) for m in mixed] == [PackedLinear, nn.Linear]


def test_the_demo_packs_by_default_in_float32_and_the_benchmark_when_asked() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).pack_linears is None  # decided by the dtype the demo runs in
    assert parser.parse_args(["demo", "--no-pack-linears"]).pack_linears is False
    assert parser.parse_args(["bench"]).pack_linears is False
    assert parser.parse_args(["bench", "--pack-linears"]).pack_linears is True


def test_a_torch_without_onednn_is_refused_with_what_to_do(monkeypatch) -> None:
    assert cpu_linears.can_pack_linears()  # this torch runs the operators
    monkeypatch.setattr(cpu_linears, "can_pack_linears", lambda: False)
    with pytest.raises(RuntimeError, match="leave the layers as they are"):
        pack_linears(tiny_model("llama", seed=0))
    assert not cpu_linears.packs_by_default()


def test_forwards_onednn_cannot_run_take_torchs_own_path() -> None:
    layer = nn.Linear(8, 4)
    pack_linears(layer)
    layer.weight.requires_grad_(False)  # a bias that trains alone still gets its gradient
    layer(torch.randn(3, 8)).sum().backward()
    assert layer.bias.grad is not None and layer.bias.grad.abs().sum() > 0
    with torch.no_grad():
        assert layer(torch.randn(0, 8)).shape == (0, 4)  # no rows
        expected = nn.functional.linear(torch.ones(2, 8), layer.weight, layer.bias)
        layer.to(torch.bfloat16)  # moved: the packed copy is dropped, bf16 runs torch's own path
        assert layer._pack is None
        assert torch.allclose(layer(torch.ones(2, 8, dtype=torch.bfloat16)).float(), expected, atol=0.1)


def test_weights_made_in_inference_mode_are_packed_once() -> None:
    with torch.inference_mode():
        layer = nn.Linear(8, 4)
        pack_linears(layer)
        rows = torch.randn(3, 8)
        assert torch.allclose(layer(rows), nn.functional.linear(rows, layer.weight, layer.bias), atol=1e-5)
        first = layer._pack
        layer(rows)
        assert layer._pack is first


def test_the_commands_refuse_packing_where_it_cannot_run(capsys) -> None:
    from tests.test_cli_errors import assert_refused

    assert_refused(["demo", "--pack-linears", "--dtype", "bfloat16"], capsys, "--dtype float32")
    assert_refused(["bench", "--pack-linears", "--dtype", "bfloat16"], capsys, "--dtype float32")
    assert_refused(["bench", "--pack-linears", "--dtype", "float32", "--compile"], capsys, "drop --compile")


def test_weights_changed_in_place_under_inference_mode_are_packed_again() -> None:
    rows = torch.randn(3, 64)
    with torch.inference_mode():
        layer = nn.Linear(64, 32)  # inference tensors: no version counter
        pack_linears(layer)
        layer(rows)
        layer.weight.add_(1.0)
        assert torch.allclose(layer(rows), nn.functional.linear(rows, layer.weight, layer.bias), atol=1e-4)
    layer = nn.Linear(64, 32)
    pack_linears(layer)
    layer(rows)
    with torch.inference_mode():
        layer.weight.mul_(-2.0)
        assert torch.allclose(layer(rows), nn.functional.linear(rows, layer.weight, layer.bias), atol=1e-4)
    layer.weight.data += 0.5  # `.data`: no version bump
    assert torch.allclose(layer(rows), nn.functional.linear(rows, layer.weight, layer.bias), atol=1e-4)


def test_a_parametrized_weight_is_read_at_every_forward() -> None:
    from torch.nn.utils import parametrize

    class Scale(nn.Module):
        factor = 1.0

        def forward(self, weight: torch.Tensor) -> torch.Tensor:
            return weight * self.factor

    layer = nn.Linear(256, 256)
    pack_linears(layer)
    rows = torch.randn(3, 256)
    layer(rows)
    scale = Scale()
    parametrize.register_parametrization(layer, "weight", scale)  # a new tensor per access, often at a reused address
    for factor in torch.linspace(0.5, 2.0, 20).tolist():
        scale.factor = factor
        assert torch.allclose(layer(rows), nn.functional.linear(rows, layer.weight, layer.bias), atol=1e-4)


def test_a_merged_lora_adapter_is_read_by_a_packed_model() -> None:
    from peft import LoraConfig, get_peft_model

    model = tiny_model("llama", seed=0)
    pack_linears(model)
    ids, mask = ragged_batch(2, seed=2)
    _logits(model, ids, mask)  # packs every layer
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    merged = peft_model.merge_and_unload()
    packed = _logits(merged, ids, mask)
    unpack_linears(merged)
    assert torch.allclose(packed, _logits(merged, ids, mask), atol=1e-4, rtol=1e-4)


def test_weights_replaced_through_data_or_changed_off_the_first_column_are_packed_again() -> None:
    rows = torch.randn(3, 64)
    layer = nn.Linear(64, 128)  # sizes that are multiples of 64, as most layers' are
    pack_linears(layer)
    layer(rows)
    layer.weight.data[:, 1:] *= 2.0  # every column but the first
    assert torch.allclose(layer(rows), nn.functional.linear(rows, layer.weight, layer.bias), atol=1e-4)
    layer.weight.data = torch.randn(128, 64)  # another tensor behind the same parameter
    assert torch.allclose(layer(rows), nn.functional.linear(rows, layer.weight, layer.bias), atol=1e-4)
