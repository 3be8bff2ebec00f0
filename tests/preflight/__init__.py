"""The preflight: parameter, activation, FLOP and per-rank byte estimates, and the report that shows them."""
