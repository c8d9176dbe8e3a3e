"""`hf-specdec demo` on tiny random models (the real pair is loaded only by the command itself): what it prints
before the timings, the warm-up of both models, a line per timed run, the verdict on the runs it shows, and step
counts that agree with the statistics."""

from __future__ import annotations

import re

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from hf_specdec import SpeculativeCosts
from hf_specdec.bench import demo
from hf_specdec.cli import main
from tests.tiny_models import VOCAB, tiny_model

PROMPTS = ["t5 t9 t14 t20 t33 t5 t9", "t7 t8 t40"]


def _tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t2"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="t0", eos_token="t3", padding_side="left")


class DemoWorld:
    """Tiny models in place of the zoo's, with their forwards counted and every timed run recorded."""

    def __init__(self, agreeing_draft: bool) -> None:
        self.agreeing_draft = agreeing_draft
        self.target = tiny_model("llama", seed=0, sharpen=4.0)
        # The target's own weights draft every token right; a one-layer model of other weights mostly does not.
        self.draft = tiny_model("llama", seed=0, sharpen=4.0) if agreeing_draft else tiny_model("llama", 1, 1, 4.0)
        self.forwards = {"target": 0, "draft": 0}
        for name, model in (("target", self.target), ("draft", self.draft)):
            model.get_input_embeddings().register_forward_hook(self._counter(name))
        self.forwards_before_timing: dict[str, int] | None = None
        self.untimed_paths: list[str] = []  # the paths of `generate()` calls before the first timed one
        self.timed: list[tuple[dict, demo.Run]] = []
        target = self.target

        def generate(**kwargs):  # the class's generate(), speculative once the demo has made it so
            if self.forwards_before_timing is None:
                self.untimed_paths.append(_path(kwargs))
            if "assistant" in kwargs:  # decisions from the tokens alone (the twin draft costs what the target does)
                kwargs.setdefault("speculative_costs", SpeculativeCosts(0.1, 0.01))
            return type(target).generate(target, **kwargs)

        target.generate = generate

    def _counter(self, name: str):
        def count(*_) -> None:
            self.forwards[name] += 1

        return count

    def load_model(self, name: str, dtype: torch.dtype = torch.float32):
        return {"target": self.target, "draft": self.draft}[name], _tokenizer()

    def timed_generate(self, model, inputs, pad, **kwargs) -> demo.Run:
        if self.forwards_before_timing is None:
            self.forwards_before_timing = dict(self.forwards)
        run = TIMED_GENERATE(model, inputs, pad, **kwargs)
        self.timed.append((kwargs, run))
        return run

    def runs(self, path: str) -> list[demo.Run]:
        return [run for kwargs, run in self.timed if _path(kwargs) == path]


def _path(kwargs: dict) -> str:
    if "assistant" not in kwargs:
        return "plain"
    return "lookup" if "prompt_lookup_num_tokens" in kwargs else "draft"


TIMED_GENERATE = demo.timed_generate


@pytest.fixture
def world(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> DemoWorld:
    world = DemoWorld(agreeing_draft=getattr(request, "param", True))
    monkeypatch.setattr(demo, "load_model", world.load_model)
    monkeypatch.setattr(demo, "timed_generate", world.timed_generate)
    return world


def _run(prompts: list[str], capsys: pytest.CaptureFixture, repeats: int = 1, max_new_tokens: int = 24) -> str:
    identical = demo.run_demo("target", "draft", prompts, max_new_tokens, torch.float32, None, repeats=repeats)
    assert identical  # float32: speculative greedy gives plain greedy's tokens
    return capsys.readouterr().out


def _before_timings(out: str) -> str:
    return out[: out.index("\n=== plain generate()")]


def test_demo_shows_the_prompt_and_the_settings_before_the_timings(world: DemoWorld, capsys) -> None:
    head = _before_timings(_run(PROMPTS[:1], capsys))
    assert f"prompt: {PROMPTS[0]}\n" in head
    settings = next(line for line in head.splitlines() if line.startswith("settings: "))
    for part in (
        "greedy",
        "batch size 1",
        "float32",
        "device cpu",
        f"{torch.get_num_threads()} torch thread",
        "up to 24 new tokens",
        f"drafts of up to {demo.DEFAULT_NUM_ASSISTANT_TOKENS} tokens per step",
    ):
        assert part in settings
    assert "untimed warm-up of both models on every path, then one run of each path" in head
    assert "times still vary" in head


def test_demo_numbers_each_prompt_of_a_batch(world: DemoWorld, capsys) -> None:
    head = _before_timings(_run(PROMPTS, capsys))
    assert f"prompt 1: {PROMPTS[0]}\n" in head and f"prompt 2: {PROMPTS[1]}\n" in head
    assert "batch size 2" in head


def test_demo_warms_up_both_models_on_every_path_before_timing(world: DemoWorld, capsys) -> None:
    _run(PROMPTS[:1], capsys)
    before = world.forwards_before_timing
    assert before is not None
    assert before["target"] > 0 and before["draft"] > 0
    assert sorted(world.untimed_paths) == ["draft", "lookup", "plain"]  # each path once, untimed
    timed = len(world.untimed_paths) + len(world.timed)
    assert len(world.timed) == 3 and timed == 6


def test_demo_prints_a_line_per_run_and_judges_the_runs_it_shows(world: DemoWorld, capsys) -> None:
    out = _run(PROMPTS[:1], capsys, repeats=2, max_new_tokens=12)
    for line in ("target loaded", "warm-up, draft + lookup", "timed run 1 of 2, plain", "timed run 2 of 2, draft"):
        assert line in out, line
    assert out.count("tokens: identical to plain generate()'s (2 of 2 timed runs identical)") == 2


def test_demo_help_says_what_it_prints_and_how_it_times(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"after a warm-up of both models, the median of {demo.REPEATS} timed runs" in text
    assert "Prints the prompts and the settings" in text and "how many were plain" in text


def test_demo_times_each_path_repeats_times_and_shows_the_range(world: DemoWorld, capsys) -> None:
    out = _run(PROMPTS[:1], capsys, repeats=3, max_new_tokens=12)
    assert [len(world.runs(path)) for path in ("plain", "draft", "lookup")] == [3, 3, 3]
    assert "3 runs of each path in turn; the median is shown" in out
    assert len(re.findall(r"\(3 runs: [\d.]+-[\d.]+ s\)", out)) == 2


_STEPS = re.compile(
    r"steps \(target forwards after the prefill\): (\d+), (\d+) drafted, (\d+) plain \(nothing drafted\)"
    r"(?:; (\d+) chosen by the speculation gate[^;\n]*)?(?:; (\d+) where the drafter proposed nothing)?\n"
    r"drafted steps: (\d+) tokens drafted, (\d+) accepted \((\d+)%\); all steps: ([\d.]+) tokens per target forward"
)


@pytest.mark.parametrize("world", [True, False], ids=["agreeing-draft", "disagreeing-draft"], indirect=True)
def test_demo_step_counts_agree_with_the_statistics(world: DemoWorld, capsys) -> None:
    out = _run(PROMPTS[:1], capsys)
    (run,) = world.runs("draft")
    stats = run.stats
    assert stats is not None
    match = _STEPS.search(out)
    assert match is not None, out
    steps, drafted, plain, gate, nothing, drafted_tokens, accepted, percent = (int(g or 0) for g in match.groups()[:8])
    assert steps == drafted + plain == int(stats.target_forwards[0]) == sum(stats.verify_widths.values())
    assert plain == stats.verify_widths.get(1, 0) == gate + nothing
    assert gate == stats.plain_steps
    assert (drafted_tokens, accepted) == (int(stats.drafted_tokens[0]), int(stats.accepted_tokens[0]))
    assert percent == round(100 * accepted / max(drafted_tokens, 1))
    assert float(match.group(9)) == pytest.approx(float(stats.tau[0]), abs=0.005)
    if drafted:  # every drafted step proposed something
        assert drafted_tokens >= drafted
    if world.agreeing_draft:  # all drafts accepted, and yet not every step drafted: the count says how many
        assert percent == 100 and accepted == drafted_tokens > 0
    lookup = re.search(r"(\d+) of (\d+) steps drafted by lookup", out)
    (lookup_run,) = world.runs("lookup")
    assert lookup is not None and lookup_run.stats is not None
    assert int(lookup.group(1)) == lookup_run.stats.lookup_steps
    assert int(lookup.group(2)) == sum(lookup_run.stats.verify_widths.values())


def test_demo_warns_where_packed_weights_would_not_fit(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    model = tiny_model("llama", seed=0)
    monkeypatch.setattr(demo, "available_memory", lambda: 1000)
    demo._warn_if_packing_does_not_fit(model, model)
    err = capsys.readouterr().err
    assert err.startswith("warning: packing the linear layers keeps a second copy") and "--no-pack-linears" in err
    monkeypatch.setattr(demo, "available_memory", lambda: 10**12)
    demo._warn_if_packing_does_not_fit(model, model)
    assert capsys.readouterr().err == ""
