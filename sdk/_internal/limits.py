"""Sizes every side must agree on, once.

The gRPC message limit, the stream's write batches, the bounds on adapter names and scales, and
how much of a user's value an error quotes.
"""

from __future__ import annotations

# One gRPC message at most (a request with its inline inputs, a result with its artifacts): the
# SDK's channels, the controller's server and the worker's channel all use it. Inline artifacts
# (a batch of images, a short video) easily pass gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# Most messages, and bytes in all, one write of the worker stream carries (when the other side
# accepts batches): one stream write per batch instead of one per assignment or event. The first
# message of a batch goes whatever its size.
STREAM_BATCH_MAX_MESSAGES = 256
STREAM_BATCH_MAX_BYTES = 1024 * 1024

# The controller's default bound on a request's inline input bytes (`ModelLimits.max_input_bytes`).
DEFAULT_INPUT_MAX_BYTES = 32 * 1024 * 1024

# An adapter name is a catalog name or a path: bounded like a path, and each part of it like a
# file name (NAME_MAX is 255 bytes; a 300-character name reached the worker's file system). The
# controller refuses a request past these, the worker an assignment.
MAX_ADAPTER_NAME_CHARS = 1024
MAX_FILE_NAME_BYTES = 255
# Largest adapter scale either way; a larger one is absurd, not a setting.
MAX_ADAPTER_SCALE = 100.0

# Most characters of a user's value an error message quotes.
ECHO_CHARS = 64
