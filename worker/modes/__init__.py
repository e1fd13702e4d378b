"""Execution modes: one module or folder per mode, and the base they share.

`base` (the `Executor` interface, cancel flags, failures, the mode registry), the modes
(`legacy_call`, `null`, `modular/`, `subprocess/`, `persistent/`), `assignment` (the run the
diffusers-pipeline modes share) with `schedulers` (each call's own scheduler), and the helpers
every mode uses to report a run (`events`, `thread_events`, `report`). A new mode is a folder
here and one line in `base._EXECUTORS`.
"""
