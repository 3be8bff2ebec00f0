"""A parameter's name as torch's distributed state dicts key it, whatever module wrappers it went through.

Our own activation checkpointing and ``torch.compile`` wrap each block's ``forward`` and never change a
name, but a model's own plan may wrap modules with torch's ``checkpoint_wrapper`` or compile a module
whole (``OptimizedModule``): ``named_parameters`` then carries the wrappers' attribute names, which
``get_model_state_dict`` leaves out of its keys. Code that matches one against the other strips them here.
This module imports nothing.
"""

__all__ = ["WRAPPER_PREFIXES", "unwrapped_name"]

#: What torch's module wrappers insert into a parameter's name: activation checkpointing's
#: ``checkpoint_wrapper`` and ``torch.compile`` of a whole module.
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def unwrapped_name(name: str) -> str:
    """``name`` without the wrappers' prefixes (:data:`WRAPPER_PREFIXES`), as a state dict keys it."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name
