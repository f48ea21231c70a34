"""mhsa.Tokenizer.apply_chat_template against transformers' on the same directory.

A byte-level BPE tokenizer.json trained with `tokenizers` (with the templates' special tokens) and a
tokenizer_config.json holding a template of tests/data/chat_templates, loaded by mhsa.Tokenizer and by
transformers' AutoTokenizer: the rendered string and the ids (tokenize=True) must be equal for
conversations with random contents, with and without a system message and the generation prompt.
Also: the special tokens the config sets (unk, pad, any "*_token") reach the template and caller
keywords override them; named templates pick "default" or "tool_use"; chat_template.jinja replaces
the config's; a tokenizer without a template is a clear error; continue_final_message and
chat_template= (a name or a source) as transformers has them.
"""

import json
import os
import random
import secrets

import pytest

import mhsa

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from test_chat_template import TEMPLATES, TOOLS, conversations, text  # noqa: E402

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<bos>", "<start_of_turn>", "<end_of_turn>",
            "<image>"]


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("MHSA_TEST_SEED") or secrets.randbits(32))
    request.node.user_properties.append(("MHSA_TEST_SEED", seed))
    return random.Random(seed)


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A byte-level BPE tokenizer.json (as Llama 3's / Qwen2's) trained on the templates' own text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = [p.read_text() for p in TEMPLATES.glob("*.jinja")] + ["Hello world, the weather in Paris é 中文 🙂"] * 5
    tok.train_from_iterator(text, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path.read_text()


def make_dir(tmp_path, tokenizer_json, chat_template, **config):
    (tmp_path / "tokenizer.json").write_text(tokenizer_json)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "pad_token": "<pad>", **config}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tmp_path


def both(path, messages, **kwargs):
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    ours = mhsa.Tokenizer.load(path)
    try:
        ref_text = hf.apply_chat_template(messages, tokenize=False, **kwargs)
        ref_ids = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    except Exception as e:  # raise_exception in the template
        with pytest.raises(mhsa.Error):
            ours.apply_chat_template(messages, **kwargs)
        return None
    assert ours.apply_chat_template(messages, **kwargs) == ref_text
    assert ours.apply_chat_template(messages, tokenize=True, **kwargs) == list(ref_ids)
    return ref_text


@pytest.mark.parametrize("name", ["chatml", "llama3.1", "mistral-v0.3", "gemma2", "qwen2.5"])
def test_template_strings_and_ids_match_transformers(tmp_path, tokenizer_json, rng, name):
    path = make_dir(tmp_path, tokenizer_json, (TEMPLATES / f"{name}.jinja").read_text())
    rendered = 0
    for what, messages, variables in conversations(rng):
        for gen in (False, True):
            if both(path, messages, add_generation_prompt=gen, **variables) is not None:
                rendered += 1
    assert rendered >= 8


def test_config_tokens_reach_the_template_and_keywords_override(tmp_path, tokenizer_json, rng):
    source = ("{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}|{{ image_token }}|{{ sep_token }}|"
              "{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}"
              "{% if add_generation_prompt %}assistant:{% endif %}")
    path = make_dir(tmp_path, tokenizer_json, source, image_token="<image>",
                    pad_token={"content": "<pad>", "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": True, "__type": "AddedToken"})
    content = "".join(rng.choice("ab é<>") for _ in range(rng.randint(1, 12)))
    messages = [{"role": "user", "content": content}]
    text = both(path, messages, add_generation_prompt=True)
    assert text.startswith("<s>|</s>|<unk>|<pad>|<image>||user:")
    assert both(path, messages, eos_token="<|eot_id|>", image_token=content).startswith(f"<s>|<|eot_id|>|<unk>|<pad>|{content}|")


def test_named_templates_pick_default_or_tool_use(tmp_path, tokenizer_json):
    named = [{"name": "default", "template": "D{% for m in messages %}{{ m.content }}{% endfor %}"},
             {"name": "tool_use", "template": "T{{ tools | length }}{% for m in messages %}{{ m.content }}{% endfor %}"}]
    path = make_dir(tmp_path, tokenizer_json, named)
    messages = [{"role": "user", "content": "hi"}]
    assert both(path, messages) == "Dhi"
    assert both(path, messages, tools=TOOLS) == "T1hi"
    assert mhsa.Tokenizer.load(path).chat_template == named[0]["template"]
    make_dir(tmp_path, tokenizer_json, named[1:])
    with pytest.raises(mhsa.Error, match='expected a template named "default"'):
        mhsa.Tokenizer.load(path).apply_chat_template(messages)
    assert mhsa.Tokenizer.load(path).apply_chat_template(messages, tools=TOOLS) == "T1hi"


def test_chat_template_jinja_file_replaces_the_config(tmp_path, tokenizer_json):
    path = make_dir(tmp_path, tokenizer_json, "config {{ messages | length }}")
    (path / "chat_template.jinja").write_text("file {{ messages[0].content }}{{ eos_token }}")
    assert both(path, [{"role": "user", "content": "x y"}]) == "file x y</s>"
    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "tool_use.jinja").write_text("tools {{ tools[0].type }}")
    assert both(path, [{"role": "user", "content": "x y"}]) == "file x y</s>"
    assert both(path, [{"role": "user", "content": "x y"}], tools=TOOLS) == "tools function"


def test_no_template_is_a_clear_error(tmp_path, tokenizer_json):
    path = make_dir(tmp_path, tokenizer_json, None)
    with pytest.raises(mhsa.Error, match=r"^Tokenizer::apply_chat_template: tokenizer: expected a chat_template"):
        mhsa.Tokenizer.load(path).apply_chat_template([{"role": "user", "content": "hi"}])
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    (gpt2 / "vocab.json").write_text(json.dumps({**{c: i for i, c in enumerate(alphabet)}, "<|endoftext|>": 256}))
    (gpt2 / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(mhsa.Error, match="no chat template"):
        mhsa.Tokenizer.load(gpt2).apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("name", ["chatml", "llama3.1", "mistral-v0.3", "gemma2", "qwen2.5", "smollm2"])
def test_continue_final_message_matches_transformers(tmp_path, tokenizer_json, rng, name):
    """A prefilled assistant answer left open: the prompt ends with its text (trailing spaces that the
    template trims are trimmed) — transformers' continue_final_message, cut for cut."""
    path = make_dir(tmp_path, tokenizer_json, (TEMPLATES / f"{name}.jinja").read_text())
    rendered = 0
    for tail in ("", " ", "\n", "  \t"):
        prefill = "Sure" + text(rng) + "x" + tail  # never blank: transformers needs the text to find
        for messages in ([{"role": "user", "content": text(rng)}, {"role": "assistant", "content": prefill}],
                         [{"role": "system", "content": text(rng)}, {"role": "user", "content": text(rng)},
                          {"role": "assistant", "content": prefill}]):
            out = both(path, messages, continue_final_message=True)
            if out is not None:
                assert out.rstrip().endswith(prefill.strip())
                rendered += 1
    assert rendered >= 4
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]
    with pytest.raises(mhsa.Error, match="continue_final_message: expected add_generation_prompt false"):
        mhsa.Tokenizer.load(path).apply_chat_template(messages, add_generation_prompt=True,
                                                      continue_final_message=True)


def test_continue_final_message_blocks_fields_and_errors(tmp_path, tokenizer_json, rng):
    source = ("{% for m in messages %}<{{ m.role }}>"
              "{% if m.reasoning_content %}[think]{{ m.reasoning_content }}[/think]{% endif %}"
              "{% if m.content is string %}{{ m.content | trim }}{% else %}"
              "{% for b in m.content %}{{ b.text }}|{% endfor %}{% endif %}</{{ m.role }}>{% endfor %}")
    path = make_dir(tmp_path, tokenizer_json, source)
    a, b = "A" + text(rng) + "a", "B" + text(rng) + "b"
    blocks = [{"role": "user", "content": "q"},
              {"role": "assistant", "content": [{"type": "text", "text": a}, {"type": "image"},
                                                {"type": "text", "text": b}, {"type": "image"}]}]
    assert both(path, blocks, continue_final_message=True).endswith(b)
    trimmed = [{"role": "user", "content": "q"}, {"role": "assistant", "content": a + "  "}]
    assert both(path, trimmed, continue_final_message=True).endswith(a)
    thinking = [{"role": "user", "content": "q"}, {"role": "assistant", "reasoning": a, "content": b}]
    assert both(path, thinking, continue_final_message="reasoning_content").endswith("[think]" + a)
    assert both(path, thinking, continue_final_message="reasoning").endswith("[think]" + a)
    tok = mhsa.Tokenizer.load(path)
    for messages, field, error in (
            ([], "content", "conversation to continue"),
            ([{"role": "user", "content": "q"}], "missing", 'final message with a "missing"'),
            ([{"role": "user", "tool": "q"}], "tool", "a field the template reads"),
            ([{"role": "user", "content": [{"type": "image"}]}], "content", 'content block with "text"'),
            ([{"role": "user", "content": 7}], "content", "a string or a list")):
        with pytest.raises(mhsa.Error, match=error):
            tok.apply_chat_template(messages, continue_final_message=field)
    # A template that drops the final message cannot be continued: an error, as in transformers.
    drops = make_dir(tmp_path, tokenizer_json, "{% for m in messages[:-1] %}{{ m.content }}{% endfor %}content")
    assert both(drops, [{"role": "user", "content": "q"}, {"role": "assistant", "content": a}],
                continue_final_message=True) is None


def test_chat_template_argument_names_or_gives_a_template(tmp_path, tokenizer_json):
    named = [{"name": "default", "template": "D{% for m in messages %}{{ m.content }}{% endfor %}"},
             {"name": "rag", "template": "R{{ documents | length }}{% for m in messages %}{{ m.content }}{% endfor %}"}]
    path = make_dir(tmp_path, tokenizer_json, named)
    messages = [{"role": "user", "content": "hi"}]
    assert both(path, messages, chat_template="rag", documents=[{"title": "t", "text": "x"}]) == "R1hi"
    own = "O{{ bos_token }}{% for m in messages %}{{ m.role }}={{ m.content }}{% endfor %}"
    assert both(path, messages, chat_template=own) == "O<s>user=hi"
    (tmp_path / "single").mkdir()
    single = make_dir(tmp_path / "single", tokenizer_json, "S{{ messages | length }}")
    assert both(single, messages) == "S1"
    assert both(single, messages, chat_template=own) == "O<s>user=hi"
    # GPT-2's files have no template, but one may be given (with <|endoftext|> as bos and eos).
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    (gpt2 / "vocab.json").write_text(json.dumps({**{c: i for i, c in enumerate(alphabet)}, "<|endoftext|>": 256}))
    (gpt2 / "merges.txt").write_text("#version: 0.2\n")
    assert mhsa.Tokenizer.load(gpt2).apply_chat_template(messages, chat_template=own) == "O<|endoftext|>user=hi"
    with pytest.raises(mhsa.Error, match=r"ChatTemplate: source: line 1"):
        mhsa.Tokenizer.load(path).apply_chat_template(messages, chat_template="{% if %}")
