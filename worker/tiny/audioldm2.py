"""Tiny random-weight AudioLDM 2 text-to-audio model (`builtin:tiny-audioldm2`).

A real diffusers `AudioLDM2Pipeline` with small seeded weights in the shapes of diffusers' own
AudioLDM 2 tests, built offline and saved with `save_pretrained`: a `ClapModel` (text branch 16
wide, with the offline RoBERTa tokenizer; its audio branch only scores several waveforms, and
only with librosa), a 2-layer `T5EncoderModel` of width 32 with the offline T5 tokenizer, an
`AudioLDM2ProjectionModel`, a 2-layer `GPT2LMHeadModel` 16 wide that generates 8 hidden states,
an `AudioLDM2UNet2DConditionModel` cross-attending to both, a 1-channel `AutoencoderKL` (2x) over
8 mel bins, a `SpeechT5HifiGan` vocoder at 16 kHz and a `DDIMScheduler`.

Two differences from diffusers' test vocoder: its convolutions start from PyTorch's own
initialisation (transformers' std 0.01 makes a waveform near 1e-9, silence in 16 bits), and it
upsamples 5 x 4 x 4 x 2 = 160 samples per mel frame (10 ms, AudioLDM 2's own hop) where the
test's makes 4, so a clip of a second is 100 mel frames, not 4000. A request's `duration_ms` is
the pipeline's `audio_length_in_s`: it makes at least that many frames (a whole number of the
VAE's 2, so 20 ms at least) and cuts the waveform to the length asked; the default (no duration)
is the UNet's `sample_size` latents: 50 x 2 x 10 ms = 1 s. Without librosa (the worker has none)
several waveforms per prompt come in the order they were made, not re-ranked by CLAP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import tokenizers

SAMPLE_RATE = 16000
MEL_BINS = 8
# Latent frames of the default clip (the UNet's `sample_size`): 50 x 2 mel frames of 10 ms.
LATENT_FRAMES = 50
CLAP_WIDTH = 16
T5_WIDTH = 32
GPT2_WIDTH = 16
TOKENS = 32


def _clap(tokenizer: Any) -> Any:
    from transformers import ClapAudioConfig, ClapConfig, ClapModel, ClapTextConfig

    text = ClapTextConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=CLAP_WIDTH,
        intermediate_size=37,
        layer_norm_eps=1e-05,
        num_attention_heads=2,
        num_hidden_layers=2,
        vocab_size=len(tokenizer),
        projection_dim=CLAP_WIDTH,
    )
    audio = ClapAudioConfig(
        spec_size=64,
        window_size=4,
        num_mel_bins=64,
        layer_norm_eps=1e-05,
        depths=[2, 2],
        num_attention_heads=[2, 2],
        num_hidden_layers=2,
        hidden_size=192,
        projection_dim=CLAP_WIDTH,
        patch_size=2,
        patch_stride=2,
        patch_embed_input_channels=4,
    )
    return ClapModel(
        ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=CLAP_WIDTH)
    )


def _t5(tokenizer: Any) -> Any:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=T5_WIDTH,
            d_ff=37,
            d_kv=8,
            num_heads=2,
            num_layers=2,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )


def _gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(
            n_embd=GPT2_WIDTH,
            n_head=2,
            n_layer=2,
            vocab_size=1000,
            n_positions=99,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    model.config.max_new_tokens = 8  # the hidden states it generates per prompt
    return model


def _vocoder() -> Any:
    import torch
    from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

    vocoder = SpeechT5HifiGan(
        SpeechT5HifiGanConfig(
            model_in_dim=MEL_BINS,
            sampling_rate=SAMPLE_RATE,
            upsample_initial_channel=32,
            upsample_rates=[5, 4, 4, 2],
            upsample_kernel_sizes=[10, 8, 8, 4],
            resblock_kernel_sizes=[3, 7],
            resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
            normalize_before=False,
        )
    )
    # transformers draws its convolutions with std 0.01: through four upsampling stages the
    # waveform comes out near 1e-9, all zero once written as 16-bit samples. PyTorch's own
    # (fan-in) initialisation keeps it audible.
    for module in vocoder.modules():
        if isinstance(module, torch.nn.Conv1d | torch.nn.ConvTranspose1d):
            module.reset_parameters()
    return vocoder


def build_tiny_audioldm2(target: Path) -> None:
    """A tiny `AudioLDM2Pipeline`: mono 16 kHz clips, 1 s by default."""
    import torch
    from diffusers import (
        AudioLDM2Pipeline,
        AudioLDM2ProjectionModel,
        AudioLDM2UNet2DConditionModel,
        AutoencoderKL,
        DDIMScheduler,
    )
    from transformers import ClapFeatureExtractor

    tokenizer = tokenizers.roberta_tokenizer()
    tokenizer_2 = tokenizers.t5_tokenizer()
    tokenizer_2.model_max_length = TOKENS
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = AudioLDM2UNet2DConditionModel(
            block_out_channels=(32, 64),
            layers_per_block=2,
            sample_size=LATENT_FRAMES,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            # Per block: its self-attention, the GPT-2 states, the T5 states.
            cross_attention_dim=([None, GPT2_WIDTH, T5_WIDTH], [None, GPT2_WIDTH, T5_WIDTH]),
        )
        vae = AutoencoderKL(
            block_out_channels=[32, 64],
            in_channels=1,
            out_channels=1,
            down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
            up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
            latent_channels=4,
        )
        text_encoder = _clap(tokenizer)
        text_encoder_2 = _t5(tokenizer_2)
        language_model = _gpt2()
        projection_model = AudioLDM2ProjectionModel(
            text_encoder_dim=CLAP_WIDTH, text_encoder_1_dim=T5_WIDTH, langauge_model_dim=GPT2_WIDTH
        )
        vocoder = _vocoder()
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
    )
    pipeline: Any = AudioLDM2Pipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        projection_model=projection_model,
        language_model=language_model,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        feature_extractor=ClapFeatureExtractor(),
        unet=unet,
        scheduler=scheduler,
        vocoder=vocoder,
    )
    pipeline.save_pretrained(str(target))
