"""Sub-commands of `parallab` that live apart from `parallab.cli` (registered there)."""
