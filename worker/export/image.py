"""Artifact export: pipeline images -> encoded bytes with sha256.

Encoding is deterministic: the same pixels give the same bytes (no timestamps, no metadata),
so a fixed seed gives a fixed sha256.
"""

from __future__ import annotations

import hashlib
import io
import zlib
from typing import Any

from omnirt import types as t

# format -> (Pillow format, MIME type, file extension)
IMAGE_FORMATS = {
    "png": ("PNG", "image/png", "png"),
    "jpeg": ("JPEG", "image/jpeg", "jpg"),
    "jpg": ("JPEG", "image/jpeg", "jpg"),
    "webp": ("WEBP", "image/webp", "webp"),
}
DEFAULT_IMAGE_FORMAT = "png"
# PNG's deflate strategy. Pillow's default (zlib level 6, LZ77 match search) spent 51 ms on a
# 512x512 photo; after PNG's row filters a photo-like image has few long repeats, and
# run-length matching only (Z_RLE) made the same size (+0.1 %) in 14.5 ms. Flat synthetic
# images (screenshots, gradients) come out larger with it: see docs/worker.md, "Artifacts".
PNG_OPTIONS: dict[str, Any] = {"compress_type": zlib.Z_RLE}


def image_format(name: str) -> str:
    """The normalized image format for `name` ("" = png); ValueError when unsupported."""
    fmt = (name or DEFAULT_IMAGE_FORMAT).lower()
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"unsupported image format {name!r}; supported: png, jpeg, webp")
    return fmt


def to_pil(image: Any) -> Any:
    """A PIL image from what a pipeline returns (PIL, or a HxWxC numpy array in [0, 1] or uint8)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    import numpy as np

    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    return Image.fromarray(array)


def encode_image(image: Any, fmt: str, quality: int = 0) -> bytes:
    """Encode one image; a fresh copy of the pixels drops any metadata the pipeline attached."""
    from PIL import Image

    pil = to_pil(image)
    if pil.mode not in ("RGB", "RGBA", "L"):
        pil = pil.convert("RGBA" if "A" in pil.getbands() else "RGB")
    clean = Image.frombytes(pil.mode, pil.size, pil.tobytes())
    pil_format = IMAGE_FORMATS[fmt][0]
    options: dict[str, Any] = {}
    if pil_format == "JPEG" and clean.mode == "RGBA":
        clean = clean.convert("RGB")
    if pil_format in ("JPEG", "WEBP") and quality:
        options["quality"] = quality
    if pil_format == "PNG":
        options.update(PNG_OPTIONS)
    buf = io.BytesIO()
    clean.save(buf, format=pil_format, **options)
    return buf.getvalue()


def image_artifact(
    image: Any, *, index: int, seed: int, job_id: str, fmt: str, quality: int = 0
) -> t.Artifact:
    """An inline image Artifact with its sha256, size and seed."""
    pil = to_pil(image)
    data = encode_image(pil, fmt, quality)
    _, mime, ext = IMAGE_FORMATS[fmt]
    return t.Artifact(
        index=index,
        kind=t.MediaKind.IMAGE,
        mime_type=mime,
        data=data,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        width=pil.width,
        height=pil.height,
        seed=seed,
        file_name=f"{job_id}-{index}.{ext}",
    )
