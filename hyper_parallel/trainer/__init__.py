"""The trainer package: ``hyper_parallel.trainer.config`` assembles the root ``TrainerConfig``."""
