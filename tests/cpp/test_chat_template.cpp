// tests/cpp/test_chat_template.cpp — the chat-template interpreter's own guarantees: parse errors
// name the line and column, hostile templates hit a bound with a clear mhsa::Error (nesting,
// macro recursion, output size, work, range size, value nesting), inputs are validated, one
// template renders the same from many threads, and whitespace control on random layouts.
// Agreement with jinja2 / transformers is tests/python/test_chat_template.py's job.
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mhsa/chat_template.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

std::string render(std::string_view source, std::string_view messages = "[]", std::string_view vars = "{}") {
  return ChatTemplate(source).render(messages, false, vars);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ChatTemplate, ParseErrorsNameLineAndColumn) {
  // Fresh random padding before the bad tag: the reported position must follow it.
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 20; ++trial) {
    const int lines = static_cast<int>(rng() % 5), cols = static_cast<int>(rng() % 7);
    const std::string source = std::string(static_cast<size_t>(lines), '\n') + "text" +
                               std::string(static_cast<size_t>(cols), 'x') + "{{ 1 + }}";
    const std::string want = "ChatTemplate: source: line " + std::to_string(lines + 1) + ", column " +
                             std::to_string(4 + cols + 8) + ": expected an expression, got '}}'";
    EXPECT_EQ(error_of([&] { ChatTemplate t(source); }), want) << source;
  }
  EXPECT_EQ(error_of([] { ChatTemplate t("{% if x %}a"); }),
            "ChatTemplate: source: line 1, column 12: expected '{% elif %}' or '{% else %}' or '{% endif %}', got the end of the template");
  EXPECT_EQ(error_of([] { ChatTemplate t("é\n{% for x in y %}{% endif %}"); }),
            "ChatTemplate: source: line 2, column 20: expected '{% else %}' or '{% endfor %}', got '{% endif %}'");
  EXPECT_EQ(error_of([] { ChatTemplate t("{% extends 'base' %}"); }),
            "ChatTemplate: source: line 1, column 3: expected a statement this interpreter supports (if, for, set, macro, "
            "break, continue, generation), got 'extends'");
  EXPECT_EQ(error_of([] { ChatTemplate t("{{ 'a\\ud800' }}"); }),
            "ChatTemplate: source: line 1, column 6: expected an escape for a Unicode scalar value, got a surrogate or a value past U+10FFFF");
  EXPECT_EQ(error_of([] { ChatTemplate t("\xff"); }), "ChatTemplate: source: expected UTF-8 text, got invalid UTF-8");
}

TEST(ChatTemplate, RenderErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of([] { render("ab\n  {{ raise_exception('no ' ~ 1) }}"); }),
            "ChatTemplate::render: template line 2, column 6: raise_exception('no 1')");
  EXPECT_EQ(error_of([] { render("{{ x.y }}"); }), "ChatTemplate::render: template line 1, column 5: 'x' is undefined");
  EXPECT_EQ(error_of([] { render("{{ 1 + 'a' }}"); }),
            "ChatTemplate::render: template line 1, column 6: expected operands that support '+', got an int 1 and a str 'a'");
  EXPECT_EQ(error_of([] { render("{{ x | frobnicate }}"); }),
            "ChatTemplate::render: template line 1, column 6: expected a filter this interpreter supports, got 'frobnicate'");
}

TEST(ChatTemplate, InputsAreValidated) {
  EXPECT_EQ(error_of([] { render("", "{"); }).rfind("ChatTemplate::render: messages: expected JSON, got invalid JSON", 0), 0u);
  EXPECT_EQ(error_of([] { render("", "{}"); }),
            "ChatTemplate::render: messages: expected a JSON array of messages, got an object {}");
  EXPECT_EQ(error_of([] { render("", "[1]"); }), "ChatTemplate::render: messages[0]: expected an object, got 1");
  EXPECT_EQ(error_of([] { render("", "[]", "[]"); }), "ChatTemplate::render: variables: expected a JSON object, got an array []");
  EXPECT_EQ(error_of([] { render("", std::string(100, '[') + std::string(100, ']')); }),
            "ChatTemplate::render: messages: expected JSON nested at most 64 levels deep, got deeper nesting");
  // Null keys are dropped, as transformers does; insertion order is kept for tojson.
  EXPECT_EQ(render("{{ messages[0] | tojson }}{{ messages[0].b is defined }}", R"([{"z": 1, "b": null, "a": [2]}])"),
               R"({"z": 1, "a": [2]}False)");
}

TEST(ChatTemplate, HostileTemplatesHitBounds) {
  const auto fails_with = [](const std::string& source, const std::string& needle) {
    const std::string e = error_of([&] { render(source); });
    EXPECT_NE(e.find(needle), std::string::npos) << "error: " << e;
  };
  fails_with("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "levels of nesting");
  fails_with("{{ " + std::string(2000, '[') + std::string(2000, ']') + " }}", "levels of nesting");
  std::string ifs;
  for (int i = 0; i < 300; ++i) ifs += "{% if true %}";
  fails_with(ifs, "levels of nesting");
  fails_with("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "macro calls nested at most");
  fails_with("{{ 'x' * 100000000 }}", "expected a repetition of at most");
  fails_with("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}"
             "{{ ns.s }}{% endfor %}", "renders within");
  fails_with("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100) %}{% endfor %}"
             "{% endfor %}{% endfor %}", "steps");
  fails_with("{{ range(1000000) | length }}", "expected a range of at most 100000 items");
  fails_with("{% set ns = namespace(v=[]) %}{% for i in range(200) %}{% set ns.v = [ns.v] %}{% endfor %}",
             "nested at most 100 deep");
  fails_with("{{ 9223372036854775807 + 1 }}", "64-bit integers");
  fails_with("{{ 2 ** 64 }}", "64-bit integers");
  fails_with("{{ 1 // 0 }}", "nonzero divisor");
  // A namespace set to hold itself, directly or through a list, a dict or another namespace: a
  // cycle of shared pointers that was never freed (found by the chat-template fuzzer as a leak).
  for (const char* value : {"ns", "[1, ns]", "{'k': [ns]}", "other", "[other]", "namespace(x=ns)", "loop"})
    fails_with(std::string("{% set ns = namespace(a=1) %}{% set other = namespace(b=ns) %}{% for i in [1] %}"
                           "{% set ns.a = ") + value + " %}{% endfor %}",
               "expected a value without namespace() objects in it to set attribute 'a' to");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.a = [1, {'b': [2, 'c']}] %}{{ ns.a | tojson }}"
                   "{% set other = namespace(n=ns) %}{{ other.n.a[1].b[1] }}"),
            "[1, {\"b\": [2, \"c\"]}]c");
}

TEST(ChatTemplate, WhitespaceControlOnRandomLayouts) {
  // trim_blocks + lstrip_blocks: a block tag alone on its line, indented by any spaces and tabs,
  // leaves nothing of its line; `-` strips every whitespace character on its side.
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 50; ++trial) {
    const std::string indent = std::string(rng() % 4, ' ') + std::string(rng() % 3, '\t');
    const std::string source = "A\n" + indent + "{% if true %}\n" + indent + "B\n" + indent + "{% endif %}\nC" +
                               std::string(rng() % 3, ' ') + "\n" + indent + "{{- 'D' -}}" + std::string(rng() % 3, '\n') + " E";
    EXPECT_EQ(render(source), "A\n" + indent + "B\nCDE") << source;
  }
}

TEST(ChatTemplate, RendersTheSameFromManyThreads) {
  const ChatTemplate t("{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}"
                       "{% if add_generation_prompt %}<assistant>{% endif %}");
  const std::string messages = R"([{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}])";
  const std::string want = t.render(messages, true);
  EXPECT_EQ(want, "<user>hi<assistant>yo<assistant>");
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) ok[static_cast<size_t>(i)] += t.render(messages, true) == want;
    });
  for (auto& th : threads) th.join();
  for (int v : ok) EXPECT_EQ(v, 200);
}

}  // namespace
}  // namespace mhsa::test
