"""Live previews: a small image of each job's latents at a denoising step, without the VAE.

The latents of the step callback are projected to RGB by a linear map per latent channel,
`rgb = latents^T @ factors + bias`, then mapped from [-1, 1] to pixels, resized so the longer
side is at most `max_size` (never larger than the output) and encoded as JPEG or WebP. The
factors are the widely used approximations (ComfyUI's `latent_formats`) for the families whose
VAE they were fitted on: SD 1.x/2.x (4 channels), SDXL and the families on its VAE (Kolors,
PixArt-Sigma), SD3 and Flux (16), Wan 2.1 and the families on its VAE (16, per frame). Any other
latent (another family, or a tiny model with fewer channels) shows its first three channels,
each stretched to its own range: the layout is right, the colours are not.

Flux-style packed latents (batch, tokens, channels x 4) are unpacked with the pipeline's own
`_unpack_latents`; video latents (batch, channels, frames, height, width) show their middle
latent frame. Cost: one matrix product on the latent grid, a resize and an encode of a few KB
(tiny-sd: well under a millisecond; docs/BENCHMARKS.md has the measured share of a job).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# (factors: one [R, G, B] row per latent channel, bias [R, G, B]).
_SD15 = (
    [
        [0.3512, 0.2297, 0.3227],
        [0.3250, 0.4974, 0.2350],
        [-0.2829, 0.1762, 0.2721],
        [-0.2120, -0.2616, -0.7177],
    ],
    [0.0, 0.0, 0.0],
)
_SDXL = (
    [
        [0.3651, 0.4232, 0.4341],
        [-0.2533, -0.0042, 0.1068],
        [0.1076, 0.1111, -0.0362],
        [-0.3165, -0.2492, -0.2188],
    ],
    [0.1084, -0.0175, -0.0011],
)
_SD3 = (
    [
        [-0.0922, -0.0175, 0.0749],
        [0.0311, 0.0633, 0.0954],
        [0.1994, 0.0927, 0.0458],
        [0.0856, 0.0339, 0.0902],
        [0.0587, 0.0272, -0.0496],
        [-0.0006, 0.1104, 0.0309],
        [0.0978, 0.0306, 0.0427],
        [-0.0042, 0.1038, 0.1358],
        [-0.0194, 0.0020, 0.0669],
        [-0.0488, 0.0130, -0.0268],
        [0.0922, 0.0988, 0.0951],
        [-0.0278, 0.0524, -0.0542],
        [0.0332, 0.0456, 0.0895],
        [-0.0069, -0.0030, -0.0810],
        [-0.0596, -0.0465, -0.0293],
        [-0.1448, -0.1463, -0.1189],
    ],
    [0.2394, 0.2135, 0.1925],
)
_FLUX = (
    [
        [-0.0346, 0.0244, 0.0681],
        [0.0034, 0.0210, 0.0687],
        [0.0275, -0.0668, -0.0433],
        [-0.0174, 0.0160, 0.0617],
        [0.0859, 0.0721, 0.0329],
        [0.0004, 0.0383, 0.0115],
        [0.0405, 0.0861, 0.0915],
        [-0.0236, -0.0185, -0.0259],
        [-0.0245, 0.0250, 0.1180],
        [0.1008, 0.0755, -0.0421],
        [-0.0515, 0.0201, 0.0011],
        [0.0428, -0.0012, -0.0036],
        [0.0817, 0.0765, 0.0749],
        [-0.1264, -0.0522, -0.1103],
        [-0.0280, -0.0881, -0.0499],
        [-0.1262, -0.0982, -0.0778],
    ],
    [-0.0329, -0.0718, -0.0851],
)
_WAN21 = (
    [
        [-0.1299, -0.1692, 0.2932],
        [0.0671, 0.0406, 0.0442],
        [0.3568, 0.2548, 0.1747],
        [0.0372, 0.2344, 0.1420],
        [0.0313, 0.0189, -0.0328],
        [0.0296, -0.0956, -0.0665],
        [-0.3477, -0.4059, -0.2925],
        [0.0166, 0.1902, 0.1975],
        [-0.0412, 0.0267, -0.1364],
        [-0.1293, 0.0740, 0.1636],
        [0.0680, 0.3019, 0.1128],
        [0.0032, 0.0581, 0.0639],
        [-0.1251, 0.0927, 0.1699],
        [0.0060, -0.0633, 0.0005],
        [0.3477, 0.2275, 0.2950],
        [0.1984, 0.0913, 0.1861],
    ],
    [-0.1835, -0.0868, -0.3360],
)
FACTORS: dict[str, tuple[list[list[float]], list[float]]] = {
    "sd": _SD15,
    "sdxl": _SDXL,
    "kolors": _SDXL,
    "pixart-sigma": _SDXL,
    "sd3": _SD3,
    "flux": _FLUX,
    "wan": _WAN21,
    "wan2.2": _WAN21,
    "skyreels-v2": _WAN21,
    "skyreels-v2-df": _WAN21,
}
MIME_TYPES = {"jpeg": "image/jpeg", "webp": "image/webp"}
_PIL_FORMATS = {"jpeg": "JPEG", "webp": "WEBP"}
QUALITY = 70  # small files (a 256 px JPEG is a few KB); a preview is looked at, not kept


@dataclass(frozen=True)
class Preview:
    """One encoded preview image."""

    data: bytes
    mime_type: str
    width: int
    height: int


class PreviewMaker:
    """Makes previews of one pipeline call's latents (`settings`: the normalized `preview` option)."""

    def __init__(self, settings: Mapping[str, Any], family: str, width: int, height: int) -> None:
        self.every_steps = int(settings["every_steps"])
        self.format = str(settings["format"])
        self.max_size = int(settings["max_size"])
        self.family = family
        self.width, self.height = width, height  # of the output, in pixels (0: unknown)
        self.projection = "factors" if family in FACTORS else "channels"

    def due(self, step: int, total_steps: int) -> bool:
        """Whether step `step` (1-based) gets a preview: every `every_steps`, never the last (the
        result follows at once)."""
        return step % self.every_steps == 0 and step < total_steps

    def make(self, pipe: Any, latents: Any, indices: list[int]) -> list[Preview | None]:
        """A preview of output `i` of the call's latents for each `i` in `indices` (None where
        the latents do not have that layout)."""
        import torch

        with torch.no_grad():
            grid = self._grid(pipe, latents)
            if grid is None:
                return [None for _ in indices]
            return [self._encode(self._rgb(grid[i])) if i < grid.shape[0] else None for i in indices]

    def _grid(self, pipe: Any, latents: Any) -> Any:
        """(batch, channels, height, width) float32 on the CPU, or None."""
        if latents is None or not hasattr(latents, "ndim"):
            return None
        if latents.ndim == 3 and callable(getattr(pipe, "_unpack_latents", None)) and self.width:
            scale = int(getattr(pipe, "vae_scale_factor", 8))
            try:
                latents = pipe._unpack_latents(latents, self.height, self.width, scale)
            except Exception:  # another packing than Flux's: no preview rather than a failed job
                return None
        if latents.ndim == 5:
            latents = latents[:, :, latents.shape[2] // 2]  # the middle latent frame
        if latents.ndim != 4:
            return None
        import torch

        return latents.detach().to("cpu", dtype=torch.float32)

    def _rgb(self, latent: Any) -> Any:
        """(channels, h, w) -> (h, w, 3) uint8."""
        import torch

        channels = latent.shape[0]
        known = FACTORS.get(self.family)
        if known is not None and len(known[0]) == channels:
            factors = torch.tensor(known[0])
            bias = torch.tensor(known[1])
            rgb = torch.einsum("chw,cr->hwr", latent, factors) + bias
            rgb = (rgb + 1.0) / 2.0
        else:
            rgb = latent[: min(3, channels)].permute(1, 2, 0)
            if rgb.shape[2] < 3:
                rgb = rgb[:, :, :1].expand(-1, -1, 3)
            low = rgb.amin(dim=(0, 1), keepdim=True)
            high = rgb.amax(dim=(0, 1), keepdim=True)
            rgb = (rgb - low) / (high - low).clamp_min(1e-6)
        return (rgb.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).numpy()

    def _encode(self, pixels: Any) -> Preview:
        from PIL import Image

        image = Image.fromarray(pixels, "RGB")
        longest = max(self.width, self.height) or self.max_size
        limit = min(self.max_size, longest)
        grid_w, grid_h = image.size
        scale = limit / max(grid_w, grid_h)
        size = (max(1, round(grid_w * scale)), max(1, round(grid_h * scale)))
        image = image.resize(size, Image.Resampling.BILINEAR)
        out = io.BytesIO()
        image.save(out, format=_PIL_FORMATS[self.format], quality=QUALITY)
        return Preview(out.getvalue(), MIME_TYPES[self.format], size[0], size[1])
