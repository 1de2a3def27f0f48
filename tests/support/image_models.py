"""Tiny CLIP and SigLIP models and drawn images for tests: random weights, the layouts their libraries save.

- `build_tiny_clip`: a transformers ``CLIPModel`` folder (config, safetensors, a byte-level BPE tokenizer whose
  vocabulary is CLIP's first 514 entries, its image processor at 32 pixels).
- `build_tiny_siglip`: a transformers ``SiglipModel`` folder (a SentencePiece tokenizer trained here on a few
  phrases, ``spiece.model`` as SigLIP ships it).
- `build_tiny_st_clip`: the CLIP saved as a sentence-transformers folder (sentence-transformers' multimodal
  Transformer module), or, with ``legacy=True``, laid out as the hub's ``clip-ViT-*`` folders are (the
  ``CLIPModel`` module in ``0_CLIPModel``).
- `draw_images`: deterministic pictures (shapes, gradients, noise) as PIL images; `encoded` saves them as
  JPEG or PNG bytes; `truncated` and `decompression_bomb` are the bad files a job must reject by name.

Nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from functools import cache
from pathlib import Path

IMAGE_SIZE = 32  # the tiny vision towers' input
TEXT_WINDOW = 16  # positions of the tiny text towers (CLIP's real one is 77, SigLIP's 64)
CLIP_DIM = 16  # the CLIP's projection
SIGLIP_DIM = 32  # SigLIP has no projection: its width
BOMB_SIDE = 10_000  # 100 megapixels: over Pillow's default limit of 89.5, under twice it


def _byte_level_vocab() -> dict[str, int]:
    """CLIP's vocabulary without merges: the 256 byte symbols, the same ending a word, then its two specials."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = printable + [256 + n for n, _ in enumerate(b for b in range(256) if b not in printable)]
    symbols = [chr(c) for c in codes]
    tokens = symbols + [s + "</w>" for s in symbols] + ["<|startoftext|>", "<|endoftext|>"]
    return {token: index for index, token in enumerate(tokens)}


def _tower(hidden: int, **config) -> dict:
    return dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2, **config)


def build_tiny_clip(target: Path, seed: int = 0) -> Path:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    out = target / "clip"
    out.mkdir(parents=True, exist_ok=True)
    vocab = _byte_level_vocab()
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(
        vocab=str(out / "vocab.json"), merges=str(out / "merges.txt"), model_max_length=TEXT_WINDOW
    )
    images = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    start, end = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    config = CLIPConfig(
        text_config=_tower(
            32,
            vocab_size=len(vocab),
            max_position_embeddings=TEXT_WINDOW,
            bos_token_id=start,
            eos_token_id=end,
            pad_token_id=end,
        ),
        vision_config=_tower(32, image_size=IMAGE_SIZE, patch_size=8),
        projection_dim=CLIP_DIM,
    )
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(out)
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(out)
    return out


PHRASES = [f"a photo of a {c} {w}" for w in ("cat", "dog", "house", "tree", "car", "boat") for c in ("red", "blue")]


def build_tiny_siglip(target: Path, seed: int = 0) -> Path:
    import sentencepiece
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor, SiglipTokenizer

    out = target / "siglip"
    out.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(PHRASES * 20),
        model_writer=model,
        vocab_size=64,
        hard_vocab_limit=False,
        num_threads=1,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    (out / "spiece.model").write_bytes(model.getvalue())
    tokenizer = SiglipTokenizer(vocab_file=str(out / "spiece.model"), model_max_length=TEXT_WINDOW)
    images = SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    config = SiglipConfig(
        text_config=_tower(
            SIGLIP_DIM,
            vocab_size=tokenizer.vocab_size,
            max_position_embeddings=TEXT_WINDOW,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=None,
        ),
        vision_config=_tower(SIGLIP_DIM, image_size=IMAGE_SIZE, patch_size=8),
    )
    torch.manual_seed(seed)
    SiglipModel(config).save_pretrained(out)
    SiglipProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(out)
    return out


def build_tiny_st_clip(target: Path, seed: int = 0, legacy: bool = False, normalize: bool = False) -> Path:
    """The tiny CLIP as a sentence-transformers folder; `normalize`: with a Normalize module after it."""
    clip = build_tiny_clip(target / "backbone", seed)
    out = target / "st-clip"
    if legacy:  # as sentence-transformers 2.x saved clip-ViT-B-32: the CLIPModel module in its own folder
        shutil.copytree(clip, out / "0_CLIPModel")
        listed = [{"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"}]
        if normalize:
            listed.append(
                {"idx": 1, "name": "1", "path": "1_Normalize", "type": "sentence_transformers.models.Normalize"}
            )
            (out / "1_Normalize").mkdir()
        (out / "modules.json").write_text(json.dumps(listed))
        (out / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "SentenceTransformer"}))
        return out
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer

    transformer = Transformer(str(clip), max_seq_length=TEXT_WINDOW)
    modules = [transformer, Normalize()] if normalize else [transformer]
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


def draw_images(count: int, seed: int = 0, size: tuple[int, int] = (48, 40)) -> list:
    """`count` different RGB pictures: a background, a few shapes, some noise, each its own."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    images = []
    for _ in range(count):
        width, height = size
        image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
        draw = ImageDraw.Draw(image)
        for _ in range(rng.randint(2, 5)):
            box = sorted(rng.sample(range(width), 2)), sorted(rng.sample(range(height), 2))
            shape = rng.choice([draw.rectangle, draw.ellipse])
            shape([box[0][0], box[1][0], box[0][1], box[1][1]], fill=tuple(rng.randrange(256) for _ in range(3)))
        for _ in range(width * height // 20):
            image.putpixel((rng.randrange(width), rng.randrange(height)), tuple(rng.randrange(256) for _ in range(3)))
        images.append(image)
    return images


def encoded(image, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def truncated(data: bytes) -> bytes:
    """An encoded image cut short: its header reads, its pixels do not."""
    return data[: len(data) // 2]


@cache
def decompression_bomb() -> bytes:
    """A PNG of a few kilobytes whose BOMB_SIDE x BOMB_SIDE pixels would take 100 MB decoded (made once: 1 s)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (BOMB_SIDE, BOMB_SIDE)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def data_uri(data: bytes, mime: str = "image/jpeg") -> str:
    import base64

    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
