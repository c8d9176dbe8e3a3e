"""The front doors: `speculative_generate(model, ...)` (`entry`), which reads `generate()`'s speculative arguments
and picks the drafter they ask for, and `speculative(model)` / `SpeculativeGenerationMixin` (`mixin`), a model whose
own `generate()` does the same. The one package that imports every drafter; the loop below it
(`hf_specdec.generation`) knows drafters only through their protocol.
"""
