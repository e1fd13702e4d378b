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


def gemma_tokenizer() -> Any:
    """A Gemma tokenizer (BPE over `gemma_vocabulary`, `<bos>` first, byte fallback), made offline.

    transformers' GemmaTokenizer rebuilds its BPE from the vocabulary and merges on load, so the
    tokenizer is made through that same constructor and round-trips through `save_pretrained`.
    """
    from transformers import GemmaTokenizer

    vocab, merges = gemma_vocabulary()
    # The BPE model takes (left, right) pairs; transformers' annotation names only strings.
    return GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)  # type: ignore[arg-type]


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
