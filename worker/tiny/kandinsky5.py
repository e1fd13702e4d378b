"""Tiny random-weight Kandinsky 5 models (`builtin:tiny-kandinsky5`, `-i2v`, `-t2i`, `-i2i`).

Real diffusers `Kandinsky5T2VPipeline` (text-to-video), `Kandinsky5I2VPipeline`
(image-to-video), `Kandinsky5T2IPipeline` (text-to-image) and `Kandinsky5I2IPipeline`
(image-to-image) with small seeded weights, built offline and saved with `save_pretrained`: a
`Kandinsky5Transformer3DModel` with one text and one visual block (patch (1, 2, 2) as Kandinsky
5's; the video one with the visual conditioning channels of Kandinsky 5's video models), a
`Qwen2_5_VLForConditionalGeneration` with a 3-layer text model and a 1-block vision tower, a
`CLIPTextModel` for the pooled embedding with the offline CLIP tokenizer, and a
`FlowMatchEulerDiscreteScheduler`. The video model's VAE is an `AutoencoderKLHunyuanVideo` with 4
latent channels (8x spatial, 4x temporal: HunyuanVideo's VAE, as Kandinsky 5's video models
use); the image model's the 8x `AutoencoderKL` of `parts` (Kandinsky 5's image model uses
FLUX.1's).

Video sizes are multiples of 16 (VAE factor 8 x patch 2); the pipeline itself makes a frame
count n off the 4k+1 grid (n // 4) * 4 + 1 frames (8 make 9, 6 make 5), so the worker passes any
count; 5 frames make 2 latent frames. The image pipelines make one of their seven resolutions
(1024x1024, 1280x768, ...: the one nearest the asked aspect ratio) whatever size is asked.

The image-to-video model is the text-to-video one's weights (the same seeded modules: the I2V
pipeline takes them as they are), saved as the I2V pipeline; its input image is the first latent
frame. It needs 17 frames or more: the pipeline renormalises the first 4 latent frames against the
ones after them (`normalize_first_frame`), NaN with fewer than 5 latent frames. The image-to-image
model is the text-to-image one with a visual-conditioning transformer (the I2I pipeline
concatenates the image's latents and a mask to the noise, as the video transformer's input does).

Two departures from the released layout, both for this worker's environment:
- The `tokenizer` is a plain Qwen2 tokenizer (the one of `hunyuan_video15`, whose merges make
  Kandinsky 5's video template 131 tokens, of which the pipeline drops 128, and its image
  template exactly the 40 dropped) where the released models ship a `Qwen2VLProcessor`:
  transformers builds that processor only with torchvision (for its video processor), which
  the worker does not install. The pipelines call it as a tokenizer (`images=None,
  videos=None`), so the text path is the same; the image-to-image pipeline passes its input
  image too, which a plain tokenizer ignores: there the image conditions the transformer (its
  latents), not also the Qwen2.5-VL prompt embedding as with the released processor.
- The transformer's modulation layers start from small random weights, not zeros as
  diffusers initialises them: with zero modulation every block's gate is closed and the output
  would not depend on the prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts
from omnirt.worker.tiny.hunyuan_video15 import QWEN_WIDTH, qwen_text_config, qwen_tokenizer

LATENT_CHANNELS = 4
CLIP_WIDTH = 16
# The visual rotary axes (frames, height, width) add up to the attention head width.
AXES_DIMS = (2, 2, 4)


def _text_modules() -> dict[str, Any]:
    """The Qwen2.5-VL and CLIP encoders and tokenizers both pipelines take, from the caller's RNG."""
    from transformers import CLIPTextModel, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = qwen_tokenizer()
    tokenizer_2 = parts.clip_tokenizer()
    token_id = tokenizer.convert_tokens_to_ids
    text_encoder = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config=qwen_text_config(tokenizer).to_dict(),
            vision_config={
                "depth": 1,
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_heads": 2,
                "out_hidden_size": QWEN_WIDTH,
                "fullatt_block_indexes": [0],
            },
            image_token_id=token_id("<|image_pad|>"),
            video_token_id=token_id("<|video_pad|>"),
            vision_start_token_id=token_id("<|vision_start|>"),
            vision_end_token_id=token_id("<|vision_end|>"),
        )
    )
    text_encoder_2 = CLIPTextModel(parts.clip_text_config(tokenizer_2, width=CLIP_WIDTH))
    return {
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "text_encoder_2": text_encoder_2,
        "tokenizer_2": tokenizer_2,
    }


def _transformer(visual_cond: bool) -> Any:
    """A tiny `Kandinsky5Transformer3DModel` with random (not zero) modulation weights."""
    import torch
    from diffusers import Kandinsky5Transformer3DModel
    from diffusers.models.transformers.transformer_kandinsky import Kandinsky5Modulation

    transformer: Any = Kandinsky5Transformer3DModel(
        in_visual_dim=LATENT_CHANNELS,
        out_visual_dim=LATENT_CHANNELS,
        in_text_dim=QWEN_WIDTH,
        in_text_dim2=CLIP_WIDTH,
        time_dim=16,
        patch_size=(1, 2, 2),
        model_dim=16,
        ff_dim=32,
        num_text_blocks=1,
        num_visual_blocks=1,
        axes_dims=AXES_DIMS,
        visual_cond=visual_cond,
        attention_type="regular",
    )
    # diffusers zeroes every modulation (closed gates: no block, no prompt, would count).
    for module in transformer.modules():
        if isinstance(module, Kandinsky5Modulation):
            torch.nn.init.normal_(module.out_layer.weight, std=0.2)
            torch.nn.init.normal_(module.out_layer.bias, std=0.2)
    return transformer


def _video_pipeline(cls: Any) -> Any:
    """`cls` (the T2V or I2V pipeline) on the video model's modules."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    with parts.seeded():
        text = _text_modules()
        vae = parts.hunyuan_video_vae(LATENT_CHANNELS)
        transformer = _transformer(visual_cond=True)
    return cls(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), **text)


def _image_pipeline(cls: Any, visual_cond: bool) -> Any:
    """`cls` (the T2I or I2I pipeline) on the image model's modules."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    with parts.seeded():
        text = _text_modules()
        vae = parts.image_vae(latent_channels=LATENT_CHANNELS)
        transformer = _transformer(visual_cond=visual_cond)
    return cls(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), **text)


def build_tiny_kandinsky5(target: Path) -> None:
    """A tiny Kandinsky 5 text-to-video `Kandinsky5T2VPipeline` (sizes multiple of 16)."""
    from diffusers import Kandinsky5T2VPipeline

    _video_pipeline(Kandinsky5T2VPipeline).save_pretrained(str(target))


def build_tiny_kandinsky5_i2v(target: Path) -> None:
    """A tiny Kandinsky 5 image-to-video `Kandinsky5I2VPipeline`: the text-to-video weights."""
    from diffusers import Kandinsky5I2VPipeline

    _video_pipeline(Kandinsky5I2VPipeline).save_pretrained(str(target))


def build_tiny_kandinsky5_t2i(target: Path) -> None:
    """A tiny Kandinsky 5 text-to-image `Kandinsky5T2IPipeline` (it makes one of its resolutions)."""
    from diffusers import Kandinsky5T2IPipeline

    _image_pipeline(Kandinsky5T2IPipeline, visual_cond=False).save_pretrained(str(target))


def build_tiny_kandinsky5_i2i(target: Path) -> None:
    """A tiny Kandinsky 5 image-to-image `Kandinsky5I2IPipeline` (one of its resolutions)."""
    from diffusers import Kandinsky5I2IPipeline

    _image_pipeline(Kandinsky5I2IPipeline, visual_cond=True).save_pretrained(str(target))
