"""Request media inputs -> Pillow images for a pipeline, or an error naming `inputs[i]`.

Images arrive as bytes (PNG, JPEG, WebP; anything Pillow opens) or a `file://` URI. An image is
converted to RGB and a mask to L (white = repaint), and both are resized to the request's
width x height (Lanczos for images, nearest for masks so the mask stays crisp) when one is
given. A mask must have the size of the image it goes with, checked before any resize.

`file://` URIs are read only inside the worker's `--input-roots` (`InputPolicy`): none given,
none is read. The path is resolved (symlinks, `..`) before the check; a path outside the roots
and a missing one get the same answer, so a client learns nothing about the worker's files; only
regular files are read (no `/dev/zero`, no FIFO), opened from the root down without following a
link swapped in after the check; at most `--input-max-bytes` of one file are read, and the model's
`limits.max_input_bytes` bounds a request's inputs together (inline ones included). Other URI
schemes (http, https, s3, ...) are not fetched by the worker at all.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from omnirt import types as t
from omnirt.worker.config import DEFAULT_INPUT_MAX_BYTES, WorkerConfig
from omnirt.worker.failures import JobFailure

log = logging.getLogger(__name__)

INVALID_ARGUMENT = "INVALID_ARGUMENT"
# Decompression-bomb guard: more pixels than this is refused before decoding.
MAX_INPUT_PIXELS = 64 * 1024 * 1024
_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class InputPolicy:
    """Where `file://` inputs may be read from (real paths; none = refused), the largest file, and
    the most bytes of one request's inputs together (the model's; 0 = no bound)."""

    roots: tuple[Path, ...] = ()
    max_bytes: int = DEFAULT_INPUT_MAX_BYTES
    request_max_bytes: int = 0

    @classmethod
    def of(cls, config: WorkerConfig) -> InputPolicy:
        """The policy of a worker's `--input-roots` and `--input-max-bytes`."""
        roots = tuple(Path(os.path.realpath(root)) for root in config.input_roots)
        return cls(roots=roots, max_bytes=config.input_max_bytes)

    def for_model(self, spec: t.ModelSpec) -> InputPolicy:
        """This policy with the model's `limits.max_input_bytes` (one request's inputs together)."""
        return dataclasses.replace(self, request_max_bytes=max(spec.limits.max_input_bytes, 0))

    def file_limit(self, used: int) -> int:
        """The most bytes one more file may have, `used` bytes of the request's inputs in already."""
        if not self.request_max_bytes:
            return self.max_bytes
        return max(0, min(self.max_bytes, self.request_max_bytes - used))


def read_uri(uri: str, where: str, policy: InputPolicy, used: int = 0) -> bytes:
    """The bytes behind input `where`'s URI; JobFailure(INVALID_ARGUMENT, field `where.uri`) if refused.

    `used`: bytes of the request's other inputs so far (they and this file share the model's bound).
    """
    field = f"{where}.uri"
    limit = policy.file_limit(used)

    def refuse(reason: str) -> JobFailure:
        return JobFailure(INVALID_ARGUMENT, f"{field}: {reason}", field)

    try:
        parsed = urlparse(uri)
    except ValueError:  # an unclosed IPv6 host (`file://[/x`)
        raise refuse("not a URI the worker can parse") from None
    if parsed.scheme != "file":
        scheme = f"a {parsed.scheme[:16]}:// URI" if parsed.scheme else "a URI without a scheme"
        raise refuse(f"the worker reads only inline data or file:// URIs (got {scheme})")
    if not policy.roots:
        raise refuse("file:// inputs are not allowed on this worker")
    not_found = refuse("not found under the worker's input roots")
    try:
        real = Path(os.path.realpath(unquote(parsed.path)))
    except (OSError, ValueError):  # a NUL byte, a loop of links
        raise not_found from None
    root = next((r for r in policy.roots if real.is_relative_to(r)), None)
    if parsed.netloc not in ("", "localhost") or root is None:
        raise not_found
    try:
        fd = _open_beneath(root, real.relative_to(root).parts)
    except OSError as exc:
        log.info("%s: cannot open %s: %s", field, real, exc)
        raise not_found from None
    try:  # plain fd reads: os.fdopen of a folder's fd raised IsADirectoryError and left it open
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse("not a regular file")
        over = refuse(
            f"the file is over the limit of {limit} bytes (the worker's --input-max-bytes, or what the "
            "model's limits.max_input_bytes leaves of the request's inputs together)"
        )
        if info.st_size > limit:
            raise over
        chunks, total = [], 0
        while total <= limit:  # the file may grow after fstat: never read past the limit
            chunk = os.read(fd, min(_CHUNK_BYTES, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise over
    finally:
        os.close(fd)
    return b"".join(chunks)


def _open_beneath(root: Path, parts: tuple[str, ...]) -> int:
    """A read-only fd of `root/parts...`, opened one part at a time from the root, none followed as
    a link (O_NOFOLLOW on each): a folder on the checked path swapped for a link to elsewhere
    before the open fails it (ELOOP), where opening the whole path would have followed the link.
    O_NONBLOCK: opening a FIFO must not wait for a writer."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(root, flags | os.O_DIRECTORY)
    for index, part in enumerate(parts):
        folder = os.O_DIRECTORY if index < len(parts) - 1 else 0
        try:
            inner = os.open(part, flags | os.O_NOFOLLOW | folder, dir_fd=fd)
        finally:
            os.close(fd)
        fd = inner
    return fd


class _Reader:
    """Reads one request's URI inputs, all of them together within the model's bound."""

    def __init__(self, inputs: list[t.MediaInput], policy: InputPolicy) -> None:
        self.policy = policy
        self.used = sum(len(media.data) for media in inputs)  # inline bytes count too

    def read(self, media: t.MediaInput, where: str) -> t.MediaInput:
        """`media` with its data: as it came, else read from its URI (see `read_uri`)."""
        if media.data or not media.uri:
            return media
        data = read_uri(media.uri, where, self.policy, self.used)
        self.used += len(data)
        return dataclasses.replace(media, data=data, uri="")


def with_uris_read(request: t.GenerateRequest, policy: InputPolicy) -> t.GenerateRequest:
    """`request` with every URI input replaced by its bytes (for code that reads `data` only)."""
    if all(media.data or not media.uri for media in request.inputs):
        return request
    reader = _Reader(request.inputs, policy)
    inputs = [reader.read(media, f"inputs[{index}]") for index, media in enumerate(request.inputs)]
    return dataclasses.replace(request, inputs=inputs)


def decode_image(media: t.MediaInput, where: str) -> Any:
    """The decoded image of `media`'s data (RGB, or L for a mask); JobFailure naming `where` if it
    is not one."""
    from PIL import Image, UnidentifiedImageError

    raw = media.data
    if not raw:
        raise JobFailure(INVALID_ARGUMENT, f"{where}: the input has neither data nor a uri", where)
    try:
        image = Image.open(io.BytesIO(raw))
        if image.width * image.height > MAX_INPUT_PIXELS:
            raise JobFailure(
                INVALID_ARGUMENT,
                f"image of {image.width}x{image.height} is over {MAX_INPUT_PIXELS} pixels",
                where,
            )
        image.load()
    except UnidentifiedImageError:
        raise JobFailure(
            INVALID_ARGUMENT,
            f"not an image Pillow can read ({len(raw)} bytes; PNG, JPEG or WebP expected)",
            where,
        ) from None
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise JobFailure(INVALID_ARGUMENT, f"cannot decode the image: {exc}", where) from exc
    return image.convert("L" if media.role is t.MediaRole.MASK else "RGB")


def image_inputs(
    inputs: list[t.MediaInput],
    roles: dict[t.MediaRole, str],
    size: tuple[int, int] | None,
    policy: InputPolicy,
) -> dict[str, Any]:
    """Decoded image inputs by pipeline argument (`roles`: media role -> argument name).

    `size` (width, height) resizes every image and mask; None keeps the input's size; `policy`
    says which `file://` URIs may be read. Raises
    JobFailure(INVALID_ARGUMENT) naming `inputs[i]` for an unreadable image or a mask whose
    size differs from the image's.
    """
    from PIL import Image

    decoded: dict[str, Any] = {}
    where_of: dict[str, str] = {}
    reader = _Reader(inputs, policy)
    for index, media in enumerate(inputs):
        argument = roles[media.role]
        where = f"inputs[{index}]"
        if argument in decoded:
            raise JobFailure(INVALID_ARGUMENT, f"a second {media.role.value} input; one is allowed", where)
        decoded[argument] = decode_image(reader.read(media, where), where)
        where_of[argument] = where
    image, mask = decoded.get("image"), decoded.get("mask_image")
    if image is not None and mask is not None and mask.size != image.size:
        raise JobFailure(
            INVALID_ARGUMENT,
            f"the mask is {mask.width}x{mask.height} but the image is {image.width}x{image.height}; "
            "they must have the same size",
            where_of["mask_image"],
        )
    if size is not None:
        for argument, picture in decoded.items():
            if picture.size != size:
                resample = Image.Resampling.NEAREST if picture.mode == "L" else Image.Resampling.LANCZOS
                decoded[argument] = picture.resize(size, resample)
    return decoded
