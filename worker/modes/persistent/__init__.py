"""The `persistent_worker` execution mode: a resident torchrun process group per model.

- `executor` (daemon side): `PersistentWorkerExecutor`, the mode's `Executor`.
- `group` (daemon side): `ResidentGroup`, which launches, supervises, restarts and stops one
  process group and talks to its rank 0.
- `settings`: the per-model options read from the catalog entry's `runtime` table.
- `channel`: the length-prefixed pickle framing between the daemon and rank 0.
- `rank` (rank side): the program torchrun starts on every rank.
- `cfg_denoise` (rank side): the Stable Diffusion loop with classifier-free guidance split
  across ranks.
- `data_parallel` (rank side): the same loop with a batch's outputs split across ranks.
- `pipeline_call` (rank side): any diffusers family through its pipeline's own `__call__`,
  with legacy_call's argument code, shared by `runtime.parallel` (cfg, data, none, ulysses, ring).
- `guidance_split` (rank side): the hook on the denoiser that splits classifier-free guidance
  (batched or sequential, read at run time) across 2 ranks.
- `context_parallel` (rank side): diffusers' Ulysses / Ring context parallel on the denoiser.

Nothing here imports torch at import time, except the rank-side modules.
"""
