"""Sizes every side must agree on, once: the gRPC message limit and the stream's write batches."""

from __future__ import annotations

# One gRPC message at most (a request with its inline inputs, a result with its artifacts): the
# SDK's channels, the controller's server and the worker's channel all use it.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# Most messages one write of the worker stream carries (when the other side accepts batches).
STREAM_BATCH_MAX_MESSAGES = 256

# The controller's default bound on a request's inline input bytes (`ModelLimits.max_input_bytes`).
DEFAULT_INPUT_MAX_BYTES = 32 * 1024 * 1024
