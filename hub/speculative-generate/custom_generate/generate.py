"""`model.generate(custom_generate="<this repo>", trust_remote_code=True, ...)`: hf_specdec's speculative decoding
behind transformers' `custom_generate` entry, on a model that has not been through `hf_specdec.speculative()`.

Every argument of `generate()` is taken as `hf_specdec.speculative_generate` takes it: a draft model
(`assistant=` or `assistant_model=`), `assistant_early_exit=`, `prompt_lookup_num_tokens=`, `tree=`,
`assistant_vocab=`, and transformers' own. The model is not changed, so the call can be repeated, and the same
model still decodes plainly without `custom_generate`.
"""

from typing import Any

from hf_specdec import speculative_generate


def generate(model: Any, **kwargs: Any) -> Any:
    """transformers' `custom_generate` entry point: `model` is the model `generate()` was called on; `kwargs`
    holds every argument of that call."""
    return speculative_generate(model, **kwargs)
