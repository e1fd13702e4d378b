"""Request media inputs -> Pillow images for a pipeline, or an error naming `inputs[i]`.

Images arrive as bytes (PNG, JPEG, WebP; anything Pillow opens) or a `file://` URI. An image is
converted to RGB and a mask to L (white = repaint), and both are resized to the request's
width x height (Lanczos for images, nearest for masks so the mask stays crisp) when one is
given. A mask must have the size of the image it goes with, checked before any resize.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omnirt import types as t
from omnirt.worker.executor import JobFailure

INVALID_ARGUMENT = "INVALID_ARGUMENT"
# Decompression-bomb guard: more pixels than this is refused before decoding.
MAX_INPUT_PIXELS = 64 * 1024 * 1024


def _raw_bytes(media: t.MediaInput, where: str) -> bytes:
    if media.data:
        return media.data
    if media.uri.startswith("file://"):
        try:
            return Path(urlparse(media.uri).path).read_bytes()
        except OSError as exc:
            raise JobFailure(
                INVALID_ARGUMENT, f"cannot read {media.uri!r}: {exc.strerror or exc}", where
            ) from exc
    raise JobFailure(INVALID_ARGUMENT, f"cannot read input {media.uri!r}: only inline data or file://", where)


def decode_image(media: t.MediaInput, where: str) -> Any:
    """The decoded image of `media` (RGB, or L for a mask); JobFailure naming `where` if it is not one."""
    from PIL import Image, UnidentifiedImageError

    raw = _raw_bytes(media, where)
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
    inputs: list[t.MediaInput], roles: dict[t.MediaRole, str], size: tuple[int, int] | None
) -> dict[str, Any]:
    """Decoded image inputs by pipeline argument (`roles`: media role -> argument name).

    `size` (width, height) resizes every image and mask; None keeps the input's size. Raises
    JobFailure(INVALID_ARGUMENT) naming `inputs[i]` for an unreadable image or a mask whose
    size differs from the image's.
    """
    from PIL import Image

    decoded: dict[str, Any] = {}
    where_of: dict[str, str] = {}
    for index, media in enumerate(inputs):
        argument = roles[media.role]
        where = f"inputs[{index}]"
        if argument in decoded:
            raise JobFailure(INVALID_ARGUMENT, f"a second {media.role.value} input; one is allowed", where)
        decoded[argument] = decode_image(media, where)
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
