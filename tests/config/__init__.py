"""The generic config machinery: YAML in and out, the resolver, overrides, type rules, messages."""
