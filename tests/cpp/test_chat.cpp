// tests/cpp/test_chat.cpp — ChatSession and IncrementalDecoder on a random Llama and a small
// in-memory tokenizer.json (single characters, a few merges, byte fallback, chat special tokens):
// a second turn evaluates only its new tokens and answers exactly as greedy generation from scratch
// on the whole rendered conversation; the cache is rewound where the template renders the history
// differently; stop requests, a full context and hostile message files; the streamed text is
// always whole UTF-8 and adds up to the tokenizer's decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mhsa/chat.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "mhsa/tokenizer.h"
#include "test_util.h"
#include "text/hf_tokenizer.h"

namespace mhsa {
namespace {

using json = nlohmann::json;
using test::expect_error;

const std::vector<std::string> kSpecials = {"<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>", "<|system|>",
                                            // the turn markers of the templates in tests/data/chat_templates
                                            "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
                                            "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]"};
const std::string kChars = "abcdefghijklmnopqrstuvwxyz ,.!?:\n";
const std::vector<std::string> kMerges = {"t h", "th e", "e r", "i n", "a n"};

// The template of most chat models in miniature: each message between its role's token and <|end|>.
const std::string kTemplate =
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

// extra_config: more of tokenizer_config.json's keys (pad_token, ...).
Tokenizer make_tokenizer(const std::string& chat_template = kTemplate, const json& extra_config = json::object()) {
  json vocab = json::object(), added = json::array();
  int id = 0;
  for (const std::string& s : kSpecials) {
    added.push_back({{"id", id}, {"content", s}, {"special", true}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}});
    vocab[s] = id++;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = id++;
  }
  for (char c : kChars) vocab[std::string(1, c)] = id++;
  for (const char* s : {"\xc3\xa9", "\xe4\xb8\xad"}) vocab[s] = id++;  // é, 中
  for (const char* s : {"th", "the", "er", "in", "an"}) vocab[s] = id++;
  const json tj = {{"added_tokens", added},
                   {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", kMerges}, {"byte_fallback", true}}},
                   {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}};
  json config = {{"chat_template", chat_template}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  config.update(extra_config);
  return Tokenizer::parse_json(tj.dump(), config.dump());
}

std::string detail_read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A random Llama with lively logits (embeddings and head scaled up, so that greedy choices are
// not near-ties that the order of a sum could flip).
Model make_model(int64_t vocab, int64_t context, uint64_t seed) {
  const json c = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", vocab},
                  {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 2},
                  {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", context},
                  {"eos_token_id", 1}, {"bos_token_id", 0}};
  Model m = Model::random(ModelConfig::parse(c.dump()), seed);
  for (auto& [name, t] : m.parameters())
    if (name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos)
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 30.0f;
  return m;
}

std::string random_text(std::mt19937_64& gen, int min_len, int max_len) {
  const std::vector<std::string> pieces = {"the", "a", "n", "t", "h", "er", " ", ",", "in", "\xc3\xa9", "\xe4\xb8\xad",
                                           "\xf0\x9f\x99\x82", "z", "?"};
  std::string s;
  const int n = std::uniform_int_distribution<int>(min_len, max_len)(gen);
  for (int i = 0; i < n; ++i) s += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(gen)];
  return s;
}

// Greedy generation from scratch on ids, cut at the session's end-of-turn tokens.
std::vector<int32_t> from_scratch(const Model& m, const std::vector<int32_t>& ids, int64_t n,
                                  const std::vector<int32_t>& stop) {
  GenerationOptions o;
  o.max_new_tokens = n;
  o.stop_at_eos = false;
  std::vector<int32_t> out = m.generate(ids, 1, static_cast<int64_t>(ids.size()), o)[0];
  const auto end = std::find_if(out.begin(), out.end(), [&](int32_t t) { return std::count(stop.begin(), stop.end(), t) > 0; });
  out.erase(end, out.end());
  return out;
}

size_t common_prefix(const std::vector<int32_t>& a, std::span<const int32_t> b) {
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

// Two turns; returns the second's ids as the conversation renders them and checks the cache use
// and the answer against recomputation. `expect_prefix`: the first turn's prompt is a prefix of
// the second's (the template renders history as it was generated).
void check_two_turns(const std::string& chat_template, bool expect_prefix) {
  auto gen = test::test_rng();
  const Tokenizer tok = make_tokenizer(chat_template);
  const Model model = make_model(tok.vocab_size(), 512, gen());
  ChatOptions o;
  o.generation.max_new_tokens = std::uniform_int_distribution<int64_t>(3, 24)(gen);
  o.system = gen() % 2 ? random_text(gen, 1, 6) : "";
  ChatSession s(model, tok, o);
  const ChatTurn t1 = s.send(random_text(gen, 1, 12));
  EXPECT_EQ(t1.reused_tokens, 0);
  EXPECT_EQ(t1.evaluated_tokens, t1.prompt_tokens);
  const std::vector<int32_t> cached1(s.cached_ids().begin(), s.cached_ids().end());
  ASSERT_EQ(s.messages().back().role, "assistant");
  EXPECT_EQ(s.messages().back().content, t1.text);

  std::string shown;
  const ChatTurn t2 = s.send(random_text(gen, 1, 12), [&](std::string_view p) {
    shown += p;
    return true;
  });
  EXPECT_EQ(shown, t2.text);
  // The prompt of turn 2 as the conversation renders it (the last message is the answer: drop it).
  ChatSession replay(model, tok, o);
  std::vector<ChatMessage> history = s.messages();
  history.pop_back();
  replay.set_messages(history);
  const std::vector<int32_t> ids2 = replay.encode(true);
  ASSERT_EQ(t2.prompt_tokens, static_cast<int64_t>(ids2.size()));
  const size_t lcp = std::min(common_prefix(ids2, cached1), ids2.size() - 1);
  EXPECT_EQ(t2.reused_tokens, static_cast<int64_t>(lcp));
  EXPECT_EQ(t2.evaluated_tokens, t2.prompt_tokens - t2.reused_tokens);
  if (expect_prefix)
    EXPECT_GE(t2.reused_tokens, t1.prompt_tokens);  // the history was not evaluated again
  else if (!t1.text.starts_with("::"))
    EXPECT_LT(t2.reused_tokens, t1.prompt_tokens);  // rewound into the first prompt
  // The cache path equals recomputation.
  const std::vector<int32_t> scratch = from_scratch(model, ids2, o.generation.max_new_tokens, s.end_of_turn_ids());
  EXPECT_EQ(t2.generated_tokens, static_cast<int64_t>(scratch.size()));
  IncrementalDecoder replayed(tok);  // the text those tokens stream as
  for (int32_t id : scratch) replayed.push(id);
  replayed.finish();
  EXPECT_EQ(t2.text, replayed.text());
  // The cache holds the prompt and every answer token that was fed back.
  const std::span<const int32_t> cached2 = s.cached_ids();
  ASSERT_GE(cached2.size(), ids2.size());
  ASSERT_LE(cached2.size(), ids2.size() + scratch.size());
  EXPECT_TRUE(std::equal(ids2.begin(), ids2.end(), cached2.begin()));
  EXPECT_TRUE(std::equal(cached2.begin() + static_cast<std::ptrdiff_t>(ids2.size()), cached2.end(), scratch.begin()));
}

TEST(ChatSession, SecondTurnEvaluatesOnlyNewTokensAndEqualsRecompute) {
  for (int rep = 0; rep < 3; ++rep) check_two_turns(kTemplate, true);
}

TEST(ChatSession, RewindsWhenTheTemplateRendersHistoryDifferently) {
  // The generation prompt ends "<|assistant|>::", but a past answer renders without the "::".
  const std::string t =
      "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>::{% endif %}";
  for (int rep = 0; rep < 3; ++rep) check_two_turns(t, false);
}

TEST(ChatSession, EndOfTurnTokensComeFromConfigTokenizerAndTemplate) {
  const Tokenizer tok = make_tokenizer();
  const Model model = make_model(tok.vocab_size(), 64, 1);
  const ChatSession s(model, tok);
  EXPECT_EQ(s.end_of_turn_ids(), (std::vector<int32_t>{1, 4}));  // </s>, then <|end|> after an answer
  EXPECT_TRUE(s.messages().empty());
}

TEST(ChatSession, EndOfTurnOfRealTemplates) {
  const Tokenizer tok = make_tokenizer();
  const Model model = make_model(tok.vocab_size(), 64, 3);
  const auto id = [&](const std::string& s) { return *tok.token_id(s); };
  const std::vector<std::pair<std::string, int32_t>> cases = {
      {"chatml", id("<|im_end|>")},     {"qwen2.5", id("<|im_end|>")},   {"smollm2", id("<|im_end|>")},
      {"llama3.1", id("<|eot_id|>")},   {"gemma2", id("<end_of_turn>")}, {"mistral-v0.3", id("</s>")}};
  for (const auto& [name, expected] : cases) {
    ChatOptions o;
    o.chat_template = detail_read(std::string(MHSA_TEST_DATA_DIR) + "/chat_templates/" + name + ".jinja");
    const ChatSession s(model, tok, o);
    const std::vector<int32_t>& ids = s.end_of_turn_ids();
    EXPECT_TRUE(std::count(ids.begin(), ids.end(), expected)) << name;
    EXPECT_LE(ids.size(), 2u) << name;  // </s> and the template's marker, nothing else
  }
}

TEST(ChatSession, StopRequestKeepsThePartialAnswer) {
  auto gen = test::test_rng();
  const Tokenizer tok = make_tokenizer();
  const Model model = make_model(tok.vocab_size(), 2048, gen());
  ChatOptions o;
  o.generation.max_new_tokens = 300;
  o.generation.temperature = 1.0f;  // sampling, so that no end-of-turn comes at once
  o.generation.seed = gen();
  std::atomic<bool> stop{false};
  ChatSession s(model, tok, o);
  std::string shown;
  int pieces = 0;
  const ChatTurn t = s.send("hi there", [&](std::string_view p) {
    shown += p;
    if (++pieces == 2) stop = true;
    return true;
  }, &stop);
  if (t.finish != FinishReason::end_of_turn) {  // the model may end its turn before the second piece
    EXPECT_EQ(t.finish, FinishReason::stopped);
    EXPECT_EQ(pieces, 2);  // nothing after the request
    // Every token shown was fed back: the cache is ready for the next turn.
    EXPECT_EQ(static_cast<int64_t>(s.cached_ids().size()), t.prompt_tokens + t.generated_tokens);
  }
  EXPECT_EQ(shown, t.text);
  EXPECT_EQ(s.messages().back().content, t.text);
  const ChatTurn t2 = s.send("and then", {}, nullptr);
  EXPECT_GE(t2.reused_tokens, t.prompt_tokens);
  // A text callback returning false stops the answer too.
  pieces = 0;
  const ChatTurn t3 = s.send("once more", [&](std::string_view) { return ++pieces < 1; });
  if (t3.finish != FinishReason::end_of_turn) {
    EXPECT_EQ(t3.finish, FinishReason::stopped);
    EXPECT_EQ(pieces, 1);
  }
  // A stop requested before the turn: the prompt is not even run, the message is kept unanswered.
  stop = true;
  const ChatTurn t4 = s.send("never mind", {}, &stop);
  EXPECT_EQ(t4.finish, FinishReason::stopped);
  EXPECT_EQ(t4.evaluated_tokens, 0);
  EXPECT_EQ(t4.text, "");
}

TEST(ChatSession, FullContextEndsTheAnswerAndRefusesTheNextMessage) {
  auto gen = test::test_rng();
  const Tokenizer tok = make_tokenizer();
  const Model model = make_model(tok.vocab_size(), 48, gen());
  ChatOptions o;
  o.generation.max_new_tokens = 1000;
  o.generation.temperature = 1.0f;
  o.generation.seed = gen();
  ChatSession s(model, tok, o);
  bool refused = false;
  for (int turn = 0; turn < 40 && !refused; ++turn) {
    const size_t before = s.messages().size();
    const ChatTurn t = s.send("hello there");
    EXPECT_LE(s.cached_ids().size(), 48u);
    if (t.finish == FinishReason::context_full && t.generated_tokens == 0) {
      refused = true;
      EXPECT_EQ(s.messages().size(), before);  // the message was taken back
      EXPECT_GE(t.prompt_tokens, 48);
    }
  }
  EXPECT_TRUE(refused);
  // After a reset the session takes a message again: not refused (its answer may be empty, where
  // the first token sampled from a random model ends the turn, or fill the context).
  s.reset();
  const ChatTurn again = s.send("hi");
  EXPECT_FALSE(again.finish == FinishReason::context_full && again.generated_tokens == 0);
  EXPECT_GT(again.evaluated_tokens, 0);
  EXPECT_EQ(s.messages().size(), 2u);
}

TEST(ChatSession, Errors) {
  const Tokenizer tok = make_tokenizer();
  const Model model = make_model(tok.vocab_size(), 64, 2);
  const Tokenizer no_template = make_tokenizer("");
  expect_error([&] { ChatSession x(model, no_template); }, {"ChatSession: tokenizer: expected a chat template"});
  const Model small = make_model(tok.vocab_size() - 1, 64, 2);
  expect_error([&] { ChatSession x(small, tok); },
               {"ChatSession: tokenizer: expected a tokenizer of at most the model's " + std::to_string(tok.vocab_size() - 1) +
                " tokens, got " + std::to_string(tok.vocab_size()) + " tokens"});
  const Model padded = make_model(tok.vocab_size() + 7, 64, 2);  // a padded embedding (Qwen2.5's)
  ChatSession p(padded, tok);
  EXPECT_NO_THROW(p.send("hi"));
  ChatOptions bad;
  bad.chat_template = "{% if %}";
  expect_error([&] { ChatSession x(model, tok, bad); }, {"ChatTemplate: source: line 1"});
  ChatSession s(model, tok);
  expect_error([&] { s.send("a\xff"); }, {"ChatSession::send: user_text: expected UTF-8 text, got an invalid byte at offset 1"});
  EXPECT_TRUE(s.messages().empty());
  ChatOptions raising;
  raising.chat_template = "{{ raise_exception('no') }}";
  ChatSession r(model, tok, raising);
  expect_error([&] { r.send("hi"); }, {"no"});
  EXPECT_TRUE(r.messages().empty());
}

TEST(ChatSession, GivenTemplateSeesEverySpecialTokenOfTheConfig) {
  std::mt19937_64 rng(std::random_device{}());
  const Tokenizer tok = make_tokenizer(kTemplate, {{"pad_token", "<|system|>"}, {"unk_token", "[INST]"}});
  const Model model = make_model(tok.vocab_size(), 256, rng());
  ChatOptions o;
  o.generation.max_new_tokens = 1 + static_cast<int64_t>(rng() % 6);
  o.chat_template =
      "{{ pad_token }}{% for m in messages %}{{ bos_token }}{{ m.content }}{{ unk_token }}{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}";
  ChatSession s(model, tok, o);
  const ChatTurn t = s.send("the in");
  EXPECT_EQ(s.render(false), "<|system|><s>the in[INST]<s>" + t.text + "[INST]");
  ChatTemplateOptions to;
  to.add_generation_prompt = true;
  to.chat_template = o.chat_template;
  const std::string m = json::array({{{"role", "user"}, {"content", "the in"}}, {{"role", "assistant"}, {"content", t.text}}}).dump();
  EXPECT_EQ(s.render(true), tok.apply_chat_template(m, to));
  // The end of an answer is the special token the template writes after one.
  EXPECT_TRUE(std::find(s.end_of_turn_ids().begin(), s.end_of_turn_ids().end(), *tok.token_id("[INST]")) !=
              s.end_of_turn_ids().end());
}

TEST(ChatSession, ParseMessages) {
  const auto m = ChatSession::parse_messages(R"({"messages": [{"role": "user", "content": "h\u00e9", "x": 1}]})");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].content, "h\xc3\xa9");
  EXPECT_EQ(ChatSession::parse_messages(R"([{"role": "system", "content": ""}, {"role": "user", "content": "a"}])").size(), 2u);
  const std::string fn = "ChatSession::parse_messages: ";
  expect_error([] { ChatSession::parse_messages("\"hi\""); }, {fn + "messages: expected an array", "got a string"});
  expect_error([] { ChatSession::parse_messages("{}"); }, {fn + "messages: expected an array of messages or an object"});
  expect_error([] { ChatSession::parse_messages("[]"); }, {fn + "messages: expected at least one message"});
  expect_error([] { ChatSession::parse_messages("[1]"); }, {fn + "messages[0]: expected an object", "got 1"});
  expect_error([] { ChatSession::parse_messages(R"([{"content": "a"}])"); }, {fn + "messages[0]: expected an object with \"role\""});
  expect_error([] { ChatSession::parse_messages(R"([{"role": "user"}])"); }, {fn + "messages[0]: expected an object with \"content\""});
  expect_error([] { ChatSession::parse_messages(R"([{"role": "user", "content": 5}])"); },
               {fn + "messages[0].content: expected a string, got 5"});
  expect_error([] { ChatSession::parse_messages(R"([{"role": "", "content": "a"}])"); }, {fn + "messages[0].role: expected a role"});
  expect_error([] { ChatSession::parse_messages("[{\"role\": \"user\", \"content\": \"\xc3\"}]"); },
               {fn + "messages: expected UTF-8 text, got an invalid byte at offset 30"});
  expect_error([] { ChatSession::parse_messages(std::string(100, '[')); }, {fn + "messages: expected JSON"});
  expect_error([] { ChatSession::parse_messages("[{"); }, {fn + "messages: expected JSON"});
}

// The streamed pieces: each whole UTF-8, together the tokenizer's decode of the tokens.
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  IncrementalDecoder d(tok);
  std::string all;
  for (int32_t id : ids) {
    const std::string p = d.push(id);
    EXPECT_EQ(text::lossy_utf8(p), p);
    all += p;
  }
  const std::string rest = d.finish();
  EXPECT_EQ(text::lossy_utf8(rest), rest);
  all += rest;
  EXPECT_EQ(all, text::lossy_utf8(tok.decode(ids, true)));
  EXPECT_EQ(all, d.text());
}

TEST(IncrementalDecoder, WholeCharactersOverByteFallbackAndSpecialTokens) {
  auto gen = test::test_rng();
  const Tokenizer tok = make_tokenizer();
  const int32_t byte0 = static_cast<int32_t>(kSpecials.size());
  // 🙂 as four byte-fallback tokens: nothing until the last.
  IncrementalDecoder d(tok);
  EXPECT_EQ(d.push(byte0 + 0xF0), "");
  EXPECT_EQ(d.push(4), "");  // a special token is not text
  EXPECT_EQ(d.push(byte0 + 0x9F), "");
  EXPECT_EQ(d.push(byte0 + 0x99), "");
  EXPECT_EQ(d.push(byte0 + 0x82), "\xf0\x9f\x99\x82");
  EXPECT_EQ(d.push(byte0 + 0xE4), "");
  EXPECT_EQ(d.finish(), "\xef\xbf\xbd");  // a character never finished
  // Random streams: encodings of random text (whole characters as byte-fallback runs) with special
  // and character tokens put anywhere, even inside a character's bytes.
  const int32_t chars0 = byte0 + 256;
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<int32_t> ids = tok.encode(random_text(gen, 0, 20), EncodeOptions{false, true});
    const auto is_byte = [&](int32_t id) { return id >= byte0 && id < chars0; };
    for (int k = std::uniform_int_distribution<int>(0, 3)(gen); k > 0; --k) {  // characters between runs
      const size_t at = gen() % (ids.size() + 1);
      if ((at > 0 && is_byte(ids[at - 1])) || (at < ids.size() && is_byte(ids[at]))) continue;
      ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(at),
                 std::uniform_int_distribution<int32_t>(chars0, tok.vocab_size() - 1)(gen));
    }
    for (int k = std::uniform_int_distribution<int>(0, 3)(gen); k > 0; --k)  // specials anywhere
      ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(gen() % (ids.size() + 1)),
                 std::uniform_int_distribution<int32_t>(0, byte0 - 1)(gen));
    check_stream(tok, ids);
  }
  // Random ids, byte tokens included: a run of bytes that is not UTF-8 decodes as a whole (one
  // U+FFFD per byte, as Hugging Face's ByteFallback), so the pieces are whole characters but may
  // differ from decoding everything at once.
  for (int rep = 0; rep < 50; ++rep) {
    IncrementalDecoder d(tok);
    for (int k = 0; k < 30; ++k) {
      const std::string p = d.push(std::uniform_int_distribution<int32_t>(0, tok.vocab_size() - 1)(gen));
      EXPECT_EQ(text::lossy_utf8(p), p);
    }
    const std::string p = d.finish();
    EXPECT_EQ(text::lossy_utf8(p), p);
  }
  // GPT-2-style raw bytes: any byte sequence, invalid UTF-8 included.
  const Tokenizer bytes = Tokenizer::bytes();
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<int32_t> ids = bytes.encode(random_text(gen, 0, 20));
    for (int k = std::uniform_int_distribution<int>(0, 3)(gen); k > 0; --k)
      ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(gen() % (ids.size() + 1)),
                 std::uniform_int_distribution<int32_t>(0x80, 0xFF)(gen));
    check_stream(bytes, ids);
  }
  expect_error([&] { IncrementalDecoder(tok).push(tok.vocab_size()); }, {"Tokenizer::token_bytes: id: expected the id of a token", "got"});
}

TEST(IncrementalDecoder, MetaspaceStripsOnlyTheFirstSpace) {
  // SentencePiece style: "▁" for spaces, the first one dropped by the decoder (as Llama 2's, Mistral's).
  const json tj = {{"model", {{"type", "BPE"}, {"vocab", {{"\u2581Hello", 0}, {"\u2581world", 1}, {"\u2581", 2}, {"!", 3}}},
                              {"merges", json::array()}}},
                   {"decoder", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}}}};
  const Tokenizer tok = Tokenizer::parse_json(tj.dump());
  for (const std::vector<int32_t>& ids : std::vector<std::vector<int32_t>>{{0, 1, 3}, {2, 0, 2, 2, 1}, {3, 2, 3, 0}, {2}}) {
    IncrementalDecoder d(tok);
    std::string all;
    for (int32_t id : ids) all += d.push(id);
    all += d.finish();
    EXPECT_EQ(all, tok.decode(ids, true));
  }
  IncrementalDecoder d(tok);
  EXPECT_EQ(d.push(0), "Hello");
  EXPECT_EQ(d.push(1), " world");
}

TEST(ModelCache, TruncateRewinds) {
  auto gen = test::test_rng();
  const Tokenizer tok = make_tokenizer();
  const Model model = make_model(tok.vocab_size(), 64, gen());
  std::vector<int32_t> ids(20);
  for (int32_t& id : ids) id = std::uniform_int_distribution<int32_t>(0, tok.vocab_size() - 1)(gen);
  ModelCache c = model.new_cache(1, 64);
  (void)model.extend(c, ids, 1, 20, true);
  c.truncate(7);
  EXPECT_EQ(c.length(), 7);
  const Tensor after = model.extend(c, std::span(ids).subspan(7), 1, 13, true);
  ModelCache fresh = model.new_cache(1, 64);
  (void)model.extend(fresh, std::span(ids).first(7), 1, 7, true);
  const Tensor ref = model.extend(fresh, std::span(ids).subspan(7), 1, 13, true);
  // Equal up to the roundings of the projections, which may sum in another order for other row counts.
  for (int64_t i = 0; i < ref.numel(); ++i) ASSERT_NEAR(after.data()[i], ref.data()[i], 1e-4f * (1 + std::fabs(ref.data()[i]))) << i;
  expect_error([&] { c.truncate(21); }, {"ModelCache::truncate: length: expected a length in [0, 20]", "got 21"});
  expect_error([&] { c.truncate(-1); }, {"got -1"});
  EXPECT_EQ(c.length(), 20);
}

}  // namespace
}  // namespace mhsa
