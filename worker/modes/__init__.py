"""Execution modes: one module or folder per mode, and the base they share.

`base` (the `Executor` interface, cancel flags, failures), the modes (`legacy_call`, `null`,
`modular/`, `subprocess/`, `persistent/`) and the helpers every mode uses to report a run
(`events`, `thread_events`). A new mode is a folder here and one line in `base.MODES`.
"""
