"""Drafting with the target's own multi-token-prediction layers (`generate(use_mtp=True)`): the layers found or
loaded and run one step at a time (`layers`), drafting chains of one token per layer (`chain`) or a tree grown by
the first layer at every depth, driven as an EAGLE head (`tree`), decoded by the library's one loop (`decoding`)
behind its `generate()` entry (`generate`).
"""
