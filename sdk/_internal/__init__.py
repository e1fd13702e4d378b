"""Internals shared by the SDK, the controller and the worker (never by users).

What lives here is a rule both daemons must read the same way: the proto <-> dataclass
converters, the worker protocol (`protocol`), the runtime-option schema, the execution modes,
the request and message limits, addresses, config-to-flags derivation and logging; and the
SDK's own call core (`calls`, `channel`, `requests`), which users reach through `omnirt.Client`.
It imports only `omnirt` (the SDK) and the generated code; nothing here imports
`omnirt.controller`, `omnirt.worker` or torch.
"""
