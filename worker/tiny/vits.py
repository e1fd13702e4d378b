"""Tiny random-weight VITS (MMS-TTS) text-to-speech model (`builtin:tiny-vits`).

A real transformers `VitsModel` and `VitsTokenizer` in the layout of a hub checkpoint such as
`facebook/mms-tts-eng` (config.json, model.safetensors, vocab.json and tokenizer_config.json at
the folder's root, no diffusers model_index.json), with small seeded weights in the sizes of
transformers' own VITS tests: a 2-layer text encoder of width 16, 2 prior flows, a stochastic
duration predictor of 2 flows and a HiFi-GAN decoder upsampling 8 x 8 x 4 = 256 samples per
spectrogram frame (16 ms at 16 kHz, the hop of MMS-TTS). The vocabulary is MMS-TTS English's
characters, written offline: lower-case letters, the apostrophe, the hyphen and the space, with
`add_blank` (a blank between characters) and `normalize` (casing and punctuation dropped), and
no phonemizer (MMS-TTS reads characters).

The duration predictor's weights are random: each character lasts a few frames, so a longer
prompt makes a longer clip and a faster `speaking_rate` a shorter one, as on the real model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts

SAMPLE_RATE = 16000
UPSAMPLE_RATES = (8, 8, 4)
# MMS-TTS English reads these characters; id 0 is its blank (and pad) token.
CHARACTERS = "_ '-abcdefghijklmnopqrstuvwxyz"


def vocabulary() -> dict[str, int]:
    """The tiny model's character vocabulary (token -> id)."""
    return {char: index for index, char in enumerate(CHARACTERS)}


def tiny_config() -> Any:
    """A `VitsConfig` in the sizes of transformers' VITS tests, MMS-TTS's hop and sample rate."""
    from transformers import VitsConfig

    return VitsConfig(
        vocab_size=len(CHARACTERS),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=32,
        flow_size=16,
        spectrogram_bins=8,
        duration_predictor_num_flows=2,
        duration_predictor_filter_channels=16,
        prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=2,
        posterior_encoder_num_wavenet_layers=2,
        upsample_initial_channel=16,
        upsample_rates=list(UPSAMPLE_RATES),
        upsample_kernel_sizes=[16, 16, 8],
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1, 3]],
        sampling_rate=SAMPLE_RATE,
        pad_token_id=0,
    )


def build_tiny_vits(target: Path) -> None:
    """A tiny `VitsModel` with its `VitsTokenizer`, saved like an MMS-TTS hub checkpoint."""
    from transformers import VitsModel, VitsTokenizer

    target.mkdir(parents=True, exist_ok=True)
    vocab_file = target / "vocab.json"
    vocab_file.write_text(json.dumps(vocabulary(), indent=2, sort_keys=True) + "\n")
    tokenizer = VitsTokenizer(
        str(vocab_file),
        pad_token="_",
        unk_token="<unk>",
        language="eng",
        add_blank=True,
        normalize=True,
        phonemize=False,
    )
    with parts.seeded():
        model = VitsModel(tiny_config())
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
