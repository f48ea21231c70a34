"""A tiny chat model directory for tests, written by the real libraries: a byte-level BPE
tokenizer.json trained by `tokenizers` with ChatML's special tokens, a tokenizer_config.json with
the ChatML template, and a random Qwen2ForCausalLM saved by transformers (its embedding may be
padded past the tokenizer's ids, as Qwen2.5's is). Used by test_chat_session.py and
test_cli_padded_vocab.py."""

import json
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]
CHATML = (ROOT / "tests" / "data" / "chat_templates" / "chatml.jinja").read_text()
WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".", " Hello", " world", "!",
         " é", " 中文", " 42"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_chat_dir(d, tokens, padding, max_positions, seed, edit):
    """Writes the directory d: a tokenizer of `tokens` ids, a model of tokens + padding rows;
    edit(model, tok) adjusts the weights (under no_grad) before saving. Returns (model, tok)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=tokens, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["".join(WORDS)] * 20 + ["user assistant system"] * 5, trainer)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(vocab_size=tok.get_vocab_size() + padding, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=max_positions, eos_token_id=tok.token_to_id("<|im_end|>"),
                                   tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20.0)  # a livelier random model: varied tokens
        edit(model, tok)
    model.save_pretrained(d, safe_serialization=True)
    return model, tok


def hf_tokenizer(d):
    """The tokenizer.json as written (transformers 5's AutoTokenizer would build a Qwen2Tokenizer with
    Qwen's own pre-tokenizer for a qwen2 config, not this file's)."""
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(d))
