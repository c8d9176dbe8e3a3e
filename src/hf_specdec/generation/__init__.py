"""The generation loop and its rules: the one decoding loop for every drafter (`loop`), the `generate()`
entry points (`mixin`) and how they read `generate()`'s arguments (`arguments`), the acceptance rules,
checks of prompts and settings (`inputs`, `validation`), logits processing over ragged batches, per-row
sequences and KV cache, outputs and statistics, and draft lengths with their costs (`costs`).
"""
