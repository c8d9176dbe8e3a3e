"""The decision model of the decoding loop: what a step costs, and whether drafting more pays.

One idea decides every adaptive choice: draft one more token (tree node, depth) only if its expected gain beats
its cost. Costs are in plain decoding steps and come from one `CostModel` (`costs`), measured while decoding or
fixed by the user (`SpeculativeCosts`); the loop owns it, measures it after every step, and hands it to its
drafter, which supplies the gains its estimates give (`rules`). The constants all of this uses are in
`constants`, each with the measurement that set it.

The threshold is more than break-even: a step's time could instead go to steps of the kind recent ones were,
which brought `rate` tokens per plain step's worth of time (`CostModel.rate`, at least 1: a plain step brings
one). Drafting one more token pays when its expected gain is at least `rate` times its cost
(`CostModel.pays`): the rule that maximises tokens per second over many steps (the ratio of expected tokens to
expected time; Dinkelbach's method for a ratio, the current rate standing for the best one). Break-even
(gain >= cost) would keep drafting where one more token brings less per second than the step already does
(Qwen2.5-Coder 1.5B/0.5B at batch 1 on a CPU, where a draft forward costs 45% of a target one: chains drafted
3.97 tokens a step, 79-89% of them accepted, against 3.25 and 87-92% with the rate, for the same speed).

Whether a step drafts at all is the `SpeculationGate`'s call (`gate`), from the same cost model; whether a draft
model is started at all (its prefill) is `draft_model_pays`'s (`setup_costs`). Each call starts from what the
last call of the same models measured (`memory`).
"""

from hf_specdec.generation.decisions.costs import CostModel, SpeculativeCosts, parameter_share, weight_count
from hf_specdec.generation.decisions.gate import SpeculationGate
from hf_specdec.generation.decisions.memory import forget_measured_costs, remembered_costs
from hf_specdec.generation.decisions.rules import (
    GrowthRule,
    growth_rule,
    lagging_mean,
    lookup_pays_more,
    next_draft_pays,
    nodes_worth_verifying,
    shared_width,
)
from hf_specdec.generation.decisions.setup_costs import chain_rate, draft_model_pays

__all__ = [
    "CostModel",
    "GrowthRule",
    "SpeculationGate",
    "SpeculativeCosts",
    "chain_rate",
    "draft_model_pays",
    "forget_measured_costs",
    "growth_rule",
    "lagging_mean",
    "lookup_pays_more",
    "next_draft_pays",
    "nodes_worth_verifying",
    "parameter_share",
    "remembered_costs",
    "shared_width",
    "weight_count",
]
