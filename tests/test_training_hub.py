"""Publishing heads and loading them back, without the network: the upload runs `huggingface_hub` down to
`HfApi.create_commit`, whose operations are recorded (and `create_repo`, answered locally); the download reads a
folder laid out as the Hub cache lays it out (`models--org--name/snapshots/<commit>/`, `refs/<branch>`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl

from hf_specdec import MedusaConfig, MedusaForCausalLM
from hf_specdec.medusa.card import model_card
from tests.recipe import recipe_main
from tests.test_training import _conversations, tiny_tokenizer
from tests.tiny_models import tiny_model

REPO = "org/tiny-heads"


class HubRecorder:
    """Stands in for the Hub's side of `HfApi`: records repositories created and commits sent."""

    def __init__(self) -> None:
        self.repos: list[tuple[str, dict]] = []
        self.commits: list[dict] = []

    # Set on `HfApi` as bound methods of the recorder: calls on any `HfApi` instance land here.
    def create_repo(self, repo_id: str, **kwargs) -> RepoUrl:
        self.repos.append((repo_id, kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id: str, operations, **kwargs) -> CommitInfo:
        files = {}
        for operation in operations:
            with operation.as_file() as file:
                files[operation.path_in_repo] = file.read()
        self.commits.append({"repo_id": repo_id, "files": files, **kwargs})
        return CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/{'1' * 40}",
            commit_message=kwargs.get("commit_message", ""),
            commit_description="",
            oid="1" * 40,
        )


@pytest.fixture
def hub(monkeypatch) -> HubRecorder:
    recorder = HubRecorder()
    monkeypatch.setattr(HfApi, "create_repo", recorder.create_repo)
    monkeypatch.setattr(HfApi, "create_commit", recorder.create_commit)
    return recorder


def _recipe():
    main = recipe_main()
    return main


def _lay_out_snapshot(cache: Path, repo_id: str, commit: str, files: dict[str, bytes], refs: list[str]) -> None:
    """Files as `snapshot_download` leaves them in the Hub cache."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for name, content in files.items():
        path = repo / "snapshots" / commit / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)


@pytest.mark.parametrize("head_type", ["medusa", "eagle"])
def test_recipe_publishes_card_config_heads_and_metrics_and_they_load_back(
    tmp_path: Path, hub: HubRecorder, head_type: str
) -> None:
    base_dir = tmp_path / "base"
    tiny_model("llama", seed=0).save_pretrained(base_dir)
    tiny_tokenizer().save_pretrained(base_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _conversations(16)))
    out = tmp_path / "heads"
    _recipe()(
        [
            "--base", str(base_dir), "--data", str(data), "--num_heads", "2", "--share_lm_head", "false",
            "--cache_hidden_states", "--eval_fraction", "0.25", "--output_dir", str(out), "--max_steps", "3",
            "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
            "--push_to_hub", "--hub_model_id", REPO, "--hub_private_repo", "true", "--head_type", head_type,
        ]
    )  # fmt: skip
    assert [repo for repo, _ in hub.repos] == [REPO] and hub.repos[0][1]["private"] is True
    assert len(hub.commits) == 1
    files = hub.commits[0]["files"]
    assert sorted(files) == ["README.md", "eval_metrics.json", "medusa_config.json", "medusa_heads.safetensors"]
    assert files["eval_metrics.json"] == (out / "eval_metrics.json").read_bytes()
    assert files["medusa_heads.safetensors"] == (out / "medusa_heads.safetensors").read_bytes()

    card = ModelCard(files["README.md"].decode())
    assert card.data.library_name == "hf_specdec"
    assert {"speculative-decoding", head_type} <= set(card.data.tags)
    assert card.data.base_model is None  # a local folder is not Hub metadata
    assert "Model Card for Model ID" not in card.text
    assert "python recipes/train_medusa.py --base" in card.text and "--push_to_hub" in card.text
    config = json.loads(files["medusa_config.json"])
    top1 = " | ".join(f"{a:.3f}" for a in config["measured_top1"])
    assert f"| top-1 | {top1} |" in card.text
    assert f'MedusaForCausalLM.from_pretrained("{REPO}")' in card.text
    assert (out / "README.md").read_text().startswith("---\n")  # the local copy is the library's card too

    # What was sent, laid out as the Hub cache holds it, loads back offline with every measurement.
    cache = tmp_path / "hub-cache"
    _lay_out_snapshot(cache, REPO, "1" * 40, files, ["main"])
    loaded = MedusaForCausalLM.from_pretrained(
        REPO, base_model=tiny_model("llama", seed=0), cache_dir=cache, local_files_only=True
    )
    assert loaded.config.head_type == head_type and loaded.config.measured_top1 == config["measured_top1"]
    assert (
        loaded.config.tree == config["tree"] and loaded.config.extra["expected_tau"] == config["extra"]["expected_tau"]
    )
    saved = safetensors.torch.load_file(out / "medusa_heads.safetensors")
    for name, tensor in loaded.heads.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_from_pretrained_takes_revision_token_cache_dir_and_works_offline(tmp_path: Path, monkeypatch) -> None:
    base = tiny_model("llama", seed=0)
    snapshots = {}
    for seed, commit in ((1, "a" * 40), (2, "b" * 40)):
        torch.manual_seed(seed)
        model = MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, share_lm_head=False))
        with torch.no_grad():
            for parameter in model.heads.parameters():
                parameter.add_(torch.randn_like(parameter))
        folder = tmp_path / f"saved-{seed}"
        model.save_pretrained(folder)
        snapshots[commit] = {p.name: p.read_bytes() for p in folder.iterdir()}
        snapshots[commit + "-heads"] = model.heads.state_dict()
    cache = tmp_path / "cache"
    _lay_out_snapshot(cache, REPO, "a" * 40, snapshots["a" * 40], ["main"])
    _lay_out_snapshot(cache, REPO, "b" * 40, snapshots["b" * 40], ["v2"])

    def heads_equal(model: MedusaForCausalLM, commit: str) -> bool:
        expected = snapshots[commit + "-heads"]
        return all(torch.equal(v, expected[k]) for k, v in model.heads.state_dict().items())

    common = {"base_model": base, "cache_dir": cache, "local_files_only": True, "token": "hf_not_used"}
    assert heads_equal(MedusaForCausalLM.from_pretrained(REPO, **common), "a" * 40)
    assert heads_equal(MedusaForCausalLM.from_pretrained(REPO, revision="v2", **common), "b" * 40)
    assert heads_equal(MedusaForCausalLM.from_pretrained(REPO, revision="b" * 40, **common), "b" * 40)
    with pytest.raises(ValueError, match="is not a folder"):
        MedusaForCausalLM.from_pretrained(REPO, revision="missing", **common)
    # HF_HUB_OFFLINE=1 (read by huggingface_hub at import, hence the constant) without local_files_only.
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert heads_equal(MedusaForCausalLM.from_pretrained(REPO, base_model=base, cache_dir=cache), "a" * 40)


@pytest.mark.parametrize(
    ("head_type", "fields", "title", "structure", "wrong"),
    [
        (
            "medusa",
            {"num_layers": 2},
            "# Medusa heads for org/base",
            ["3 independent Medusa heads", "2 residual SiLU blocks per head", "tree: the preset medium"],
            ["EAGLE", "decoder"],
        ),
        (
            "recurrent",
            {},
            "# Recurrent draft heads for org/base",
            ["one recurrent drafter shared by every depth", "1 residual SiLU block;", "drafts 3 deep"],
            ["Medusa heads", "EAGLE", "per head"],
        ),
        (
            "eagle",
            {"intermediate_size": 96},
            "# EAGLE draft head for org/base",
            ["EAGLE-1/2 architecture", "a decoder of 1 layer of the base's own architecture", "MLP width 96"],
            ["Medusa", "residual", "per head", "preset"],
        ),
        (
            "eagle3",
            {"feature_layers": [1, 4, 7]},
            "# EAGLE-3 draft head for org/base",
            ["one Llama-style layer", "hidden states 1, 4 and 7", "its own lm_head", "a dynamic tree"],
            ["Medusa", "residual", "per head", "preset", "the base's lm_head"],
        ),
    ],
)
def test_the_card_names_the_head_type_and_describes_its_structure(
    head_type: str, fields: dict, title: str, structure: list[str], wrong: list[str]
) -> None:
    config = MedusaConfig(
        num_heads=3, head_type=head_type, base_model_name_or_path="org/base", measured_top1=[0.5, 0.3, 0.2], **fields
    )
    card = model_card(config)
    body = card.text.split("## Usage")[0]  # the usage snippet names MedusaForCausalLM whatever the heads
    assert body.lstrip().startswith(title)
    assert f"- head type: `{head_type}`" in body and head_type in card.data.tags
    for text in structure:
        assert text in body, text
    for text in wrong:
        assert text not in body, text
    column = "head" if head_type == "medusa" else "depth"
    assert f"| | {column} 1 | {column} 2 | {column} 3 |" in body


def test_model_card_metadata_and_push_keep_the_librarys_card(tmp_path: Path, hub: HubRecorder) -> None:
    config = MedusaConfig(
        num_heads=2,
        base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct",
        measured_top1=[0.5, 0.25],
        extra={
            "training_data": f"HuggingFaceH4/ultrachat_200k,{tmp_path}",
            "top5": [0.75, 0.5],
            "expected_tau": 1.8,
            "measured_speedup": "1.9x plain generate() (batch 1, H100)",
            "training_command": "python recipes/train_medusa.py --base x",
        },
    )
    card = model_card(config, REPO)
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.data.datasets == ["HuggingFaceH4/ultrachat_200k"]  # the local source is left out of metadata
    assert "| top-5 | 0.750 | 0.500 |" in card.text and "1.9x plain" in card.text
    model = MedusaForCausalLM.from_base(tiny_model("llama", seed=0), config)
    model.push_to_hub(REPO, commit_message="heads", revision="dev")
    commit = hub.commits[0]
    assert commit["commit_message"] == "heads" and commit["revision"] == "dev"
    pushed = ModelCard(commit["files"]["README.md"].decode())
    assert pushed.data.library_name == "hf_specdec" and pushed.data.base_model == config.base_model_name_or_path


def test_push_down_to_the_http_layer(tmp_path: Path) -> None:
    """`push_to_hub` through the whole of `huggingface_hub` (repository creation, the pre-upload query, the commit's
    NDJSON payload), answered by an in-process transport standing in for the Hub."""
    import base64

    import httpx2
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    sent: list[tuple[str, str]] = []
    commits: list[list[dict]] = []
    validated: list[str] = []

    def hub(request: httpx2.Request) -> httpx2.Response:
        sent.append((request.method, request.url.path))
        if request.url.path == "/api/repos/create":
            return httpx2.Response(200, json={"url": f"https://huggingface.co/{REPO}"})
        if request.url.path == "/api/validate-yaml":  # the card's metadata, checked before anything is uploaded
            validated.append(json.loads(request.content)["content"])
            return httpx2.Response(200, json={"errors": [], "warnings": []})
        if f"/api/models/{REPO}/preupload/" in request.url.path:
            files = json.loads(request.content)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files]
            return httpx2.Response(200, json={"files": modes})
        if f"/api/models/{REPO}/commit/" in request.url.path:
            commits.append([json.loads(line) for line in request.content.splitlines()])
            url = f"https://huggingface.co/{REPO}/commit/{'2' * 40}"
            return httpx2.Response(200, json={"commitUrl": url, "commitOid": "2" * 40, "pullRequestUrl": None})
        return httpx2.Response(404, json={"error": f"unexpected {request.method} {request.url.path}"})

    config = MedusaConfig(num_heads=2, share_lm_head=False, measured_top1=[0.4, 0.2], extra={"top5": [0.6, 0.3]})
    model = MedusaForCausalLM.from_base(tiny_model("llama", seed=0), config)
    metrics = tmp_path / "eval_metrics.json"
    metrics.write_text(json.dumps({"eval_head0_top1": 0.4}))
    set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub)))
    try:
        info = model.push_to_hub(REPO, token="hf_test", extra_files={"eval_metrics.json": metrics})
    finally:
        set_client_factory(default_client_factory)
    assert info.oid == "2" * 40
    # (huggingface_hub may also GET registries of its own for its user agent: answered 404, left out here.)
    posts = [path for method, path in sent if method == "POST"]
    assert [path.split("/")[2] for path in posts] == ["repos", "validate-yaml", "models", "models"]
    assert "/preupload/" in posts[2] and "/commit/" in posts[3]
    (header, *files) = commits[0]
    assert header["key"] == "header" and header["value"]["summary"] == "Upload Medusa heads"
    uploaded = {f["value"]["path"]: base64.b64decode(f["value"]["content"]) for f in files}
    assert sorted(uploaded) == ["README.md", "eval_metrics.json", "medusa_config.json", "medusa_heads.safetensors"]
    assert ModelCard(uploaded["README.md"].decode()).data.library_name == "hf_specdec"
    assert validated == [uploaded["README.md"].decode()]
    assert json.loads(uploaded["medusa_config.json"])["measured_top1"] == [0.4, 0.2]
    heads = safetensors.torch.load(uploaded["medusa_heads.safetensors"])
    for name, tensor in model.heads.state_dict().items():
        assert torch.equal(heads[name], tensor), name
