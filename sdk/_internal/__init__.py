"""Internals shared by the SDK, the controller and the worker (never by users).

What lives here is a rule both daemons must read the same way: the proto <-> dataclass
converters, the runtime-option schema, the execution modes, the request and message limits,
addresses, config-to-flags derivation and logging. It imports only `omnirt` (the SDK) and the
generated code; nothing here imports `omnirt.controller`, `omnirt.worker` or torch.
"""
