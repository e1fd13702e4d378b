"""Execution modes: one module or folder per mode, the interface they share and their registry.

`executor` (the `Executor` interface, cancel flags and stop checks; the failures are
`omnirt.worker.failures`), `base` (the mode registry, which only the daemon imports), the modes
(`legacy_call`, `modular/`, `subprocess/`, `persistent/`) and the null family's executor
(`null`), `assignment` (the run the diffusers-pipeline modes share) with `schedulers` (what
each call must not share: its scheduler, its tokenizers), and the helpers every mode uses to
report a run (`events`, `report`). A new mode is a folder here and one line in `base._EXECUTORS`.
"""
