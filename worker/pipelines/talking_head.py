"""A streaming talking-head pipeline (FlashTalk / InfiniteTalk style): a session opens on a
reference portrait, then each 1.12 s chunk of 16 kHz PCM becomes the chunk's 28 video frames.

A push: wav2vec 2.0 features of the chunk, resampled from 50 a second to one per frame; a clip
of latents (the previous chunk's last `motion_frames` latents, clean, then noise) denoised in a
few flow-matching steps by `TalkingHeadDenoiser` on the features and the reference latent; the
new latents decoded; the clip's last latents kept as the next chunk's motion. `open` encodes the
reference once. Noise comes from the session's CPU generator, seeded at `open`: the same seed and
pushes give the same frames on any device. A session's pushes run one at a time; each session has
its own scheduler, so sessions of one resident pipeline share no step state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.embeddings import get_timestep_embedding
from diffusers.models.modeling_utils import ModelMixin
from PIL import Image
from torch import Tensor, nn

CONFIG_NAME = "talking_head.json"


class TalkingHeadInputError(ValueError):
    """Bad input to a talking-head session; `field` names the argument at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidAudioError(TalkingHeadInputError):
    """A pushed chunk is not mono int16/float32 PCM of exactly `chunk_samples` samples."""


class InvalidReferenceError(TalkingHeadInputError):
    """The reference portrait is not a (non-empty) PIL image, or the seed is not a seed."""


class SessionClosedError(TalkingHeadInputError):
    """A push after `close` (a FAILED_PRECONDITION, not a bad argument, when mapped)."""


class _Attention(nn.Module):
    """Multi-head attention on torch's fused SDPA kernel (`nn.MultiheadAttention`: 7x slower here)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(width, width)
        self.key_value = nn.Linear(width, 2 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor, context: Tensor) -> Tensor:
        def split(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        key, value = self.key_value(context).chunk(2, dim=-1)
        attended = F.scaled_dot_product_attention(split(self.query(x)), split(key), split(value))
        return self.out(attended.transpose(1, 2).flatten(2))


class _Block(nn.Module):
    """A timestep-modulated 3D conv, self-attention over the whole clip, then each new frame's
    tokens attending to the audio features of a window of frames around it."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm_conv = nn.GroupNorm(4, width)
        self.modulation = nn.Linear(width, 2 * width)
        self.conv = nn.Conv3d(width, width, 3, padding=1)
        self.norm_self = nn.LayerNorm(width)
        self.self_attn = _Attention(width, heads)
        self.norm_audio = nn.LayerNorm(width)
        self.audio_attn = _Attention(width, heads)

    def forward(self, x: Tensor, temb: Tensor, audio: Tensor, motion: int) -> Tensor:
        b, c, t, h, w = x.shape
        scale, shift = self.modulation(temb)[:, :, None, None, None].chunk(2, dim=1)
        x = x + self.conv(F.silu(self.norm_conv(x) * (1 + scale) + shift))
        tokens = x.flatten(2).transpose(1, 2)
        normed = self.norm_self(tokens)
        tokens = tokens + self.self_attn(normed, normed)
        frames = tokens.reshape(b, t, h * w, c)
        new = frames[:, motion:]
        queries = self.norm_audio(new).reshape(-1, h * w, c)
        keys = audio.reshape(queries.shape[0], -1, c)
        heard = self.audio_attn(queries, keys)
        frames = torch.cat([frames[:, :motion], new + heard.reshape(new.shape)], dim=1)
        return frames.reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)


class TalkingHeadDenoiser(ModelMixin, ConfigMixin):
    """Predicts the flow-matching velocity of a clip's latents [B, C, T, h, w] from the reference
    latent (its channels beside every frame), a mask of the clean motion frames and one audio
    feature per new frame (each frame hears `audio_window` frames around it, as InfiniteTalk)."""

    # ModelMixin's own value, restated (the one the MRO gives): ConfigMixin's is None, and the
    # two bases' types (str, None) cannot merge, in diffusers' own models too.
    config_name: Any = ModelMixin.config_name

    @register_to_config
    def __init__(
        self, channels: int = 4, width: int = 32, audio_dim: int = 32, audio_window: int = 5, depth: int = 2
    ) -> None:
        super().__init__()
        self.conv_in = nn.Conv3d(2 * channels + 1, width, (1, 3, 3), padding=(0, 1, 1))
        self.time_embed = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.audio_proj = nn.Linear(audio_dim, width)
        self.audio_position = nn.Parameter(0.02 * torch.randn(audio_window, width))
        self.blocks = nn.ModuleList(_Block(width, heads=2) for _ in range(depth))
        self.norm_out = nn.GroupNorm(4, width)
        self.conv_out = nn.Conv3d(width, channels, (1, 3, 3), padding=(0, 1, 1))

    def forward(
        self, latents: Tensor, timestep: Tensor, reference: Tensor, audio: Tensor, motion_frames: int
    ) -> Tensor:
        """`reference` (its latent) [B, C, 1, h, w]; `audio` [B, T - motion_frames, audio_dim]."""
        b, _, t, h, w = latents.shape
        mask = torch.zeros(b, 1, t, h, w, dtype=latents.dtype, device=latents.device)
        mask[:, :, :motion_frames] = 1
        x = self.conv_in(torch.cat([latents, reference.expand(-1, -1, t, -1, -1), mask], dim=1))
        width, window = self.config["width"], self.config["audio_window"]
        temb = self.time_embed(get_timestep_embedding(timestep.reshape(-1), width).to(x.dtype)).expand(b, -1)
        # [B, F, window, width]: each frame's neighbours, the edges repeated.
        padded = F.pad(self.audio_proj(audio).transpose(1, 2), (window // 2, window // 2), mode="replicate")
        windows = padded.unfold(2, window, 1).permute(0, 2, 3, 1) + self.audio_position
        for block in self.blocks:
            x = block(x, temb, windows, motion_frames)
        # The clean clip as the portrait's latent plus a residual, as a flow velocity (sigma = t /
        # 1000): random weights' bare velocity decodes to noise, this to a portrait that moves.
        clean = reference + self.conv_out(F.silu(self.norm_out(x)))
        return (latents - clean) / (timestep.reshape(-1, 1, 1, 1, 1) / 1000).clamp(min=1e-3).to(clean.dtype)


@dataclass(frozen=True)
class Geometry:
    """The streaming contract of a model (`talking_head.json`)."""

    fps: int
    sample_rate: int
    chunk_samples: int
    frames_per_chunk: int
    motion_frames: int
    steps: int
    height: int
    width: int

    @classmethod
    def load(cls, path: Path) -> Geometry:
        data = json.loads(path.read_text())
        geometry = cls(**{f.name: int(data[f.name]) for f in fields(cls)})
        if geometry.frames_per_chunk * geometry.sample_rate != geometry.fps * geometry.chunk_samples:
            raise ValueError(f"{path}: frames_per_chunk does not match chunk_samples at {geometry.fps} fps")
        return geometry

    @property
    def chunk_ms(self) -> int:
        return self.chunk_samples * 1000 // self.sample_rate


@dataclass(frozen=True)
class Chunk:
    """One pushed chunk's output: `frames` uint8 [frames_per_chunk, H, W, 3], the chunk's PCM as
    int16, its 0-based `index` and presentation time `pts_ms` (of its first frame and sample)."""

    frames: np.ndarray
    audio: np.ndarray
    index: int
    pts_ms: int


class TalkingHeadPipeline:
    """The resident parts of a talking-head model; `open` starts a streaming session."""

    def __init__(self, parts: dict[str, Any], geometry: Geometry, device: torch.device, dtype: torch.dtype):
        self.audio_encoder = parts["audio_encoder"]
        self.feature_extractor = parts["feature_extractor"]
        self.denoiser = parts["denoiser"]
        self.vae = parts["vae"]
        self.scheduler = parts["scheduler"]
        self.geometry, self.device, self.dtype = geometry, device, dtype
        self._scaling = float(self.vae.config.scaling_factor)

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> TalkingHeadPipeline:
        """Load the folder `builtin:tiny-talking-head` (or a real model in its layout) makes."""
        from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2Model

        root, target = Path(folder), torch.device(device)
        parts: dict[str, Any] = {
            "audio_encoder": Wav2Vec2Model.from_pretrained(str(root / "audio_encoder"), dtype=dtype),
            "feature_extractor": Wav2Vec2FeatureExtractor.from_pretrained(str(root / "audio_encoder")),
            "denoiser": TalkingHeadDenoiser.from_pretrained(str(root / "denoiser"), torch_dtype=dtype),
            "vae": AutoencoderKL.from_pretrained(str(root / "vae"), torch_dtype=dtype),
            "scheduler": FlowMatchEulerDiscreteScheduler.from_pretrained(str(root / "scheduler")),
        }
        for name in ("audio_encoder", "denoiser", "vae"):
            parts[name].to(target).eval()
        return cls(parts, Geometry.load(root / CONFIG_NAME), target, dtype)

    def open(self, reference_image: Image.Image, seed: int) -> Session:
        """A session animating `reference_image` (any size or mode: made RGB, resized)."""
        if not isinstance(reference_image, Image.Image):
            raise InvalidReferenceError(
                "reference_image", f"not a PIL image: {type(reference_image).__name__}"
            )
        if 0 in reference_image.size:
            raise InvalidReferenceError("reference_image", f"is empty ({reference_image.size})")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise InvalidReferenceError("seed", f"must be an integer in [0, 2**63), got {seed!r}")
        return Session(self, reference_image, seed)

    def encode(self, frames: Tensor) -> Tensor:
        """Scaled latents [1, C, T, h, w] (the distribution's mode) of `frames` [T, 3, H, W]."""
        latents = self.vae.encode(frames.to(self.device, self.dtype)).latent_dist.mode()
        return (latents * self._scaling).permute(1, 0, 2, 3)[None]

    def decode(self, latents: Tensor) -> Tensor:
        """Frames [T, 3, H, W] in [-1, 1] of latents [1, C, T, h, w], decoded as one batch."""
        return self.vae.decode(latents[0].permute(1, 0, 2, 3) / self._scaling).sample.clamp(-1, 1)

    def audio_features(self, pcm: np.ndarray) -> Tensor:
        """One wav2vec 2.0 feature per output frame [1, frames_per_chunk, D] of float PCM."""
        values = self.feature_extractor(pcm, sampling_rate=self.geometry.sample_rate, return_tensors="pt")
        hidden = self.audio_encoder(values.input_values.to(self.device, self.dtype)).last_hidden_state
        frames = self.geometry.frames_per_chunk
        resampled = F.interpolate(hidden.float().transpose(1, 2), frames, mode="linear", align_corners=True)
        return resampled.transpose(1, 2).to(self.dtype)


class Session:
    """One avatar stream: the reference latent, the motion latents the last push left, the
    seeded noise generator and the next chunk's index. Made by `TalkingHeadPipeline.open`."""

    def __init__(self, pipeline: TalkingHeadPipeline, reference_image: Image.Image, seed: int) -> None:
        self._pipeline, geometry = pipeline, pipeline.geometry
        size = (geometry.width, geometry.height)
        image = reference_image.convert("RGB").resize(size, Image.Resampling.BICUBIC)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 127.5 - 1).permute(2, 0, 1)
        with torch.inference_mode():
            self._reference = pipeline.encode(pixels[None])
        # Before the first chunk the portrait stands still: its latent is the motion history.
        self._motion: Tensor | None = self._reference.expand(-1, -1, geometry.motion_frames, -1, -1)
        self._generator = torch.Generator("cpu").manual_seed(seed)
        self._scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipeline.scheduler.config)
        self._index = 0

    def push(self, pcm: np.ndarray) -> Chunk:
        """The video of one chunk of audio: `pcm` mono 16 kHz int16 (or float32 in [-1, 1]),
        exactly `chunk_samples` long."""
        if self._motion is None:
            raise SessionClosedError("session", "is closed; open a new session")
        pipe, geometry = self._pipeline, self._pipeline.geometry
        (audio, floats), motion = _checked_pcm(pcm, geometry), geometry.motion_frames
        with torch.inference_mode():
            features = pipe.audio_features(floats)
            shape = (1, self._motion.shape[1], motion + geometry.frames_per_chunk, *self._motion.shape[3:])
            latents = torch.randn(shape, generator=self._generator).to(pipe.device, pipe.dtype)
            self._scheduler.set_timesteps(geometry.steps, device=pipe.device)
            for timestep in self._scheduler.timesteps:
                latents[:, :, :motion] = self._motion
                velocity = pipe.denoiser(latents, timestep, self._reference, features, motion)
                latents = self._scheduler.step(velocity, timestep, latents).prev_sample
            self._motion = latents[:, :, -motion:].clone()
            video = pipe.decode(latents[:, :, motion:]).permute(0, 2, 3, 1)
            frames = ((video.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).cpu().numpy()
        chunk = Chunk(frames=frames, audio=audio, index=self._index, pts_ms=self._index * geometry.chunk_ms)
        self._index += 1
        return chunk

    def close(self) -> None:
        """Drop the session's latents; later pushes raise `SessionClosedError`. Idempotent."""
        self._motion = None


def _checked_pcm(pcm: Any, geometry: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """`pcm` as int16 (what the chunk returns) and float32 in [-1, 1] (what wav2vec reads)."""
    if not isinstance(pcm, np.ndarray):
        raise InvalidAudioError("pcm", f"expected a numpy array, got {type(pcm).__name__}")
    if pcm.dtype not in (np.int16, np.float32):
        raise InvalidAudioError("pcm", f"dtype must be int16 or float32, got {pcm.dtype}")
    if pcm.ndim != 1:
        raise InvalidAudioError("pcm", f"must be 1-D mono samples, got shape {pcm.shape}")
    if pcm.shape[0] != geometry.chunk_samples:
        expected = f"{geometry.chunk_samples} samples ({geometry.chunk_ms} ms at {geometry.sample_rate} Hz)"
        raise InvalidAudioError("pcm", f"must hold exactly {expected}, got {pcm.shape[0]}")
    if pcm.dtype == np.int16:
        return pcm.copy(), pcm.astype(np.float32) / 32768.0
    if not np.isfinite(pcm).all() or np.abs(pcm).max() > 1.0:
        raise InvalidAudioError("pcm", "float32 samples must be finite and within [-1, 1]")
    return np.round(pcm * 32767.0).astype(np.int16), pcm.copy()
