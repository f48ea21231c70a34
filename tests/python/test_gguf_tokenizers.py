"""GGUF tokenizers (tokenizer.ggml.*) encode as llama.cpp does.

- llama.cpp's own vocabulary test files (models/ggml-vocab-NAME.gguf with .inp strings and the .out
  ids llama.cpp's tests/test-tokenizer-0 checks: common_tokenize(text, add_special=false,
  parse_special=false), ids made by the model's Hugging Face tokenizer): every string gives exactly
  those ids, and decodes back to itself. scripts/setup.sh --test (scripts/fetch_llama_vocab.sh)
  puts the files in ~/.cache/mhsa/llama-vocab; MHSA_LLAMA_VOCAB names another directory. Without
  them these tests skip, saying so.
- A SentencePiece BPE model with byte fallback trained by the `sentencepiece` package and written as
  llama.cpp's converter writes one (tokens, scores, token types, BOS/EOS/UNK): random prompts
  (Unicode, runs of spaces, newlines, digits) encode to sentencepiece's own ids after BOS, and the
  GGUF model runs in `mhsa generate`, mhsa.Model and a ChatSession.
- Hostile tokenizer metadata gives mhsa.Error naming the key, never a crash.
Random prompts each run; MHSA_TEST_SEED reproduces one."""

import json
import os
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
import transformers

import mhsa
from test_gguf import LLAMA, save, write_llama_cpp_file

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mhsa" / "llama-vocab"
VOCAB_DIR = Path(os.environ.get("MHSA_LLAMA_VOCAB") or CACHE)
# The vocabularies scripts/fetch_llama_vocab.sh extracts: SentencePiece (llama-spm, phi-3),
# byte-level BPE behind each kind of pre-tokenizer mhsa reads, and Gemma 4's BPE of characters.
VOCABS = ["llama-spm", "phi-3", "llama-bpe", "qwen2", "qwen35", "gpt-2", "starcoder", "refact", "falcon",
          "deepseek-coder", "mpt", "deepseek-llm", "command-r", "gemma-4"]


def vocab_tests(name):
    """llama.cpp's test-tokenizer-0 reading of NAME.gguf.inp / .out: [(text, ids)]."""
    path = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    if not path.exists():
        pytest.skip(f"{path} absent: run scripts/setup.sh --test (or scripts/fetch_llama_vocab.sh), "
                    "or set MHSA_LLAMA_VOCAB to a directory with llama.cpp's ggml-vocab-*.gguf files")
    raw = Path(str(path) + ".inp").read_bytes().decode("utf-8")
    sep, texts, pos = "\n__ggml_vocab_test__\n", [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(sep)
    lines = Path(str(path) + ".out").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(texts) > 10
    return path, [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_vocab_files(name):
    path, tests = vocab_tests(name)
    tok = mhsa.Tokenizer.load(path)
    for text, want in tests:
        got = tok.encode(text, add_special_tokens=False, allow_special=False)
        assert got == want, (name, text)
        assert tok.decode(got) == text, (name, text)


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe"])
def test_llama_cpp_vocab_files_through_the_cli_with_bos(name):
    """`mhsa tokenize FILE.gguf` encodes as the Python module does, with BOS where llama.cpp adds it:
    llama-spm's metadata asks for it (add_bos_token), llama-bpe gets llama.cpp's Llama 3 default."""
    path, tests = vocab_tests(name)
    meta = mhsa.read_gguf(path, load=False)["metadata"]
    bos = meta["tokenizer.ggml.bos_token_id"]
    for text, want in tests[8:13]:  # a few: each run loads the vocabulary (llama-bpe: ~2 s)
        r = subprocess.run([str(CLI), "tokenize", "--model", str(path), "--json", "--", text],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["ids"] == [bos] + want, text
        r = subprocess.run([str(CLI), "tokenize", "--model", str(path), "--no-special-tokens", "--", text],
                           capture_output=True, text=True, timeout=120)
        assert r.stdout.split() == [str(i) for i in want], text


# ---- a SentencePiece model of our own, against the sentencepiece package ---------------------

CHARS = list("abcdefghijklmnopqrstuvwxyz") + list("ABCDE0123456789") + [" "] * 12 + ["\n", "\t", ".", ",", "!"] + \
    list("éüßçñ中文字日本語кирилица") + ["🦙", "∑", "\u00a0", "ŋ"]


def random_text(rng, n):
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "12", "345", "中文",
             "кирилица", "naïve", "  ", "\n", "über"]
    parts = []
    for _ in range(n):
        if rng.random() < 0.6:
            parts.append(str(rng.choice(words)))
        else:
            parts.append("".join(str(rng.choice(CHARS)) for _ in range(int(rng.integers(1, 6)))))
        parts.append(str(rng.choice([" ", " ", " ", "", "  ", "\n"])))
    return "".join(parts)


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """A SentencePiece BPE model as Llama 2's is trained (identity normalisation, spaces kept,
    digits split, byte fallback, a dummy prefix), and the GGUF file of a tiny random Llama that
    carries it as llama.cpp's converter writes it (SentencePieceProcessor's pieces, scores and
    kinds)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    d = tmp_path_factory.mktemp("spm")
    rng = np.random.default_rng(11)
    (d / "corpus.txt").write_text("\n".join(random_text(rng, 30) for _ in range(300)), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(d / "corpus.txt"), model_prefix=str(d / "sp"), model_type="bpe", vocab_size=600,
        byte_fallback=True, character_coverage=0.9995, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, add_dummy_prefix=True,
        allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(d / "sp.model"))
    n = sp.get_piece_size()
    tokens, scores, types = [], [], []
    for i in range(n):  # convert_hf_to_gguf.py's _create_vocab_sentencepiece
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(gguf.TokenType.UNKNOWN if sp.is_unknown(i) else gguf.TokenType.CONTROL if sp.is_control(i)
                     else gguf.TokenType.UNUSED if sp.is_unused(i) else gguf.TokenType.BYTE if sp.is_byte(i)
                     else gguf.TokenType.NORMAL)
    state = save((LLAMA[0], {**LLAMA[1], "vocab_size": n, "bos_token_id": 1, "eos_token_id": 2}, LLAMA[2]), d / "hf")
    cfg = transformers.AutoConfig.from_pretrained(d / "hf")
    template = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}"
                "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")

    def vocab(w):
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(True)
        w.add_chat_template(template)
    write_llama_cpp_file(d / "m.gguf", state, cfg, metadata=vocab)
    return sp, d / "m.gguf"


def test_sentencepiece_gguf_encodes_as_sentencepiece(spm, rng):
    sp, path = spm
    tok = mhsa.Tokenizer.load(path)
    assert tok.bos_token_id == 1 and tok.eos_token_ids == [2] and tok.bos_token == "<s>"
    prompts = [random_text(rng, int(rng.integers(1, 40))) for _ in range(200)]
    prompts += ["", " ", "  x", "\n", "x\n\ny", "a" * 300, " ".join(["hello"] * 50), "🦙🦙 ∑ 中文字"]
    for p in prompts:
        want = sp.encode(p)
        assert tok.encode(p) == [1] + want, p
        assert tok.encode(p, add_special_tokens=False) == want, p
        assert tok.decode([1] + want, skip_special_tokens=True) == sp.decode(want) == p, p
    # A long prompt (cut into words for the cache) as a whole.
    long = "".join(prompts)
    assert tok.encode(long, add_special_tokens=False) == sp.encode(long)


def test_sentencepiece_gguf_model_runs(spm, rng):
    sp, path = spm
    prompt = random_text(rng, 5)
    r = subprocess.run([str(CLI), "generate", "-t", "1", "--model", str(path), "--prompt", prompt, "-n", "4", "--json",
                        "--ignore-eos", "--temperature", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_ids"] == [1] + sp.encode(prompt)
    assert len(out["tokens"]) == 4
    model, tok = mhsa.Model.load(path), mhsa.Tokenizer.load(path)
    ids = np.array([tok.encode(prompt)])
    seq = model.generate(ids, max_new_tokens=4, stop_at_eos=False)
    assert seq.shape == (1, ids.shape[1] + 4) and seq[0, -4:].tolist() == out["tokens"]
    chat = mhsa.ChatSession(model, tok, max_new_tokens=3)
    assert isinstance(chat.send("hello world"), str)


# ---- hostile metadata ------------------------------------------------------------------------

def vocab_file(path, model="llama", tokens=None, scores=None, types=None, extra=None):
    """A vocabulary-only GGUF file (as llama.cpp's vocab test files are) with the given arrays."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab"] if tokens is None else tokens
    n = len(tokens) if tokens is not False else 8
    if tokens is not False:
        w.add_token_list(tokens)
    if scores is not False:
        w.add_token_scores([-float(i) for i in range(n)] if scores is None else scores)
    if types is not False:
        w.add_token_types([2, 3, 3] + [1] * (n - 3) if types is None else types)
    if extra:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_small_sentencepiece_vocab_file(tmp_path):
    tok = mhsa.Tokenizer.load(vocab_file(tmp_path / "v.gguf"))
    assert tok.encode("ab a", add_special_tokens=False) == [6, 5, 6]  # ▁a b ▁a: "▁ab" is no token
    assert tok.encode("xa", add_special_tokens=False) == [3, 0, 4]  # x: no byte tokens, so <unk>
    assert tok.decode([1, 6, 5, 6], skip_special_tokens=True) == "ab a"


def test_a_small_gemma4_vocab_file(tmp_path):
    """llama.cpp's "gemma4": spaces as "▁", merges by rank within a line or a run of newlines (a run
    that is a token is that token, merges or not), <0xNN> for characters without a token, BOS
    always; <|tool_response>, user-defined in the file, is a control token as llama.cpp makes it."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["▁", "a", "b", "▁a", "ab", "\n", "\n\n", "<|tool_response>"]
    types = [3, 3, 3, 2] + [6] * 256 + [1] * 7 + [4]

    def extra(w):
        w.add_token_merges(["▁ a", "a b"])
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_add_bos_token(False)
    tok = mhsa.Tokenizer.load(vocab_file(tmp_path / "g.gguf", model="gemma4", tokens=tokens, scores=False,
                                         types=types, extra=extra))
    text = "ab a\n\n\nb\U0001F600"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [264, 263, 265, 265, 265, 262] + [4 + b for b in "\U0001F600".encode()]
    assert tok.decode(ids) == text
    assert tok.encode("\n\n", add_special_tokens=True) == [2, 266]
    assert tok.encode("<|tool_response>", add_special_tokens=False, allow_special=True) == [267]
    assert 267 not in tok.encode("<|tool_response>", add_special_tokens=False, allow_special=False)


@pytest.mark.parametrize("case, key, words", [
    (dict(scores=[0.5, 1.0]), "'tokenizer.ggml.scores'", "one score per token"),
    (dict(types=[1, 1, 1]), "'tokenizer.ggml.token_type'", "one type per token"),
    (dict(types=[1, 9, 1, 1, 1, 1, 1, 1]), "'tokenizer.ggml.token_type'", "token type 0..6"),
    (dict(scores=False), "'tokenizer.ggml.scores'", "SentencePiece's piece scores"),
    (dict(scores=[0.0] * 7 + [float("nan")]), "'tokenizer.ggml.scores'", "NaN"),
    (dict(tokens=[]), "'tokenizer.ggml.tokens'", "non-empty"),
    (dict(tokens=False), "'tokenizer.ggml.tokens'", "non-empty"),
    (dict(tokens=["<unk>", "<s>", "</s>", "a", "a"]), "'tokenizer.ggml.tokens'", "each token once"),
    (dict(types=[2, 3, 3, 6, 1, 1, 1, 1]), "'tokenizer.ggml.tokens'", "<0xNN>"),
    (dict(extra=lambda w: w.add_bos_token_id(99)), "'tokenizer.ggml.bos_token_id'", "below 8"),
    (dict(extra=lambda w: w.add_unk_token_id(8)), "'tokenizer.ggml.unknown_token_id'", "below 8"),
    (dict(scores=False, extra=lambda w: w.add_string("'tokenizer.ggml.scores'", "x")), "'tokenizer.ggml.scores'", "float32"),
    (dict(model="bert"), "'tokenizer.ggml.model'", "'bert'"),
    (dict(model="gpt2", extra=lambda w: w.add_tokenizer_pre("deepseek-v3")), "'tokenizer.ggml.pre'", "llama-bpe"),
    (dict(model="gemma4", extra=lambda w: w.add_token_merges(["a b"])), "'tokenizer.ggml.tokens'", "none for <0x00>"),
    (dict(model="gpt2", extra=lambda w: w.add_tokenizer_pre("qwen2")), "'tokenizer.ggml.merges'", "none"),
    (dict(model="gpt2", extra=lambda w: (w.add_tokenizer_pre("qwen2"), w.add_token_merges(["a b", "ab x"]))),
     "'tokenizer.ggml.merges'[1]", "concatenation is a token"),
    (dict(model="gpt2", extra=lambda w: (w.add_tokenizer_pre("qwen2"), w.add_token_merges(["ab"]))),
     "'tokenizer.ggml.merges'[0]", "two tokens"),
    # GPT-2's own vocabulary (read as a tokenizer.json's) with a token of raw bytes: found by the fuzzer,
    # it escaped as a JSON library exception instead of an error naming the token.
    (dict(model="gpt2", tokens=["a", "b", b"\xfd\x80", "ab"], scores=False, types=False,
          extra=lambda w: (w.add_tokenizer_pre("gpt-2"), w.add_token_merges(["a b"]))),
     "'tokenizer.ggml.tokens'", "invalid UTF-8 in token 2"),
])
def test_hostile_tokenizer_metadata_is_refused(tmp_path, case, key, words):
    path = vocab_file(tmp_path / "v.gguf", **case)
    with pytest.raises(mhsa.Error) as e:
        mhsa.Tokenizer.load(path)
    assert key in str(e.value) and words in str(e.value), str(e.value)
    r = subprocess.run([str(CLI), "tokenize", "--model", str(path), "x"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and key in r.stderr, r.stderr


# ---- mhsa quantize writes a tokenizer.json that reads back the same ----------------------------

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.mark.parametrize("style, pre", [("gpt2", "gpt-2"), ("llama3", "llama-bpe"), ("qwen2", "qwen2"),
                                        ("smollm", "smollm")])
def test_quantized_tokenizer_json_reads_back_the_same(style, pre, rng, tmp_path):
    """A Llama directory's byte-level tokenizer.json (trained by `tokenizers` with GPT-2's, Llama 3's
    (ignore_merges), Qwen2's or SmolLM's (Digits then ByteLevel) pre-tokenizer, BOS added by its post-processor, special and
    non-special added tokens) quantized to GGUF: tokenizer.ggml.pre names it as llama.cpp does, and
    the GGUF file's tokenizer encodes random prompts, special tokens included, as the directory's."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=style in ("gpt2", "smollm"))
    split = {"llama3": LLAMA3_SPLIT, "qwen2": LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")}.get(style)
    tok.pre_tokenizer = (byte_level if style == "gpt2" else
                         pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if style == "smollm" else
                         pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), "isolated"), byte_level]))
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|begin|>", "<|end|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([random_text(np.random.default_rng(3), 40) for _ in range(100)], trainer)
    tok.add_tokens(["<note>"])
    tok.post_processor = processors.TemplateProcessing(single="<|begin|> $A", special_tokens=[("<|begin|>", 0)])
    d = tmp_path / "hf"
    save((LLAMA[0], {**LLAMA[1], "vocab_size": tok.get_vocab_size(), "bos_token_id": 0, "eos_token_id": 1}, LLAMA[2]), d)
    tok.save(str(d / "tokenizer.json"))
    out = tmp_path / "m.gguf"
    r = subprocess.run([str(CLI), "quantize", "--model", str(d), "--to", "f32", "--out", str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    meta = mhsa.read_gguf(out, load=False)["metadata"]
    assert meta["tokenizer.ggml.pre"] == pre and meta["tokenizer.ggml.add_bos_token"] is True
    a, b = mhsa.Tokenizer.load(d), mhsa.Tokenizer.load(out)
    for _ in range(100):
        p = random_text(rng, int(rng.integers(1, 30))) + str(rng.choice(["", "<|end|>", " <note> x", "<|begin|>"]))
        assert b.encode(p) == a.encode(p), p
        assert b.decode(b.encode(p)) == a.decode(a.encode(p)), p
