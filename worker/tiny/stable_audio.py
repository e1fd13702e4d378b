"""Tiny random-weight Stable Audio text-to-audio model (`builtin:tiny-stable-audio`).

A real diffusers `StableAudioPipeline` with small seeded weights in the shapes of diffusers' own
Stable Audio tests, built offline and saved with `save_pretrained`: a 1-layer
`StableAudioDiTModel` over 64 latent positions, an `AutoencoderOobleck` of width 8 (stereo,
8000 Hz, downsampling 4 x 8 x 8 = one latent per 256 samples, 32 ms), a 2-layer `T5EncoderModel`
of width 32 with the offline T5 tokenizer (16 tokens), a `StableAudioProjectionModel` for the
start and end seconds (0 to 32 s), and Stable Audio Open's `CosineDPMSolverMultistepScheduler`
(which needs `torchsde`).

The longest clip is the transformer's `sample_size` x the VAE's hop / the sample rate:
64 x 256 / 8000 = 2.048 s; a request's `duration_ms` cuts the decoded 2.048 s to its length.
8000 Hz is the lowest rate MP3 takes, so every output format works on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

SAMPLE_RATE = 8000
AUDIO_CHANNELS = 2
LATENT_CHANNELS = 4
# Latent positions the transformer denoises (the whole clip, whatever the request's duration).
LATENT_LENGTH = 64
DOWNSAMPLING = (4, 8, 8)
WIDTH = parts.TEXT_WIDTH
TOKENS = 16


def build_tiny_stable_audio(target: Path) -> None:
    """A tiny `StableAudioPipeline`: stereo 8 kHz clips up to 2.048 s."""
    from diffusers import (
        AutoencoderOobleck,
        CosineDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
    )
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel

    tokenizer = tokenizers.t5_tokenizer()
    # The pipeline pads every prompt to `model_max_length` (T5's own is unbounded).
    tokenizer.model_max_length = TOKENS
    with parts.seeded():
        text_encoder = parts.t5_encoder(tokenizer, WIDTH)
        transformer = StableAudioDiTModel(
            sample_size=LATENT_LENGTH,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            num_key_value_attention_heads=1,
            cross_attention_dim=16,
            time_proj_dim=16,
            global_states_input_dim=32,  # the start and end seconds' embeddings side by side
            cross_attention_input_dim=16,  # the projection model's width
        )
        vae = AutoencoderOobleck(
            encoder_hidden_size=8,
            downsampling_ratios=list(DOWNSAMPLING),
            channel_multiples=[1, 2, 2],
            decoder_channels=8,
            decoder_input_channels=LATENT_CHANNELS,
            audio_channels=AUDIO_CHANNELS,
            sampling_rate=SAMPLE_RATE,
        )
        projection_model = StableAudioProjectionModel(
            text_encoder_dim=WIDTH, conditioning_dim=16, min_value=0, max_value=32
        )
    scheduler = CosineDPMSolverMultistepScheduler(
        solver_order=2, prediction_type="v_prediction", sigma_data=1.0, sigma_schedule="exponential"
    )
    pipeline: Any = StableAudioPipeline(
        vae=vae,
        text_encoder=text_encoder,
        projection_model=projection_model,
        tokenizer=tokenizer,
        transformer=transformer,
        scheduler=scheduler,
    )
    pipeline.save_pretrained(str(target))
