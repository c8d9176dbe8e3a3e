"""The generation loop and its rules: the one decoding loop for every drafter (`loop`, over one call's state and
steps, `run`), the `generate()` entry points (`mixin`) and how they read `generate()`'s arguments (`arguments`),
the acceptance rules, the decision model every adaptive choice weighs (`decisions`), checks of prompts and
settings (`inputs`, `validation`), logits processing over ragged batches, per-row sequences and KV cache, outputs
and statistics.
"""
