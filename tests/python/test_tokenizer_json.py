"""mhsa.Tokenizer on Hugging Face tokenizer.json files against the `tokenizers` library itself.

The hub is out of reach, so the files are built here, once per session, with `tokenizers`:
small BPE vocabularies trained on Debian's license texts with each family's exact normalizer,
pre-tokenizer (the Split regexes exactly as GPT-2's, Llama 3's, Qwen2's, o200k's and DeepSeek
V3's files write them), decoder, post-processor and added tokens: GPT-2 (ByteLevel with its
regex), Llama 3 (Split + ByteLevel, ignore_merges, <|begin_of_text|> template), Qwen2 (NFC +
Split), o200k-style (\\p{Lu} \\p{M} classes), SmolLM2 (Digits, individual and contiguous, then
ByteLevel), DeepSeek-style (a Sequence of Splits, \\p{P} \\p{S}),
Llama 2 (Prepend + Replace normalizers, byte fallback, Strip decoder), Mistral/TinyLlama's newer
form (Metaspace prepend_scheme "first"), Gemma (Replace + a String Split, no prefix), plus GPT-2's
real files converted to tokenizer.json. Merges are written in the string form "a b" for some and
the pair form for the others. Each family's file is loaded by both; over the corpus
(tests/data/tokenizer_corpus.json and generated tricky strings, >= 300, special tokens inside
text among them), fresh random strings, and every code point, the ids are identical with and
without add_special_tokens, and decode (with and without skip_special_tokens, random id runs
included, which cut UTF-8 sequences) gives the same text.
"""

import json
import pathlib

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import mhsa
from test_tokenizer import random_text, assigned_code_points

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
GPT2_DIR = DATA / "gpt2-tokenizer"
LICENSES = pathlib.Path("/usr/share/common-licenses")

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])
DEEPSEEK_PATTERNS = [
    r"""\p{N}{1,3}""",
    r"""[一-龥\u3040-ゟ゠-ヿ]+""",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
SP_SPECIALS = ["<unk>", "<s>", "</s>"]


def training_text():
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(LICENSES.iterdir()) if p.is_file()]
    return texts + ["caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \u4e2d\u6587 \U0001f600 \u0420\u0443\u0441\u0441\u043a\u0438\u0439 1234567890"] * 20


def byte_level_bpe(pre_tokenizer, normalizer=None, ignore_merges=False, specials=(), vocab_size=3000):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(specials), show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    return tok


def sentencepiece_bpe(specials, vocab_size=2000):
    """A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 <0xNN> tokens, then BPE trained
    with Metaspace; the caller sets the family's own normalizer/pre-tokenizer/decoder."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  limit_alphabet=400)
    tok.train_from_iterator(training_text(), trainer)
    data = json.loads(tok.to_str())
    trained = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {t: i for i, t in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in trained:
        if t not in vocab:
            vocab[t] = len(vocab)
    data["model"]["vocab"] = vocab
    data["added_tokens"] = [dict(a, id=vocab[a["content"]]) for a in data["added_tokens"]]
    data["pre_tokenizer"] = None
    return Tokenizer.from_str(json.dumps(data))


def with_string_merges(tok):
    data = json.loads(tok.to_str())
    data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(data))


def template(tok, first):
    return processors.TemplateProcessing(single=f"{first} $A", pair=f"{first} $A {first} $B",
                                         special_tokens=[(first, tok.token_to_id(first))])


def build_families():
    fams = {}
    # GPT-2's real vocabulary, as tokenizers converts it.
    from tokenizers import ByteLevelBPETokenizer
    gpt2 = ByteLevelBPETokenizer(str(GPT2_DIR / "encoder.json"), str(GPT2_DIR / "vocab.bpe"))
    gpt2.add_special_tokens(["<|endoftext|>"])
    fams["gpt2-real"] = Tokenizer.from_str(gpt2.to_str())

    t = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), specials=["<|endoftext|>"])
    fams["gpt2"] = with_string_merges(t)
    t = byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=True), specials=["<|endoftext|>"], vocab_size=1500)
    t.add_tokens([AddedToken(" <mask>", lstrip=True), AddedToken("[X]", rstrip=True), AddedToken("word", single_word=True)])
    fams["gpt2-prefix-space"] = t

    t = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
        ignore_merges=True, specials=LLAMA3_SPECIALS)
    t.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template(t, "<|begin_of_text|>")])
    fams["llama3"] = t

    t = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]),
        normalizer=normalizers.NFC(), specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                  AddedToken("caf\u00e9!", special=False, normalized=True)])
    fams["qwen2"] = t

    fams["o200k"] = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), normalizer=normalizers.NFKC(),
        specials=["<|endoftext|>"])
    # SmolLM/SmolLM2's pre-tokenizer: every digit its own piece, then GPT-2's ByteLevel; and the
    # contiguous form (digit runs as one piece).
    fams["smollm"] = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]),
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    fams["digit-runs"] = byte_level_bpe(pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=False), pre_tokenizers.ByteLevel(add_prefix_space=False)]),
        specials=["<|endoftext|>"])
    fams["deepseek"] = byte_level_bpe(pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DEEPSEEK_PATTERNS] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), specials=["<|begin▁of▁sentence|>"])

    t = sentencepiece_bpe(SP_SPECIALS)
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.post_processor = template(t, "<s>")
    fams["llama2"] = with_string_merges(t)

    t = sentencepiece_bpe(SP_SPECIALS)
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.post_processor = template(t, "<s>")
    fams["mistral"] = t

    t = sentencepiece_bpe(SP_SPECIALS)
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    t.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    fams["metaspace-split"] = t

    t = sentencepiece_bpe(["<pad>", "<eos>", "<bos>", "<unk>"])
    t.normalizer = normalizers.Replace(" ", "\u2581")
    t.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    t.add_special_tokens(["<start_of_turn>", "<end_of_turn>"])
    t.post_processor = template(t, "<bos>")
    fams["gemma"] = t
    return fams


@pytest.fixture(scope="session")
def families(tmp_path_factory):
    out = {}
    for name, hf in build_families().items():
        d = tmp_path_factory.mktemp(name)
        hf.save(str(d / "tokenizer.json"))
        out[name] = (hf, mhsa.Tokenizer.load(d))
    return out


FAMILY_NAMES = ["gpt2-real", "gpt2", "gpt2-prefix-space", "llama3", "qwen2", "o200k", "smollm", "digit-runs",
                "deepseek", "llama2", "mistral", "metaspace-split", "gemma"]

TRICKY = [
    "", " ", "  ", "\n", "\n\n\n", " \n \n", "\t\t x", "\r\n\r\n", "a  b   c    d", "trailing   ", "   leading",
    "Hello world", "Hello, world!", "don't can't won't I'm you're we've they'll he'd", "DON'T I'M YOU'LL",
    "It\u2019s", "'s 'S 'T 'Re 'vE 'LL 'D '\u017f", "1234567890", "3.14159 2,718 1e-10 0x1F",
    "\u0661\u0662\u0663 \u0966\u0967", "x=1;y=2\nfor i in range(10):\n    print(i)\n", "def f(a, b):\n\treturn a+b  # sum\n",
    "int main() { return 0; }", "<html><body>&nbsp;</body></html>", "https://example.com/a?b=c&d=e#f",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4e2d\u6587\uff0c\u6807\u70b9\u3002", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family", "\U0001f44d\U0001f3fd\U0001f1fa\U0001f1f8",
    "\u2764\ufe0f\u200d\U0001f525", "e\u0301 a\u0308 n\u0303 \u1e9b\u0323", "\u0041\u030a \u212b \u00c5",
    "\uac00\u11a8 \u1100\u1161\u11a8", "\ufb01 \u2460 \u00bd \u2075 \u3000", "\u00a0\u2009\u202f\u2028\u2029\u0085",
    "\u0000\u0001\u001f\u007f", "\ufeffBOM", "\u200b\u200c\u200d", "Stra\u00dfe \u0130stanbul \u03a3\u03c3\u03c2",
    "\u0915\u094d\u0937 \u0e01\u0e34", "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
    "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|> ", "<|endoftext|><|endoftext|>", "<|endoftext",
    "<|begin_of_text|>Hi<|eot_id|>", "<s>hello</s>", " <s> x </s> ", "<unk>", "<0x41><0xE4>", "<start_of_turn>user\nhi<end_of_turn>",
    "<|im_start|>system\nYou are<|im_end|>\n", "<tool_call>{\"a\": 1}</tool_call>", "caf\u00e9! cafe\u0301!",
    "x <mask> y", "x  <mask>y", "[X]   z", "word words sword word_ word1 (word)", "\u2581leading meta \u2581\u2581",
    "\u2581", "!!!???...", "\"quoted\" 'single'", "a/b/c\\d", "tabs\tand\nnewlines\r\n", "     \n     ",
    "\U0010ffff\U000e0001", "\ue000 private", "\U0001d400\U0001d41a math", "\u3042\u3044\u3046 \u30ab\u30bf\u30ab\u30ca",
]


def tricky_strings():
    base = json.loads((DATA / "tokenizer_corpus.json").read_text(encoding="utf-8"))
    extra = [a + b for a in TRICKY[:40] for b in (" ", "\n", "x", "1", "\u0301", "<s>")]
    return base + TRICKY + extra


@pytest.fixture(scope="session")
def corpus():
    return tricky_strings()


def test_corpus_is_substantial(corpus):
    assert len(corpus) >= 300
    assert any("<|endoftext|>" in s for s in corpus) and any("\u200d" in s for s in corpus)


def differences(hf, ours, texts, add_special):
    bad = []
    for text, enc in zip(texts, hf.encode_batch(texts, add_special_tokens=add_special)):
        if ours.encode(text, add_special_tokens=add_special) != enc.ids:
            bad.append(text)
    return bad


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_corpus_encodes_as_tokenizers(families, corpus, name):
    hf, ours = families[name]
    for add in (True, False):
        bad = differences(hf, ours, corpus, add)
        assert not bad, f"{name}: {len(bad)} of {len(corpus)} differ (add_special_tokens={add}), first {bad[0]!r}: " \
                        f"{hf.encode(bad[0], add_special_tokens=add).ids} vs {ours.encode(bad[0], add_special_tokens=add)}"


# tokenizers' NFC/NFKC tables are older than Unicode 16 (its unicode-normalization-alignments
# crate: about Unicode 12, with older combining classes); mhsa's are Unicode 16's.
NORMALIZING = {"qwen2": "NFC", "o200k": "NFKC"}


def same_normalization(hf, ours, texts, form):
    """The texts that tokenizers' normalizer and mhsa's (seen through a byte-level round trip)
    normalize alike."""
    hf_norm = getattr(normalizers, form)()
    return [t for t in texts if hf_norm.normalize_str(t) == ours.decode(ours.encode(t, add_special_tokens=False))]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_random_strings_encode_and_decode_as_tokenizers(families, rng, name):
    hf, ours = families[name]
    cps = assigned_code_points()
    texts = [random_text(rng, cps) for _ in range(150)]
    if name in NORMALIZING:  # strings with characters newer than tokenizers' normalisation tables
        same = same_normalization(hf, ours, texts, NORMALIZING[name])
        assert len(texts) - len(same) <= 15, f"{name}: {len(texts) - len(same)} of {len(texts)} normalize differently"
        texts = same
    bad = differences(hf, ours, texts, True)
    assert not bad, f"{name}: {len(bad)} differ, first {bad[0]!r}"
    for enc in hf.encode_batch(texts):
        for skip in (False, True):
            assert ours.decode(enc.ids, skip_special_tokens=skip) == hf.decode(enc.ids, skip_special_tokens=skip)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_random_ids_decode_as_tokenizers(families, rng, name):
    hf, ours = families[name]
    n = hf.get_vocab_size(with_added_tokens=True)
    runs = [[int(i)] for i in rng.integers(0, n, 300)]
    runs += [[int(i) for i in rng.integers(0, n, int(rng.integers(1, 20)))] for _ in range(300)]
    # Ids past the vocabulary (up to tokenizers' u32 limit) among them: tokenizers leaves them out.
    runs += [[int(i) if rng.random() < 0.7 else int(rng.integers(n, 2**32)) for i in rng.integers(0, n, int(rng.integers(1, 20)))]
             for _ in range(200)]
    for ids in runs:
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), (ids, skip)
    for bad in ([1, -1], [2**32]):  # outside u32: both refuse
        with pytest.raises(OverflowError):
            hf.decode(bad)
        with pytest.raises(mhsa.Error, match=r"expected a token id in \[0, 2\^32\)"):
            ours.decode(bad)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_long_texts_encode_as_tokenizers(families, corpus, rng, name):
    """Texts of kilobytes, as the speed benchmark encodes them: a model without a pre-tokenizer
    sees each one as a single piece, which mhsa cuts into words where no merge can cross
    (HfTokenizer::model); words repeat, so the cache answers most of them. Slices of English
    text, and corpus and random strings run together."""
    hf, ours = families[name]
    english = "\n".join(training_text()[:-20])
    cps = assigned_code_points()
    texts = []
    for _ in range(6):
        at = int(rng.integers(len(english) - 8000))
        texts.append(english[at:at + int(rng.integers(1000, 8000))])
    for _ in range(6):
        parts = [corpus[int(i)] for i in rng.integers(len(corpus), size=40)] + [random_text(rng, cps) for _ in range(5)]
        rng.shuffle(parts)
        texts.append("".join(p + [" ", "", "\n", "  "][int(rng.integers(4))] for p in parts))
    if name in NORMALIZING:
        texts = same_normalization(hf, ours, texts, NORMALIZING[name])
    bad = differences(hf, ours, texts, False)
    assert not bad, f"{name}: {len(bad)} of {len(texts)} long texts differ, first {bad[0][:200]!r}"


# Every code point for a byte-level regex family (Llama 3) and a SentencePiece one (Llama 2); a
# fresh quarter of them for the normalizing ones, a sixteenth for the rest (tokenizers itself
# takes ~15 s a family over all of them).
CODE_POINT_STRIDE = {"llama3": 1, "llama2": 1, "qwen2": 4, "o200k": 4}


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_code_point_encodes_as_tokenizers(families, rng, name):
    """Each code point before a space, 4096 to a string. tokenizers' NFC/NFKC use older tables
    than mhsa's Unicode 16 (its unicode-normalization-alignments crate, about Unicode 12 with
    older combining classes): blocks where the two normalized texts differ are left out, and
    there must be few of them."""
    hf, ours = families[name]
    stride = CODE_POINT_STRIDE.get(name, 16)
    cps = assigned_code_points()[1][int(rng.integers(stride))::stride]
    texts = ["".join(f"{chr(c)} " for c in cps[i:i + 4096]) for i in range(0, len(cps), 4096)]
    if name in NORMALIZING:
        same = same_normalization(hf, ours, texts, NORMALIZING[name])
        assert len(texts) - len(same) <= 12 // stride + 2, f"{name}: normalization differs in {len(texts) - len(same)} blocks"
        texts = same
    bad = [t for t, e in zip(texts, hf.encode_batch_fast(texts, add_special_tokens=False))
           if ours.encode(t, add_special_tokens=False) != e.ids]
    assert not bad, f"{name}: {len(bad)} of {len(texts)} blocks differ, first at U+{ord(bad[0][0]):04X}"


def test_special_tokens_and_configs(families, tmp_path):
    hf, _ = families["llama3"]
    hf.save(str(tmp_path / "tokenizer.json"))
    bos, eot = hf.token_to_id("<|begin_of_text|>"), hf.token_to_id("<|eot_id|>")
    end = hf.token_to_id("<|end_of_text|>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}, "chat_template": "{{ messages }}"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [end, eot]}))
    t = mhsa.Tokenizer.load(tmp_path)
    assert t.bos_token_id == bos and t.eos_token_ids == [eot, end]
    assert t.chat_template == "{{ messages }}" and t.bos_token == "<|begin_of_text|>" and t.eos_token == "<|eot_id|>"
    assert t.special_tokens["<|eot_id|>"] == eot and t.is_special(eot)
    assert t.encode("hi")[0] == bos and t.encode("hi", add_special_tokens=False)[0] != bos
    # allow_special=False: a special token's text is ordinary text.
    assert eot in t.encode("a<|eot_id|>b") and eot not in t.encode("a<|eot_id|>b", allow_special=False)
    assert t.decode(t.encode("a<|eot_id|>b"), skip_special_tokens=True) == "ab"


def edit(families, name, tmp_path, change):
    data = json.loads(families[name][0].to_str())
    change(data)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("change, message", [
    (lambda d: d["model"].update(type="WordPiece"), "model: expected a model of a supported type (BPE), got 'WordPiece'"),
    (lambda d: d["model"].update(type="Unigram"), "got 'Unigram'"),
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer: expected a normalizer of a supported type"),
    (lambda d: d.update(normalizer={"type": "BertNormalizer"}), "got 'BertNormalizer'"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer: expected a pre-tokenizer of a supported type"),
    (lambda d: d.update(decoder={"type": "WordPiece"}), "decoder: expected a decoder of a supported type"),
    (lambda d: d.update(post_processor={"type": "BertProcessing"}), "got 'BertProcessing'"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"(?<=a)b"), "unsupported construct lookbehind"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\w+"), "unsupported construct escape \\w"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"^a"), "unsupported construct anchor ^"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\p{Greek}"), "property \\p{Greek}"),
    (lambda d: d["model"]["vocab"].update({"x-dup": 5}), "expected a unique id"),
    (lambda d: d["model"]["vocab"].update({"x-big": 1 << 30}), "expected an id below"),
    (lambda d: d["model"]["vocab"].update({"x-neg": -1}), "expected an integer in [0,"),
    (lambda d: d["model"]["merges"].append(["zzz-no", "a"]), "is not in the vocab"),
    (lambda d: d["model"]["merges"].append(d["model"]["merges"][0]), "expected each merge once"),
    (lambda d: d["added_tokens"].append(dict(d["added_tokens"][0], content="other")), "added_tokens[5].id: expected a unique id"),
    (lambda d: d.update(truncation={"max_length": 5}), "truncation: expected null"),
    (lambda d: d["model"].update(dropout=0.1), "dropout: expected null"),
])
def test_unsupported_or_malformed_files_are_refused(families, tmp_path, change, message):
    d = edit(families, "llama3", tmp_path, change)
    with pytest.raises(mhsa.Error, match=None) as e:
        mhsa.Tokenizer.load(d)
    assert message in str(e.value)


def test_gpt2_directory_still_prefers_its_own_files_when_no_tokenizer_json():
    t = mhsa.Tokenizer.load(GPT2_DIR)
    assert t.encode("Hello world") == [15496, 995] and t.eos_token_ids == [50256]
