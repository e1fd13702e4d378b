"""Tiny random-weight models built offline (`source: builtin:NAME`): the registry and one module
per family."""
