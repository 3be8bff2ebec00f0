"""hyper_parallel: typed, validated training configuration for large-model training."""

__version__ = "0.1.0"
