"""Tiny random-weight realtime talking-head model (`builtin:tiny-talking-head`).

The parts of a FlashTalk / InfiniteTalk-style streaming avatar model, small and seeded, in one
folder: a transformers `Wav2Vec2Model` (the audio encoder: wav2vec 2.0's conv strides, so a
320-sample hop and 50 features a second, 2 layers of width 32) with its
`Wav2Vec2FeatureExtractor`; OmniRT's own `TalkingHeadDenoiser` (3D convs, self-attention over
the clip, per-frame audio cross-attention; defined beside its pipeline in
`omnirt.worker.pipelines.talking_head`, imported here only when building, so importing the
registry still imports no torch); the shared tiny `AutoencoderKL` (8x spatial, one latent per frame); a
`FlowMatchEulerDiscreteScheduler`; and `talking_head.json`, the streaming geometry.

Each chunk is a clip of 30 latent frames: the first `motion_frames` (2) are the clean last
latents of the previous chunk, the other 28 are denoised and decode to the chunk's 28 frames
(1.12 s at 25 fps, 17920 samples at 16 kHz). Why an image VAE and not Wan's causal video VAE:
decoding a 33-frame Wan clip at 64x64 took ~3 s on one loaded CPU core, 28 image latents ~0.5 s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts

# The streaming geometry the pipeline reads from `talking_head.json`.
GEOMETRY: dict[str, int] = {
    "fps": 25,
    "sample_rate": 16000,
    "chunk_samples": 17920,
    "frames_per_chunk": 28,
    "motion_frames": 2,
    "steps": 4,
    "height": 64,
    "width": 64,
}
# The width of the audio encoder's features (the denoiser's `audio_dim`).
AUDIO_WIDTH = 32


def audio_encoder() -> Any:
    """A 2-layer `Wav2Vec2Model` of width 32 with wav2vec 2.0's conv strides (a 320-sample hop:
    50 features a second at 16 kHz) and 16 conv channels; the caller's RNG."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=AUDIO_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(16,) * 7,
        conv_stride=(5, 2, 2, 2, 2, 2, 2),
        conv_kernel=(10, 3, 3, 3, 3, 2, 2),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        feat_extract_norm="group",
        mask_time_prob=0.0,
        vocab_size=32,
    )
    return Wav2Vec2Model(config)


def build_tiny_talking_head(target: Path) -> None:
    """The tiny talking-head folder: audio_encoder/, denoiser/, vae/, scheduler/ and
    `talking_head.json`."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import Wav2Vec2FeatureExtractor

    from omnirt.worker.pipelines.talking_head import CONFIG_NAME, TalkingHeadDenoiser

    with parts.seeded():
        encoder = audio_encoder()
        vae = parts.image_vae()
        denoiser = TalkingHeadDenoiser(audio_dim=AUDIO_WIDTH)
    target.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(str(target / "audio_encoder"))
    extractor = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=GEOMETRY["sample_rate"], padding_value=0.0, do_normalize=True
    )
    extractor.save_pretrained(str(target / "audio_encoder"))
    vae.save_pretrained(str(target / "vae"))
    denoiser.save_pretrained(str(target / "denoiser"))
    scheduler: Any = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.save_pretrained(str(target / "scheduler"))
    (target / CONFIG_NAME).write_text(json.dumps(GEOMETRY, indent=2, sort_keys=True) + "\n")
