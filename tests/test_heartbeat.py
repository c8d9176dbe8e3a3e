"""A long silent step (a model's conversion) prints a line at its start, every few seconds while it runs, and at its
end."""

from __future__ import annotations

import time

import pytest

from hf_specdec.heartbeat import heartbeat


def test_a_long_step_prints_a_line_every_few_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    with heartbeat("converting a model", every=0.05):
        time.sleep(0.3)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "converting a model ..."
    assert len([line for line in lines if line.startswith("  still converting a model (")]) >= 2
    assert lines[-1].startswith("  done converting a model (")


def test_a_short_step_prints_its_start_and_end_alone(capsys: pytest.CaptureFixture[str]) -> None:
    with heartbeat("loading", every=60):
        pass
    assert capsys.readouterr().err.splitlines() == ["loading ...", "  done loading (0 s)"]
