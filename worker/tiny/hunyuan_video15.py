"""Tiny random-weight HunyuanVideo 1.5 models (`builtin:tiny-hunyuan-video15`, `-i2v`).

Real diffusers `HunyuanVideo15Pipeline` (text-to-video) and `HunyuanVideo15ImageToVideoPipeline`
(image-to-video) with small seeded weights, built offline and saved with `save_pretrained`:
a 1-layer `HunyuanVideo15Transformer3DModel` (patch 1 as HunyuanVideo 1.5's), an
`AutoencoderKLHunyuanVideo15` of width 8 with the real compression (16x spatial, 4x temporal),
a 3-layer `Qwen2_5_VLTextModel` (the pipeline reads its third-from-last hidden state) with an
offline Qwen2 tokenizer and chat template, a 2-layer ByT5 `T5EncoderModel` for quoted glyph text
(`ByT5Tokenizer` needs no vocabulary), a shifted `FlowMatchEulerDiscreteScheduler` and a
`ClassifierFreeGuidance` guider (the pipelines take no `guidance_scale`: the guider's
config is the guidance). The image-to-video model adds a 1-layer `SiglipVisionModel` and its
image processor. Sizes are multiples of 16; frame counts 4k+1 (5 frames make 2 latent frames).
The image-to-video pipeline takes no size: it picks the bucket of the transformer's
`target_size` (32 here) nearest the input image's aspect ratio (32x32 for a square image).

The Qwen2 tokenizer is the offline one of `tokenizers` with merges for the words of the
pipelines' prompt templates, so a template takes about as many tokens as with Qwen's own
vocabulary and the pipeline's fixed crop (108 tokens for HunyuanVideo 1.5, 128 for Kandinsky 5)
keeps the whole user prompt; `tiny-kandinsky5` uses it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

LATENT_CHANNELS = 4
QWEN_WIDTH = 32
BYT5_WIDTH = 32
SIGLIP_WIDTH = 16
# The rotary axes (frames, height, width) add up to the attention head width.
ROPE_AXES = (2, 2, 4)
# Pixels: the image-to-video size buckets have this area (and the text-to-video default size).
TARGET_SIZE = 32

# Qwen2's chat template (text only): what HunyuanVideo 1.5's `apply_chat_template` call needs.
_QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The words of HunyuanVideo 1.5's and Kandinsky 5's prompt templates, and a few for prompts.
_WORDS = (
    *("you", "are", "a", "helpful", "assistant", "describe", "the", "video", "by", "detailing"),
    *("following", "aspects", "main", "content", "and", "theme", "of", "color", "shape", "size"),
    *("texture", "quantity", "text", "spatial", "relationships", "objects", "actions", "events"),
    *("behaviors", "temporal", "physical", "movement", "changes", "background", "environment"),
    *("light", "style", "atmosphere", "camera", "angles", "movements", "transitions", "used", "in"),
    *("prompt", "engineer", "detail", "how", "moves", "or", "shakes", "zoom", "view", "angle"),
    *("whether", "it", "follows", "location", "characters", "their", "action", "dynamism"),
    *("presented", "name", "visual", "is", "professional", "footage", "user", "generated", "some"),
    *("kind", "animation", "game", "scren", "effects", "postprocessing", "if", "they", "pay"),
    *("attention", "to", "order", "key", "shown", "scene", "image", "system", "on", "red", "fox"),
    *("blue", "boat", "sea", "cat", "dog", "sky", "sun", "with", "an", "at"),
)


def qwen_tokenizer() -> Any:
    """The offline Qwen2 tokenizer (`tokenizers.qwen2_vocabulary`, Qwen2's chat and vision tokens)
    with merges for the words of HunyuanVideo 1.5's and Kandinsky 5's templates, and Qwen2's chat
    template: HunyuanVideo 1.5's template prefix encodes in exactly the 108 tokens its pipeline
    drops, Kandinsky 5's image one in exactly its 40, its video one in 131 (128 dropped).

    The added merges rank after the shared ones: each space-prefixed spelling is a chain from
    the word's leading space, so it merges whole unless a shared merge splits it first.
    """
    from transformers import Qwen2Tokenizer

    vocab, merges = tokenizers.qwen2_vocabulary()
    space = "\u0120"  # the byte-level symbol of " "
    # Runs of 2, 4 and 8 spaces, as in HunyuanVideo 1.5's system message (Qwen's vocabulary has them).
    for run in (1, 2, 4):
        if space * 2 * run not in vocab:
            merges.append((space * run, space * run))
            vocab[space * 2 * run] = len(vocab)
    spellings = [
        *(space + word for word in _WORDS),
        *(space + word.capitalize() for word in _WORDS),
        *(word.capitalize() for word in _WORDS),
        *_WORDS,
    ]
    for spelling in spellings:
        piece = spelling[0]
        for char in spelling[1:]:
            if piece + char not in vocab:
                merges.append((piece, char))
                vocab[piece + char] = len(vocab)
            piece += char
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=tokenizers.bpe_merges(merges),
        chat_template=_QWEN_CHAT_TEMPLATE,
        extra_special_tokens=list(tokenizers.QWEN2_SPECIALS[1:]),
    )


def qwen_text_config(tokenizer: Any, width: int = QWEN_WIDTH, layers: int = 3) -> Any:
    """A tiny `Qwen2_5_VLTextConfig` for `tokenizer` (multimodal RoPE sections for head width 8)."""
    from transformers import Qwen2_5_VLTextConfig

    return Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_parameters={"mrope_section": [1, 1, 2], "rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _components(image_embed_dim: int, task_type: str) -> dict[str, Any]:
    """The modules both pipelines share, made in a fixed order from the caller's (seeded) RNG."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Transformer3DModel,
    )
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextModel

    tokenizer = qwen_tokenizer()
    tokenizer_2 = ByT5Tokenizer()
    text_encoder = Qwen2_5_VLTextModel(qwen_text_config(tokenizer))
    text_encoder_2 = parts.t5_encoder(tokenizer_2, BYT5_WIDTH)
    # Five blocks: four 2x spatial stages (16x), the last two also 2x temporal (4x).
    vae = AutoencoderKLHunyuanVideo15(
        latent_channels=LATENT_CHANNELS,
        block_out_channels=(8, 8, 8, 8, 8),
        layers_per_block=1,
        spatial_compression_ratio=16,
        temporal_compression_ratio=4,
        downsample_match_channel=False,
        upsample_match_channel=False,
    )
    # The latents, the condition latents and their mask go in side by side: 2 x 4 + 1 channels.
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=2 * LATENT_CHANNELS + 1,
        out_channels=LATENT_CHANNELS,
        num_attention_heads=2,
        attention_head_dim=sum(ROPE_AXES),
        num_layers=1,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=QWEN_WIDTH,
        text_embed_2_dim=BYT5_WIDTH,
        image_embed_dim=image_embed_dim,
        rope_axes_dim=ROPE_AXES,
        target_size=TARGET_SIZE,
        task_type=task_type,
    )
    return {
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "transformer": transformer,
        "vae": vae,
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=5.0),
        # Classifier-free guidance on (scale 6), so the negative prompt counts as on the real model.
        "text_encoder_2": text_encoder_2,
        "tokenizer_2": tokenizer_2,
        "guider": ClassifierFreeGuidance(guidance_scale=6.0),
    }


def build_tiny_hunyuan_video15(target: Path) -> None:
    """A tiny HunyuanVideo 1.5 text-to-video `HunyuanVideo15Pipeline` (sizes multiple of 16, 4k+1 frames)."""
    from diffusers import HunyuanVideo15Pipeline

    with parts.seeded():
        components = _components(image_embed_dim=SIGLIP_WIDTH, task_type="t2v")
    pipeline: Any = HunyuanVideo15Pipeline(**components)
    pipeline.save_pretrained(str(target))


def build_tiny_hunyuan_video15_i2v(target: Path) -> None:
    """A tiny HunyuanVideo 1.5 `HunyuanVideo15ImageToVideoPipeline` (a SigLIP image encoder added)."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

    with parts.seeded():
        components = _components(image_embed_dim=SIGLIP_WIDTH, task_type="i2v")
        # 32x32 images in 8x8 patches: 16 image tokens (the real model's SigLIP makes 729).
        image_encoder = SiglipVisionModel(
            SiglipVisionConfig(
                hidden_size=SIGLIP_WIDTH,
                intermediate_size=2 * SIGLIP_WIDTH,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=32,
                patch_size=8,
            )
        )
    # The PIL processor: the default one needs torchvision, which the worker does not install.
    feature_extractor = SiglipImageProcessorPil(size={"height": 32, "width": 32})
    pipeline: Any = HunyuanVideo15ImageToVideoPipeline(
        **components, image_encoder=image_encoder, feature_extractor=feature_extractor
    )
    pipeline.save_pretrained(str(target))
