"""Model descriptions: ``ModelSpec`` and the ``ModelArgs`` base class.

Built-in model packages (``hyper_parallel.models.llama3``, ``hyper_parallel.models.qwen3_5``) expose a
``create_model_spec`` factory that the root ``model`` group names as its ``_target_``. At run time,
``hyper_parallel.models.loading`` builds the device mesh, materialises a parallelized model with
layout-independent random weights, or loads Hugging Face weights into it. None of them is imported
here, so importing this package stays cheap.
"""

from hyper_parallel.models.spec import ModelArgs, ModelSpec

__all__ = ["ModelArgs", "ModelSpec"]
