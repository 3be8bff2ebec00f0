"""The config layer: YAML with locations, the ``_target_`` resolver, overrides and dumps."""
