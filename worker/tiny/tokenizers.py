"""Tokenizers the tiny models build offline: CLIP (byte-level BPE) files, T5 (Unigram), Llama and Gemma.

No machine here reaches a model hub, so the tiny families share these hand-made vocabularies:
small, but real tokenizer classes that `from_pretrained` loads back like any other.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

_WORDS = (
    *("the", "a", "an", "of", "and", "in", "on", "at", "to", "with", "from", "by", "is", "it", "for"),
    *("cat", "dog", "fox", "bird", "fish", "horse", "boat", "ship", "car", "train", "sea", "sky"),
    *("sun", "moon", "star", "night", "day", "city", "street", "tree", "forest", "river", "snow"),
    *("rain", "light", "fire", "water", "red", "blue", "green", "yellow", "black", "white", "orange"),
    *("small", "big", "old", "new", "running", "flying", "walking", "video", "frame"),
)


def t5_vocabulary() -> list[tuple[str, float]]:
    """A SentencePiece-style Unigram vocabulary: (piece, log probability), T5's special ids first."""
    vocab: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + word, -3.0) for word in _WORDS]
    vocab += [("\u2581" + char, -5.5) for char in string.ascii_lowercase + string.digits]
    vocab += [(char, -5.0) for char in string.ascii_letters + string.digits + string.punctuation]
    return vocab


def t5_tokenizer() -> Any:
    """A T5 (Unigram) tokenizer over `t5_vocabulary`, made offline."""
    from transformers import T5Tokenizer

    return T5Tokenizer(vocab=t5_vocabulary(), extra_ids=0)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP byte-level mapping: every byte to a printable unicode character."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


# A few frequent English pairs, so common words take fewer tokens than bytes.
_MERGE_PAIRS = ("th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "or", "es", "ca", "do", "og")


def write_clip_tokenizer_files(folder: Path) -> None:
    """Write a byte-level BPE `vocab.json` + `merges.txt` that CLIPTokenizer loads (~550 tokens)."""
    symbols = list(_bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for symbol in symbols:
        vocab[symbol] = len(vocab)
    for symbol in symbols:
        vocab[symbol + "</w>"] = len(vocab)
    merges = []
    for pair in _MERGE_PAIRS:
        for suffix in ("", "</w>"):
            merges.append(f"{pair[0]} {pair[1]}{suffix}")
            vocab[f"{pair}{suffix}"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")


_GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")


def gemma_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A Gemma-shaped BPE vocabulary and merges: Gemma's special ids first, byte fallback, a few words.

    Ids 0-4 are `<pad>`, `<eos>`, `<bos>`, `<unk>`, `<mask>` as in Gemma; the 256 `<0xNN>` byte
    tokens let any text encode (byte fallback); the merges join `\u2581`-prefixed words of `_WORDS`.
    """
    vocab: dict[str, int] = {}
    for token in (*_GEMMA_SPECIALS, *(f"<0x{byte:02X}>" for byte in range(256))):
        vocab[token] = len(vocab)
    for char in "\u2581" + string.ascii_letters + string.digits + string.punctuation:
        vocab.setdefault(char, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        piece = "\u2581"
        for char in word:
            if piece + char not in vocab:
                merges.append((piece, char))
                vocab[piece + char] = len(vocab)
            piece += char
    return vocab, merges


def bpe_merges(merges: list[tuple[str, str]]) -> Any:
    """`merges` as transformers' BPE tokenizers take them: (left, right) pairs, as their BPE model
    reads them, though their annotation names only strings (hence `Any`)."""
    return merges


def gemma_tokenizer() -> Any:
    """A Gemma tokenizer (BPE over `gemma_vocabulary`, `<bos>` first, byte fallback), made offline.

    transformers' GemmaTokenizer rebuilds its BPE from the vocabulary and merges on load, so the
    tokenizer is made through that same constructor and round-trips through `save_pretrained`.
    """
    from transformers import GemmaTokenizer

    vocab, merges = gemma_vocabulary()
    return GemmaTokenizer(vocab=vocab, merges=bpe_merges(merges), add_bos_token=True)


_LLAMA_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
# Llama 3's chat headers, which HunyuanVideo's default prompt template is written in.
_LLAMA_CHAT_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# The words of HunyuanVideo's default prompt template, so it encodes in ~125 tokens and the
# pipeline's fixed crop (95 tokens) and 351-token window keep the whole user prompt.
_TEMPLATE_WORDS = (
    *("describe", "video", "detailing", "following", "aspects", "main", "content", "theme", "color"),
    *("shape", "size", "texture", "quantity", "text", "spatial", "relationships", "objects", "actions"),
    *("events", "behaviors", "temporal", "physical", "movement", "changes", "background", "environment"),
    *("style", "atmosphere", "camera", "angles", "movements", "transitions", "used", "system", "user"),
)


def llama_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A Llama-shaped BPE vocabulary and merges: `<unk>`, `<s>`, `</s>`, `<pad>`, byte fallback, words.

    The 256 `<0xNN>` byte tokens let any text encode (byte fallback); the merges join the
    `\u2581`-prefixed words of `_WORDS` and `_TEMPLATE_WORDS`, lower-case and capitalised.
    """
    vocab: dict[str, int] = {}
    for token in (*_LLAMA_SPECIALS, *(f"<0x{byte:02X}>" for byte in range(256))):
        vocab[token] = len(vocab)
    for char in "\u2581" + string.ascii_letters + string.digits + string.punctuation:
        vocab.setdefault(char, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in dict.fromkeys(_WORDS + _TEMPLATE_WORDS):
        for spelling in (word, word.capitalize()):
            piece = "\u2581"
            for char in spelling:
                if piece + char not in vocab:
                    merges.append((piece, char))
                    vocab[piece + char] = len(vocab)
                piece += char
    return vocab, merges


def llama_tokenizer() -> Any:
    """A Llama tokenizer (BPE over `llama_vocabulary`, `<s>` first, Llama 3 chat headers), made offline.

    transformers' LlamaTokenizer rebuilds its BPE from the vocabulary and merges on load, so the
    tokenizer is made through that same constructor and round-trips through `save_pretrained`.
    Padding is on the right, as HunyuanVideo's tokenizer: its pipeline crops the template's
    tokens from the front of the padded sequence.
    """
    from transformers import LlamaTokenizerFast

    vocab, merges = llama_vocabulary()
    return LlamaTokenizerFast(
        vocab=vocab,
        merges=merges,
        pad_token="<pad>",
        padding_side="right",
        add_bos_token=True,
        extra_special_tokens=list(_LLAMA_CHAT_TOKENS),
    )


# Mistral's Tekken control tokens, at Tekken's ids (0-19): `[IMG]` is 10 and `<pad>` 11, as the
# Mistral-Small-3.1 configs FLUX.2 ships name them.
_MISTRAL_SPECIALS = (
    *("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"),
    *("[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]"),
    *("[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
    "[TOOL_CONTENT]",
)
# Mistral-Small-3.1's chat template, text blocks only: `<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]`,
# then `[INST]...[/INST]` per user turn (message content a string or a list of text blocks).
_MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}{% endif %}"
    "{% if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST]' + text + '[/INST]' }}"
    "{% else %}{{ text + eos_token }}{% endif %}{% endfor %}"
)


def mistral_tokenizer() -> Any:
    """A Mistral (Tekken-like byte-level BPE) tokenizer with Mistral's chat template, made offline.

    Tekken's control tokens at their ids, the 256 byte symbols of `_bytes_to_unicode` (any text
    encodes), and merges that join the words of `_WORDS` (with and without a leading space).
    FLUX.2's system prompt and a short user prompt take ~125 of the pipeline's 512 (~600 in all).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(_MISTRAL_SPECIALS)}
    symbols = _bytes_to_unicode()
    for symbol in symbols.values():
        vocab.setdefault(symbol, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        for spelling in (symbols[ord(" ")] + word, word):
            piece = spelling[0]
            for char in spelling[1:]:
                if piece + char not in vocab:
                    merges.append((piece, char))
                    vocab[piece + char] = len(vocab)
                piece += char
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens=[t for t in _MISTRAL_SPECIALS if t not in ("<unk>", "<s>", "</s>", "<pad>")],
        chat_template=_MISTRAL_CHAT_TEMPLATE,
    )


# Qwen2's chat and vision tokens, after `<|endoftext|>` (its unk, eos and pad token) as in Qwen2.5-VL.
QWEN2_SPECIALS = (
    *("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"),
    *("<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"),
)
# The words of Qwen-Image's prompt templates (text-to-image and edit), each one token after a space
# as in Qwen2's own vocabulary: the pipelines drop a fixed count of template tokens (34 and 64).
_QWEN_TEMPLATE_WORDS = (
    *("Describe", "image", "detailing", "color", "shape", "size", "texture", "quantity", "text"),
    *("spatial", "relationships", "objects", "background", "key", "features", "input", "then"),
    *("explain", "how", "user", "instruction", "should", "alter", "or", "modify", "Generate", "new"),
    *("that", "meets", "requirements", "while", "maintaining", "consistency", "original", "where"),
    "appropriate",
)
# Pieces Qwen2 keeps whole that are not a word after a space: the roles after `<|im_start|>`,
# a template's first word after a newline, and the template's punctuation.
_QWEN_PIECES = ("system", "user", "assistant", "Describe", "color", "'s", "),")


def qwen2_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A Qwen2-shaped byte-level BPE vocabulary and merges (special tokens not included).

    The 256 byte symbols of `_bytes_to_unicode` let any text encode; the merges join the words of
    `_WORDS` and of Qwen-Image's templates after a space (`Ġword`), then `_QWEN_PIECES`. The
    space-prefixed merges rank first, so a word after a space always becomes one token.
    """
    symbols = _bytes_to_unicode()
    vocab: dict[str, int] = {}
    for symbol in symbols.values():
        vocab.setdefault(symbol, len(vocab))
    space = symbols[ord(" ")]
    words = dict.fromkeys(_WORDS + _QWEN_TEMPLATE_WORDS)
    merges: list[tuple[str, str]] = []
    for spelling in (*(space + word for word in words), space + "(", *_QWEN_PIECES):
        piece = spelling[0]
        for char in spelling[1:]:
            if piece + char not in vocab:
                merges.append((piece, char))
                vocab[piece + char] = len(vocab)
            piece += char
    return vocab, merges


def qwen2_tokenizer() -> Any:
    """A Qwen2 tokenizer (byte-level BPE over `qwen2_vocabulary`, Qwen2's chat and vision tokens),
    made offline: Qwen-Image's text-to-image template prefix encodes in exactly the 34 tokens its
    pipeline drops, the edit template's in 64."""
    from transformers import Qwen2Tokenizer

    vocab, merges = qwen2_vocabulary()
    # `<|endoftext|>` is the class's own unk/eos/pad token; the rest follow it.
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=bpe_merges(merges),
        extra_special_tokens=list(QWEN2_SPECIALS[1:]),
    )


def sentencepiece_unigram_model() -> bytes:
    """A serialized SentencePiece Unigram model (a `tokenizer.model` file) over `t5_vocabulary`.

    `<unk>`, `<s>` and `</s>` are ids 0-2 (ChatGLM's layout), then the T5 pieces once each, with
    an identity normalizer; made from the model proto directly, no training run.
    """
    from sentencepiece import sentencepiece_model_pb2

    # Generated protobuf code without stubs: its message classes are made at import time.
    model_pb2: Any = sentencepiece_model_pb2
    model = model_pb2.ModelProto()
    piece_type = model_pb2.ModelProto.SentencePiece
    for text, kind in (
        ("<unk>", piece_type.UNKNOWN),
        ("<s>", piece_type.CONTROL),
        ("</s>", piece_type.CONTROL),
    ):
        model.pieces.add(piece=text, score=0.0, type=kind)
    seen = {"<pad>", "</s>", "<unk>"}  # T5's specials; ChatGLM has its own above
    for text, score in t5_vocabulary():
        if text not in seen:  # `▁a` is both a word and a letter there: a proto takes each once
            seen.add(text)
            model.pieces.add(piece=text, score=score, type=piece_type.NORMAL)
    model.trainer_spec.model_type = model_pb2.TrainerSpec.UNIGRAM
    model.trainer_spec.vocab_size = len(model.pieces)
    model.trainer_spec.unk_id, model.trainer_spec.bos_id, model.trainer_spec.eos_id = 0, 1, 2
    model.trainer_spec.pad_id = -1
    model.normalizer_spec.name = "identity"
    model.normalizer_spec.add_dummy_prefix = True
    model.normalizer_spec.remove_extra_whitespaces = True
    model.normalizer_spec.escape_whitespaces = True
    return model.SerializeToString()


def roberta_tokenizer(max_length: int = 77) -> Any:
    """A RoBERTa tokenizer (byte-level BPE over `qwen2_vocabulary`, RoBERTa's `<s>`, `<pad>`,
    `</s>`, `<unk>` as ids 0-3 and `<mask>` last), made offline: the one CLAP's text branch takes."""
    from transformers import RobertaTokenizer

    pieces, merges = qwen2_vocabulary()
    vocab = {token: index for index, token in enumerate(("<s>", "<pad>", "</s>", "<unk>"))}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    vocab["<mask>"] = len(vocab)
    return RobertaTokenizer(
        vocab=vocab,
        merges=bpe_merges(merges),
        model_max_length=max_length,
    )
