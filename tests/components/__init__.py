"""Each component kind: its Config, and the torch runtime its ``build()`` returns (one and two processes)."""
