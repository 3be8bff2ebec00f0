"""The trainers and their root config: rules at resolve time, one process, torchrun layouts, export."""
