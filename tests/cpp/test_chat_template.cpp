// tests/cpp/test_chat_template.cpp — the chat-template interpreter's own guarantees: parse errors
// name the line and column, hostile templates hit a bound with a clear mhsa::Error (nesting,
// macro recursion, output size, work, range size, value nesting), inputs are validated, one
// template renders the same from many threads, and whitespace control on random layouts.
// Agreement with jinja2 / transformers is tests/python/test_chat_template.py's job.
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mhsa/chat_template.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

constexpr size_t kMaxTemplateBytesForTest = 1 << 20;  // text/jinja.h's kMaxSourceBytes

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

// Chains are parsed by loops, but rendering, scoping and freeing the tree recurse once per level:
// an 8,000-term sum (a 16 KB template), 16,000 filters, long attribute, subscript and call chains
// crashed on the stack. The tree's height is bounded as it is built.
TEST(ChatTemplate, LongChainsHitTheTreeBound) {
  const auto chain = [](const std::string& head, const std::string& link, int n, const std::string& tail = "") {
    std::string s = "{{ " + head;
    for (int i = 0; i < n; ++i) s += link;
    return s + tail + " }}";
  };
  const std::string want = "expected an expression at most 256 levels deep";
  for (const std::string& source :
       {chain("1", "+1", 8000), chain("1", "*1", 8000), chain("'a'", "~'a'", 8000), chain("1", " and 1", 8000),
        chain("1", "==1", 8000), chain("x", "|abs", 16000), chain("x", " is defined", 8000),
        chain("messages", ".x", 8000), chain("messages", "[0]", 8000), chain("messages", "[0:1]", 8000),
        chain("messages", ".0 ", 8000), chain("f", "()", 8000), chain("1", " if 1", 8000, " else 2")}) {
    const std::string e = error_of([&] { ChatTemplate t(source); });
    EXPECT_NE(e.find(want), std::string::npos) << source.substr(0, 40) << ": " << e;
    EXPECT_EQ(e.rfind("ChatTemplate: source: line 1, column ", 0), 0u) << e;
  }
  // Up to the bound, chains render: 255 links of each kind.
  EXPECT_EQ(render(chain("0", "+1", 255)), "255");
  EXPECT_EQ(render(chain("-3", "|abs", 254)), "3");  // (-3)|abs…: 2 + 254 levels
}

// The parser bounds each expression, but a macro's body is evaluated inside the call that reaches
// it: evaluation counts its own depth, so recursion through deep expressions stops with an error.
TEST(ChatTemplate, EvaluationDepthIsBoundedAcrossMacroCalls) {
  std::string filters;
  for (int i = 0; i < 40; ++i) filters += "|string";
  const std::string e =
      error_of([&] { render("{% macro f(n) %}{{ (f(n + 1) if n < 45 else '')" + filters + " }}{% endmacro %}{{ f(0) }}"); });
  EXPECT_NE(e.find("expected expressions and statements evaluated at most 1000 levels inside one another"),
            std::string::npos) << e;
  EXPECT_EQ(e.rfind("ChatTemplate::render: template line 1, column ", 0), 0u) << e;
  // Recursion within the bound still renders.
  EXPECT_EQ(render("{% macro f(n) %}{{ (f(n + 1) if n < 10 else 'x')|string|string }}{% endmacro %}{{ f(0) }}"), "x");
}

// Locating a node recounted lines from the start whenever the node came before the previous one
// (a + b's node after b's): a 1.5 MB template took 57 s to compile. Now linear, and the text bounded.
TEST(ChatTemplate, CompilingIsLinearAndTheSourceBounded) {
  std::string big;
  while (big.size() + 11 <= kMaxTemplateBytesForTest) big += "{{ 1 + 2 }}";
  const auto start = std::chrono::steady_clock::now();
  ChatTemplate t(big);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0) << "1 MiB took " << seconds << " s to compile (quadratic took minutes)";
  EXPECT_EQ(t.render("[]", false).substr(0, 6), "333333");
  big.resize(kMaxTemplateBytesForTest + 1, ' ');
  EXPECT_EQ(error_of([&] { ChatTemplate u(big); }),
            "ChatTemplate: source: expected a template of at most 1048576 bytes, got 1048577 bytes");
  // Locations stay exact for nodes made after their operands, on long lines and past many lines.
  std::string source = std::string(500, '\n') + std::string(300, 'x') + "{{ 1 + 2 + 3 + 'a' }}";
  EXPECT_EQ(error_of([&] { render(source); }),
            "ChatTemplate::render: template line 501, column 314: expected operands that support '+', got an int 6 "
            "and a str 'a'");
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
