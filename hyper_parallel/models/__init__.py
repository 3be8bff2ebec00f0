"""Model descriptions: ``ModelSpec`` and the ``ModelArgs`` base class.

Built-in model packages (``hyper_parallel.models.llama3``, ``hyper_parallel.models.qwen3_5``) expose a
``create_model_spec`` factory that the root ``model`` group names as its ``_target_``. They are not
imported here, so importing this package stays cheap.
"""

from hyper_parallel.models.spec import ModelArgs, ModelSpec

__all__ = ["ModelArgs", "ModelSpec"]
