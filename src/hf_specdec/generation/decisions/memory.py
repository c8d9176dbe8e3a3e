"""What earlier calls measured, kept for the next: `remembered_costs`.

Every adaptive decision rests on measured costs (`CostModel`), and a cold call must first measure them: a plain
step of the batch's rows before drafting, verification priced from the prefill until a wide step is timed, a
draft forward priced at the draft's share of the target's parameters, a draft model's acceptance assumed. Users
evaluating a dataset call `generate()` many times with the same models; each call starts where the last one with
the same target, drafter (and way of drafting: a chain or a tree, whose draft forwards differ), dtype and device
stopped, so that only the first call of a process explores.

Kept per process, in memory only, and forgotten with the models (weak references). Fixed costs
(`speculative_costs=`) neither read nor write it. `forget_measured_costs()` empties it (a change of machine
load, or timings that should start cold).
"""

from __future__ import annotations

import weakref

from torch import nn

from hf_specdec.generation.decisions.costs import CostModel
from hf_specdec.generation.decisions.measured import MeasuredCosts

_Slots = dict[tuple[str, str, str], MeasuredCosts]  # (how it drafts, dtype, device) -> what was measured
# target -> source of drafts: a module (draft model, heads, MTP layers), or a name (a drafter that runs none)
_BY_NAME: weakref.WeakKeyDictionary[nn.Module, dict[str, _Slots]] = weakref.WeakKeyDictionary()
_BY_MODULE: weakref.WeakKeyDictionary[nn.Module, weakref.WeakKeyDictionary[nn.Module, _Slots]]
_BY_MODULE = weakref.WeakKeyDictionary()


def remembered_costs(target: nn.Module, source: nn.Module | str, costs: CostModel, how: str = "") -> CostModel:
    """`costs`, the cost model of a call of `target` drafted by `source` (a draft model, heads or MTP layers, or
    the name of a drafter that runs no model, such as `"prompt lookup"`) as `how` says (`"chain"`, `"tree"`: what
    one draft forward is differs), starting from what the last such call on the same dtype and device measured,
    and keeping what this one measures once it ends (`CostModel.keep`). Fixed costs neither read nor write."""
    if costs.fixed is not None:
        return costs
    slots = _slots(target, source)
    key = (how, *_setting(target))
    if key in slots:
        costs.recall(slots[key])
    costs.keeper = lambda measured: slots.__setitem__(key, measured)
    return costs


def forget_measured_costs() -> None:
    """Forget every call's measured costs: the next call of each model measures them afresh."""
    _BY_NAME.clear()
    _BY_MODULE.clear()


def _slots(target: nn.Module, source: nn.Module | str) -> _Slots:
    if isinstance(source, nn.Module):
        by_module = _BY_MODULE.setdefault(target, weakref.WeakKeyDictionary())
        return by_module.setdefault(source, {})
    return _BY_NAME.setdefault(target, {}).setdefault(source, {})


def _setting(target: nn.Module) -> tuple[str, str]:
    parameter = next(target.parameters(), None)
    if parameter is None:
        return ("none", "none")
    return (str(parameter.dtype), parameter.device.type)
