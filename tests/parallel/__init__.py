"""The distributed techniques applied to the models: sharding, weights across layouts, pipeline stages."""
