"""Everything that proposes tokens: what the loop asks of a drafter (`base`: Proposal, Accepted,
DraftingContext, chains as trees), a draft model proposing chains (`draft_model`, with its length schedule,
`draft_length`) or growing a tree per row (`draft_tree`), the one pipeline every tree grows through
(`tree_growth`), prompt lookup (`lookup`, with its acceptance by position, `acceptance_history`), the two
together (`hybrid`), draft vocabularies (`vocab`), and the target's own multi-token-prediction layers
(`mtp_layers`; chains: `mtp`, trees: `mtp_tree`; decoded by `mtp_decoding`, `generate(use_mtp=True)`:
`mtp_generate`). Medusa and EAGLE heads, drafters too, live in `hf_specdec.medusa`.
"""
