"""The front doors: `speculative_generate(model, ...)` (`entry`), which reads `generate()`'s speculative arguments
and picks the drafter they ask for, and `speculative(model)` / `SpeculativeGenerationMixin` (`mixin`), a model whose
own `generate()` does the same. It stands above the drafters it dispatches to (`hf_specdec.drafters`,
`hf_specdec.mtp`; heads decode through `MedusaForCausalLM.generate`); the loop below them
(`hf_specdec.generation`) knows drafters only through their protocol.
"""
