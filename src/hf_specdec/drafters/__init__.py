"""Everything that proposes tokens from outside the target's own layers: a draft model proposing chains
(`draft_model`, with its length schedule, `draft_length`) or growing a tree per row (`draft_tree`), the one pipeline
every tree grows through (`tree_growth`), prompt lookup (`lookup`, with its acceptance by position,
`acceptance_history`), the two together (`hybrid`), draft vocabularies (`vocab`), draft models with another
tokenizer (`translated`, `text_alignment`, `shared_vocab`) and early exit, run by the loop through
`speculative_decode` (`decoding`). Each implements the protocol of
`hf_specdec.generation.drafter`. Medusa and EAGLE heads live in `hf_specdec.medusa`, the target's own MTP layers in
`hf_specdec.mtp`.
"""
