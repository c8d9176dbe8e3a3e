"""Every number the adaptive decisions use, each with what set it.

Measurements cited are in docs/benchmarks.md (Qwen2.5-Coder-1.5B target, 0.5B draft, the project's 2-core CPU
unless said otherwise).
"""

from __future__ import annotations

# --- estimates of costs and rates -------------------------------------------------------------------------------

#: Weight of the newest step in the running estimate of a draft forward's cost relative to a one-token target
#: forward (`CostModel.draft_forward`). Per-step timings of a 2-core CPU vary by +-20% from step to step; 0.2
#: averages over about five steps and follows a change of load within a dozen.
COST_SMOOTHING = 0.2
#: Weight of the newest step in the running means of what steps brought and cost (`CostModel.rate`,
#: `CostModel.step_rate`) and of a plain step's time. Slightly faster than `COST_SMOOTHING`: what drafts bring
#: changes with the text within a few steps (a reply that starts quoting its prompt).
STEP_SMOOTHING = 0.3
#: Per-step weight kept by older verification timings in the fitted line of verification time against verified
#: tokens (`CostModel.verify_per_token`): about ten recent steps of different widths fit the line.
VERIFY_LINE_DECAY = 0.9

# --- the speculation gate ----------------------------------------------------------------------------------------

#: Drafting stops when recent speculative steps brought fewer tokens than plain steps would have in their time
#: (their running rate, in tokens per plain step, below this). Break-even: a plain step of the same rows brings
#: exactly 1, and stopping at a loss costs little (the retries below) where drafting on at a loss costs every
#: step. Stopping only below 0.8 let prompt lookup at batch 4 on a CPU (Qwen2.5-Coder-1.5B, bf16) draft 24 of
#: 93 steps at 0.78-0.92 tokens per plain step (one looked-up token per row cost 1.25 plain steps and brought
#: 1.1 tokens to the least advanced row); at 1.0 it drafted 6 of 95. At batch 1 it takes plain steps where the
#: text offers nothing to look up: 80 of 384 steps over six of the benchmark's prompts, 8 of 154 with a draft
#: model.
LEAST_STEP_RATE = 1.0
#: After a speculative step that lost, the gate takes this many plain steps before drafting again, doubling each
#: time a retry loses too, up to `MOST_PATIENCE`.
FIRST_PATIENCE = 2
MOST_PATIENCE = 32

# --- acceptance measured by draft position (prompt lookup) -------------------------------------------------------

#: Per step, older counts of accepted drafts keep this weight, and each draft position remembers at most
#: `HISTORY_DRAFTS` drafts: with no new drafts at a position its rate drifts back to the prior within a few dozen
#: steps, so a drafter that stopped drafting tries again.
HISTORY_DECAY = 0.9
HISTORY_DRAFTS = 20.0
#: Acceptance assumed for a looked-up token before any is measured, by matched n-gram size (3 and longer: the
#: last entry). Replaying lookup over Qwen2.5-Coder-1.5B's greedy replies to the benchmark's prompts, the first
#: looked-up token was right after 23-32% of single-token matches and after 82% or more of 3-token matches.
PRIOR_ACCEPTANCE = {1: 0.3, 2: 0.5, 3: 0.8}
#: The prior's weight, in drafts, against the measured ones.
PRIOR_DRAFTS = 2.0

# --- the hybrid of a draft model and prompt lookup ---------------------------------------------------------------

#: Weight of the newest draft-model step in the running means of its committed tokens and drafts per step, which
#: the hybrid weighs against prompt lookup's measured acceptance (as `COST_SMOOTHING`).
MODEL_STEP_SMOOTHING = 0.2

# --- starting a draft model (its prefill) ------------------------------------------------------------------------

#: Acceptance of each draft assumed before a draft model has drafted, when judging whether its prefill pays
#: (`setup_costs.draft_model_pays`). Qwen2.5-Coder-0.5B drafting for the 1.5B had 79-89% of its drafts accepted
#: (above); a weaker pair is measured once it drafts, and the speculation gate stops it if it loses.
PRIOR_DRAFT_ACCEPTANCE = 0.8
#: The prior's weight, in drafts, against the least advanced row's measured acceptance (`CostModel.acceptance`),
#: and the weight each step keeps older counts with: about fifty recent steps count.
PRIOR_DRAFT_WEIGHT = 4.0
ACCEPTANCE_DECAY = 0.98
#: The longest chain that judgement considers.
MOST_JUDGED_DRAFTS = 16
