"""mhsa.ChatSession against transformers: a tiny random Qwen2ForCausalLM (its embedding padded past
the tokenizer's ids, as Qwen2.5's) saved by transformers, a byte-level BPE tokenizer.json trained
with `tokenizers` and the ChatML template. Each turn's answer must equal transformers'
apply_chat_template(add_generation_prompt=True) + greedy generate + decode, the second turn must run
only the tokens the cache does not hold, and an exception in on_text must end the answer cleanly.
The head's row for <|im_end|> is zero, so that answers seldom end before they have some text.
Random conversations each run; MHSA_TEST_SEED reproduces one."""

import os
import random
import secrets

import pytest

import mhsa

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from tiny_chat_model import WORDS, hf_tokenizer, write_chat_dir  # noqa: E402


@pytest.fixture(scope="module")
def seed():
    return int(os.environ.get("MHSA_TEST_SEED") or secrets.randbits(32))


@pytest.fixture
def rng(request, seed):
    request.node.user_properties.append(("MHSA_TEST_SEED", seed))
    return random.Random(seed)


@pytest.fixture(scope="module")
def chat(tmp_path_factory, seed):
    d = tmp_path_factory.mktemp("qwen-chat")

    def edit(model, tok):  # answers that do not end at once
        model.lm_head.weight[tok.token_to_id("<|im_end|>")] = 0

    model, _ = write_chat_dir(d, tokens=307, padding=13, max_positions=512, seed=seed, edit=edit)
    return mhsa.Model.load(d), mhsa.Tokenizer.load(d), model, hf_tokenizer(d)


def line(rng):
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))).strip() or "Hello"


def reference(hf_model, hf, messages, n):
    """transformers' prompt ids, answer ids (with the end-of-turn token, if reached) and text."""
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # newer transformers give a BatchEncoding
        ids = ids["input_ids"]
    end = hf.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        new = hf_model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=end,
                                pad_token_id=0)[0, len(ids):].tolist()
    answer = new[:new.index(end)] if end in new else new
    return ids, new, hf.decode(answer, skip_special_tokens=True), "stop" if end in new else "length"


def test_two_turns_equal_transformers_and_reuse_the_cache(chat, rng):
    model, tok, hf_model, hf = chat
    n = rng.randint(4, 30)
    s = mhsa.ChatSession(model, tok, system="Be brief.", max_new_tokens=n)
    assert s.finish_reason is None and s.messages == [{"role": "system", "content": "Be brief."}]
    messages = [{"role": "system", "content": "Be brief."}]
    cached = []
    for turn in range(2):
        user = line(rng)
        messages.append({"role": "user", "content": user})
        ids, new, text, finish = reference(hf_model, hf, messages, n)
        pieces = []
        answer = s.send(user, on_text=pieces.append)
        assert answer == text and "".join(pieces) == text
        assert s.finish_reason == finish
        messages.append({"role": "assistant", "content": answer})
        assert s.messages == messages
        t = s.last_turn
        keep = 0
        while keep < min(len(ids) - 1, len(cached)) and ids[keep] == cached[keep]:
            keep += 1
        assert (t["prompt_tokens"], t["reused_tokens"], t["evaluated_tokens"]) == (len(ids), keep, len(ids) - keep)
        assert t["generated_tokens"] == len(new) - (finish == "stop")
        if turn == 1:
            assert keep > 0  # the first turn's prompt at least
        cached = ids + new[:-1]  # the last token chosen is never run
        assert s.cached_ids == cached and s.cached_tokens == len(cached)
    s.reset()
    assert s.messages == [{"role": "system", "content": "Be brief."}] and s.cached_tokens == 0


def test_an_exception_in_on_text_ends_the_answer_cleanly(chat, rng):
    model, tok, hf_model, hf = chat
    s = mhsa.ChatSession(model, tok, max_new_tokens=40)
    shown = []

    def on_text(piece):
        shown.append(piece)
        s.messages  # noqa: B018  (a call on the session while it answers raises mhsa.Error)

    user = line(rng)
    with pytest.raises(mhsa.Error, match="ChatSession.messages: expected a session that is not answering"):
        s.send(user, on_text=on_text)
    if shown:  # the answer as far as it was shown stays in the conversation
        # Cancelled — unless the first piece shown was the last: bytes of incomplete UTF-8 held back
        # until the answer ended at max_new_tokens, then flushed as U+FFFD (a random model's answer).
        if s.finish_reason == "length":
            assert s.last_turn["generated_tokens"] == 40 and shown[0].endswith("\ufffd"), (shown, s.last_turn)
        else:
            assert s.finish_reason == "cancelled"
        assert s.messages == [{"role": "user", "content": user}, {"role": "assistant", "content": shown[0]}]

    def interrupt(piece):
        raise KeyboardInterrupt

    before = len(s.messages)
    with pytest.raises(KeyboardInterrupt):
        s.send(line(rng), on_text=interrupt)
    assert len(s.messages) == before + 2
    # The session goes on: the next answer equals transformers' for the conversation as it stands.
    user = line(rng)
    answer = s.send(user)
    ids, new, text, finish = reference(hf_model, hf, s.messages[:-1], 40)
    assert answer == text


def test_errors(chat):
    model, tok, _, _ = chat
    with pytest.raises(mhsa.Error, match="ChatSession: temperature"):
        mhsa.ChatSession(model, tok, temperature=-1.0)
    with pytest.raises(mhsa.Error, match="ChatTemplate"):
        mhsa.ChatSession(model, tok, chat_template="{% if %}")
