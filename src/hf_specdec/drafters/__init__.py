"""Everything that proposes tokens: what the loop asks of a drafter (`base`: Proposal, Accepted,
DraftingContext, chains as trees), a draft model proposing chains (`draft_model`) or growing a tree per
row (`draft_tree`), prompt lookup (`lookup`), the two together (`hybrid`), and draft vocabularies
(`vocab`). Medusa heads, drafters too, live in `hf_specdec.medusa`.
"""
