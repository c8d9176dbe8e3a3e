"""The generation loop and its rules: the one decoding loop for every drafter (`loop`, over one call's state and
steps, `run`), what it asks of a drafter (`drafter`: Proposal, Accepted, DraftingContext, chains as trees), how the
`generate()` entry points read `generate()`'s arguments (`arguments`), the acceptance rules, the decision model
every adaptive choice weighs (`decisions`), checks of prompts and settings (`inputs`, `validation`), logits
processing over ragged batches, per-row sequences and KV cache, outputs and statistics.
"""
