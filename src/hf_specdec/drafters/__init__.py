"""Everything that proposes tokens: what the loop asks of a drafter (`base`: Proposal, Accepted,
DraftingContext, chains as trees), a draft model proposing chains (`draft_model`, with its length schedule,
`draft_length`) or growing a tree per row (`draft_tree`), the one pipeline every tree grows through
(`tree_growth`), prompt lookup (`lookup`, with its acceptance by position, `acceptance_history`), the two
together (`hybrid`), and draft vocabularies (`vocab`). Medusa and EAGLE heads, drafters too, live in
`hf_specdec.medusa`.
"""
