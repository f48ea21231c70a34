"""`mhsa generate` and `mhsa tokenize` on a Llama directory with a tokenizer.json: a tiny random
LlamaForCausalLM saved by transformers and a byte-level BPE tokenizer.json (BOS added by its
post-processor, as Llama 3's) trained with `tokenizers`. The prompt's ids must equal transformers'
tokenizer(prompt) (BOS included), greedy tokens transformers' generate, and tokenize/--decode the
tokenizer's own encode/decode. Random prompts each run; MHSA_TEST_SEED reproduces one."""

import json
import os
import random
import secrets
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("MHSA_CLI", ROOT / "build" / "mhsa"))
WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".", " Hello", " world", "!",
         " é", " 中文", " 42", "\n", "  ", " <|end_of_text|>"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    d = tmp_path_factory.mktemp("llama-tokenizer-json")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=333, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["".join(WORDS[:-1])] * 20, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 0)])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "tokenizer_class": "PreTrainedTokenizerFast"}))
    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128, bos_token_id=0, eos_token_id=1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a livelier random model: varied tokens rather than one repeated
        model.model.embed_tokens.weight.mul_(20.0)
    model.save_pretrained(d, safe_serialization=True)
    return d, model, transformers.AutoTokenizer.from_pretrained(str(d))


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("MHSA_TEST_SEED") or secrets.randbits(32))
    request.node.user_properties.append(("MHSA_TEST_SEED", seed))
    return random.Random(seed)


def run(*args):
    r = subprocess.run([str(CLI), *map(str, args)], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def prompt(rng):
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))


def test_generate_matches_transformers(llama_dir, rng):
    d, model, hf = llama_dir
    for _ in range(2):
        p = prompt(rng)
        j = json.loads(run("generate", "--model", d, "--prompt", p, "-n", 20, "--json", "--ignore-eos"))
        ids = hf(p)["input_ids"]
        assert ids[0] == 0 and j["prompt_ids"] == ids, p
        out = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                             pad_token_id=1, attention_mask=torch.ones((1, len(ids)), dtype=torch.long))
        assert j["tokens"] == out[0, len(ids):].tolist(), p
        assert j["text"] == hf.decode(j["tokens"])


def test_tokenize_matches_the_tokenizer(llama_dir, rng):
    d, _, hf = llama_dir
    for _ in range(3):
        p = prompt(rng)
        assert run("tokenize", "--model", d, p).decode().split() == [str(i) for i in hf(p)["input_ids"]], p
        plain = hf(p, add_special_tokens=False)["input_ids"]
        assert run("tokenize", "--model", d, "--no-special-tokens", p).decode().split() == [str(i) for i in plain]
        j = json.loads(run("tokenize", "--model", d, "--json", p))
        assert j["tokens"] == hf.convert_ids_to_tokens(j["ids"])
        ids = [rng.randrange(hf.vocab_size) for _ in range(rng.randint(1, 12))]
        assert run("tokenize", "--model", d, "--decode", " ".join(map(str, ids))).decode() == hf.decode(ids)
