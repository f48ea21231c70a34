"""mhsa.Tokenizer against two independent GPT-2 tokenizers: tiktoken and Hugging Face tokenizers.

Both are built here from the same files, tests/data/gpt2-tokenizer (the machines cannot download
tiktoken's "gpt2"): tiktoken from its own data_gym_to_mergeable_bpe_ranks and GPT-2's regex, and
tokenizers as a ByteLevelBPETokenizer. On every string of tests/data/tokenizer_corpus.json (prose,
code, a dozen scripts, emoji sequences, combining marks, whitespace of every kind, numbers,
contractions) and on fresh random strings mixing those, all three give the same ids, and decode
gives the text back. Ids that cut a UTF-8 sequence decode to tiktoken's bytes (and its U+FFFD
text); any bytes, invalid UTF-8 included, encode and decode back exactly.

mhsa's character classes are Unicode 16.0.0's (src/text/unicode_data.cpp), the version of the
regex engines inside both oracles: every code point, assigned or not, pre-tokenises the same in
all three (test_every_code_point_splits_as_tiktoken_does), so random strings draw from them all.
"""

import json
import pathlib
import shutil
import threading

import pytest
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tokenizers import ByteLevelBPETokenizer

import mhsa

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
GPT2_DIR = DATA / "gpt2-tokenizer"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def ours():
    return mhsa.Tokenizer.load(GPT2_DIR)


@pytest.fixture(scope="module")
def tik():
    ranks = data_gym_to_mergeable_bpe_ranks(str(GPT2_DIR / "vocab.bpe"), str(GPT2_DIR / "encoder.json"))
    return tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: 50256})


@pytest.fixture(scope="module")
def hf():
    return ByteLevelBPETokenizer(str(GPT2_DIR / "encoder.json"), str(GPT2_DIR / "vocab.bpe"))


@pytest.fixture(scope="module")
def corpus():
    return json.loads((DATA / "tokenizer_corpus.json").read_text(encoding="utf-8"))


def disagreements(texts, ours, tik, hf):
    """The texts where the three tokenizers differ or decode does not give the text back."""
    bad = []
    for text, theirs in zip(texts, hf.encode_batch(texts)):
        ids = ours.encode(text)
        if not (ids == tik.encode_ordinary(text) == theirs.ids) or ours.decode(ids) != text:
            bad.append(text)
    return bad


def test_corpus_is_substantial(corpus):
    assert len(corpus) >= 200
    assert sum(len(s.encode("utf-8")) for s in corpus) >= 50_000
    assert "" in corpus


def test_corpus_matches_tiktoken_and_hugging_face(corpus, ours, tik, hf):
    bad = disagreements(corpus, ours, tik, hf)
    assert not bad, f"{len(bad)} of {len(corpus)} corpus strings differ, first: {bad[0]!r}"


# Fragments for random strings, by category.
WORDS = ["the", "of", "and", "Hello", "world", "GPT", "attention", "x", "I", "na\u00efve", "\u00c5ngstr\u00f6m",
         "caf\u00e9", "e\u0301", "Stra\u00dfe", "\u0130stanbul", "CamelCase", "snake_case", "ALLCAPS", "a" * 30]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'LL", "'", "''", "\u2019s"]
SPACES = [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029",
          "\u0085", "\x0b", "\x0c", "\u2009", "\u200b", "\ufeff", "\x1c", " \t", "\t ", " \n ", " " * 17]
PUNCTUATION = ["!", "?", "...", ",", ".", "--", "(", ")", '"', "#", "@", "$", "%", "&&", "->", "::", "{}", "[]",
               "\u2014", "\u00bf", "\u00ab", "\u300c", "\u2211", "\u221e", "\u2192", EOT, "<|", "|>"]
SCRIPTS = ["\u65e5\u672c\u8a9e", "\u4e2d\u6587", "\ud55c\uad6d\uc5b4", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
           "\u05e2\u05d1\u05e8\u05d9\u05ea", "\u0939\u093f\u0928\u094d\u0926\u0940", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
           "\u0420\u0443\u0441\u0441\u043a\u0438\u0439", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
           "Ti\u1ebfng Vi\u1ec7t", "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8", "\U00020000\U00020001"]
EMOJI = ["\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
         "\U0001f1fa\U0001f1f8", "\U0001f1ef\U0001f1f5", "\u2764\ufe0f", "1\ufe0f\u20e3", "\U0001f3f3\ufe0f\u200d\U0001f308",
         "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"]
COMBINING = ["\u0301", "\u0308", "\u0327", "\u0303\u0304", "\u05b0", "\u093f", "\u0e34", "\u20e3", "\u200d"]


def assigned_code_points():
    """(BMP, all): every code point but the surrogates (which UTF-8 cannot carry)."""
    out = [cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000]
    return [cp for cp in out if cp < 0x10000], out


@pytest.fixture(scope="module")
def code_points():
    return assigned_code_points()


def random_text(rng, code_points):
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    parts = []
    for _ in range(int(rng.integers(1, 60))):
        kind = int(rng.integers(9))
        if kind == 0:
            parts.append(pick(WORDS))
        elif kind == 1:
            parts.append(pick(CONTRACTIONS))
        elif kind == 2:
            parts.append(str(int(rng.integers(0, 10 ** int(rng.integers(1, 18))))))
        elif kind == 3:
            parts.append(pick(SPACES))
        elif kind == 4:
            parts.append(pick(PUNCTUATION))
        elif kind == 5:
            parts.append(pick(SCRIPTS))
        elif kind == 6:
            parts.append(pick(EMOJI))
        elif kind == 7:
            parts.append(pick(COMBINING))
        else:  # the BMP half the time: the supplementary planes hold mostly CJK ideographs
            pool = code_points[int(rng.integers(2))]
            parts.append("".join(chr(pick(pool)) for _ in range(int(rng.integers(1, 6)))))
    return "".join(parts)


def test_random_strings_match_tiktoken_and_hugging_face(rng, ours, tik, hf, code_points):
    texts = [random_text(rng, code_points) for _ in range(400)]
    bad = disagreements(texts, ours, tik, hf)
    assert not bad, f"{len(bad)} of {len(texts)} random strings differ, first: {bad[0]!r}"


def test_every_code_point_splits_as_hugging_face_does(code_points):
    """Pre-tokens compared directly (ids alone would hide most class differences: a rare letter's
    bytes rarely merge with their neighbours). Each code point sits between letters, digits,
    spaces and punctuation, so that its class (letter, number, space, other) decides the cuts;
    512 probes per string, all 1,112,064 code points."""
    from tokenizers.pre_tokenizers import ByteLevel
    hf_split = ByteLevel(add_prefix_space=False, use_regex=True)

    def cuts(text):  # HF: offsets in code points of its pieces; ours: the pieces themselves
        return [text[a:b] for _, (a, b) in hf_split.pre_tokenize_str(text)]

    probes = [f"a{c}b 1{c}2 {c}{c} .{c}. \t{c}x {c}" for c in map(chr, code_points[1])]
    bad = []
    for i in range(0, len(probes), 512):
        text = "".join(probes[i:i + 512])
        if mhsa.Tokenizer.pretokenize(text) != cuts(text):
            bad += [hex(code_points[1][j]) for j in range(i, min(i + 512, len(probes)))
                    if mhsa.Tokenizer.pretokenize(probes[j]) != cuts(probes[j])]
    assert not bad, f"{len(bad)} code points split differently, first {bad[:10]}"


def test_long_inputs_match_tiktoken(rng, ours, tik):
    letters = "".join(chr(ord("a") + int(c)) for c in rng.integers(0, 26, 200_000))
    for text in ["x" * 200_000, letters, "1" * 50_000, "!" * 50_000, " " * 5_000 + "end", "\U0001f600" * 20_000]:
        ids = ours.encode(text)
        assert ids == tik.encode_ordinary(text), text[:20]
        assert ours.decode(ids) == text


def test_decode_of_cut_characters_matches_tiktoken(rng, ours, tik):
    # Single tokens and random runs of ids from the whole vocabulary, many of which end or start
    # inside a UTF-8 sequence.
    emoji = ours.encode("\U0001f468\u200d\U0001f469\u200d\U0001f467 \u65e5\u672c\u8a9e")
    cases = [emoji[:k] for k in range(len(emoji) + 1)] + [emoji[k:] for k in range(len(emoji))]
    cases += [[int(i)] for i in rng.integers(0, ours.vocab_size, 500)]
    cases += [[int(i) for i in rng.integers(0, ours.vocab_size, int(rng.integers(1, 30)))] for _ in range(300)]
    for ids in cases:
        assert ours.decode_bytes(ids) == tik.decode_bytes(ids), ids
        assert ours.decode(ids) == tik.decode(ids), ids


def test_ids_past_the_vocabulary_are_left_out_as_tokenizers_does(rng, ours, hf):
    # Hugging Face's decode (tokenizers, and transformers' fast tokenizers through it) skips an id
    # it has no token for, up to its u32 limit, and refuses what does not fit a u32.
    for _ in range(200):
        ids = [int(i) if rng.random() < 0.7 else int(rng.integers(ours.vocab_size, 2**32))
               for i in rng.integers(0, ours.vocab_size - 1, int(rng.integers(1, 20)))]
        assert ours.decode(ids) == hf.decode(ids), ids
        assert ours.decode_bytes(ids) == ours.decode_bytes([i for i in ids if i < ours.vocab_size])
    with pytest.raises(OverflowError):
        hf.decode([1, -1])


def test_any_bytes_round_trip(rng, ours):
    valid = "Hello w\u00f6rld \u65e5\u672c \U0001f600 'll".encode("utf-8")
    for trial in range(300):
        if trial % 3 == 0:
            data = rng.integers(0, 256, int(rng.integers(0, 300)), dtype="uint8").tobytes()
        else:  # valid text with bytes cut out or sprinkled in
            data = bytearray(valid * int(rng.integers(1, 5)))
            for _ in range(int(rng.integers(1, 6))):
                at = int(rng.integers(len(data)))
                if trial % 3 == 1:
                    del data[at]
                else:
                    data.insert(at, int(rng.integers(0x80, 0x100)))
            data = bytes(data)
        ids = ours.encode(data)
        assert ours.decode_bytes(ids) == data
        assert ours.decode(ids) == data.decode("utf-8", errors="replace")
    text = "caf\u00e9 \U0001f44d\U0001f3fd"
    assert ours.encode(text.encode("utf-8")) == ours.encode(text)


def test_lone_surrogates_become_replacement_characters_as_in_tiktoken(ours, tik):
    for text in ["a\ud800b", "\udfff", "x\udcff y", "\ud83d\ude00", "ok \ud83d"]:
        assert ours.encode(text) == tik.encode_ordinary(text), ascii(text)


def test_special_token_only_when_allowed(ours, tik):
    hf = ByteLevelBPETokenizer(str(GPT2_DIR / "encoder.json"), str(GPT2_DIR / "vocab.bpe"))
    hf.add_special_tokens([EOT])
    for text in [EOT, "a" + EOT + "b", f"{EOT}{EOT} x {EOT}\n", "no special here", "<|endoftext", EOT[:-1] + " |>"]:
        special = ours.encode(text, allow_special=True)
        assert special == tik.encode(text, allowed_special="all") == hf.encode(text).ids, text
        ordinary = ours.encode(text)
        assert ordinary == tik.encode_ordinary(text)
        assert ours.eos_id not in ordinary
        assert ours.decode(special) == ours.decode(ordinary) == text


def test_api(ours):
    assert ours.vocab_size == len(ours) == 50257
    assert ours.eos_id == 50256
    assert ours.encode("Hello world") == [15496, 995]
    assert ours.encode("") == []
    assert ours.decode([]) == ""
    assert ours.token_bytes(995) == b" world"
    assert ours.token_bytes(ours.eos_id) == EOT.encode()
    assert ours.token_string(995) == "\u0120world"
    assert ours.token_id(b" world") == 995 and ours.token_id(" world") == 995
    assert ours.token_id("no such token, surely") is None
    assert ours.decode((15496, 995)) == "Hello world"  # any sequence of ints
    assert "vocab_size=50257" in repr(ours)
    assert mhsa.Tokenizer.load(str(GPT2_DIR)).encode("x") == [87]


def test_loads_hugging_face_file_names(tmp_path, ours, corpus):
    shutil.copy(GPT2_DIR / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(GPT2_DIR / "vocab.bpe", tmp_path / "merges.txt")
    theirs = mhsa.Tokenizer.load(tmp_path)
    assert all(theirs.encode(text) == ours.encode(text) for text in corpus[::10])


def test_concurrent_encodes_agree(ours, corpus):
    want = [ours.encode(text) for text in corpus]
    wrong = []

    def work():
        wrong.extend(text for text, ids in zip(corpus, want) if ours.encode(text) != ids)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_errors(tmp_path, ours):
    with pytest.raises(mhsa.Error, match="no such directory"):
        mhsa.Tokenizer.load(tmp_path / "absent")
    with pytest.raises(mhsa.Error, match=r"none of tokenizer.json, vocab.json, encoder.json"):
        mhsa.Tokenizer.load(tmp_path)
    (tmp_path / "vocab.json").write_text('{"a": 0,')
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(mhsa.Error, match=r"vocab '.*vocab.json': expected JSON, got parse error at line 1"):
        mhsa.Tokenizer.load(tmp_path)
    with pytest.raises(mhsa.Error, match=r"Tokenizer.decode: ids\[1\]: expected a token id in \[0, 2\^32\), got -1"):
        ours.decode([1, -1])
    with pytest.raises(mhsa.Error, match=r"ids\[0\]: expected a token id in \[0, 2\^32\), got 4294967296"):
        ours.decode_bytes([2**32])
    with pytest.raises(mhsa.Error, match=r"got 100000000000000000000"):
        ours.decode([10**20])
    with pytest.raises(mhsa.Error, match=r"ids\[1\]: expected an integer token id, got float"):
        ours.decode([1, 2.0])
    with pytest.raises(mhsa.Error, match="ids: expected a sequence of token ids, got str"):
        ours.decode("15496")
    with pytest.raises(mhsa.Error, match="Tokenizer.encode: text: expected str or bytes, got int"):
        ours.encode(15496)
    with pytest.raises(mhsa.Error, match=r"Tokenizer::token_bytes: id: expected an id in \[0, 50257\), got 50257"):
        ours.token_bytes(50257)
