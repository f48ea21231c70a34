// text/jinja_parse.cpp — the parser of the Jinja subset (text/jinja.h): tokens (jinja_lex.h) into
// a tree of Nodes, with jinja2's grammar and precedence (filters and tests bind tighter than
// arithmetic, `**` is left-associative, `not` below comparisons).
//
// Node layouts (kids): Output [expr]; Block [stmt...]; If [cond, body, cond, body, ..., else?];
// For [iter, body, filter or null, else or null] with names = targets; Set [expr] with names =
// targets (str = attribute for `set ns.attr`); SetBlock [body]; Macro [default or null per param...,
// body] with names = params; Attr [obj]; Item [obj, index]; Slice [obj, start?, stop?, step?];
// Call [callee, args...] and Filter/Test [input, args...] with names = keyword per arg ("" when
// positional); Unary [x]; Binary [a, b]; Cond [then, cond, else?].
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "mhsa/error.h"
#include "text/jinja.h"
#include "text/jinja_lex.h"

namespace mhsa::jinja {
namespace {

class Parser {
 public:
  explicit Parser(Lexed lexed) : src_(std::move(lexed.source)), t_(std::move(lexed.tokens)) { index_lines(); }

  NodePtr parse_template() {
    std::string end;
    NodePtr body = parse_body({}, end);
    return body;
  }

 private:
  // ---- helpers ----
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == T::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == T::Name && cur().text == name; }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case T::End: return "the end of the template";
      case T::Text: return "text";
      case T::VarBegin: return "'{{'";
      case T::BlockBegin: return "'{%'";
      case T::VarEnd: return "'}}'";
      case T::BlockEnd: return "'%}'";
      case T::String: return "a string";
      default: return "'" + t.text.substr(0, 40) + "'";
    }
  }
  [[noreturn]] void error(const std::string& expected) const { source_error(src_, cur().pos, expected, describe(cur())); }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("'") + op + "'");
    ++i_;
  }
  void expect(T type, const char* what) {
    if (cur().type != type) error(what);
    ++i_;
  }
  std::string expect_name(const char* what = "a name") {
    if (cur().type != T::Name) error(what);
    return t_[i_++].text;
  }
  NodePtr node(N kind, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    locate(*n, at.pos);
    return n;
  }
  // Line and column of every kMarkBytes-th byte of the source, so that locating a node costs at
  // most kMarkBytes - 1 steps wherever its token is. Nodes are not made in source order (`a + b`'s
  // node comes after b's), and recounting from the start for each such node made compiling
  // quadratic: a 1.5 MB template took 57 s.
  static constexpr size_t kMarkBytes = 64;
  void index_lines() {
    marks_.reserve(src_.size() / kMarkBytes + 1);
    int line = 1, col = 1;
    for (size_t p = 0;; ++p) {
      if (p % kMarkBytes == 0) marks_.emplace_back(line, col);
      if (p == src_.size()) break;
      step(src_[p], line, col);
    }
  }
  static void step(char c, int& line, int& col) {
    if (c == '\n') ++line, col = 1;
    else if ((static_cast<unsigned char>(c) >> 6) != 2) ++col;  // columns count characters
  }
  void locate(Node& n, size_t pos) {
    auto [line, col] = marks_[pos / kMarkBytes];
    for (size_t p = pos / kMarkBytes * kMarkBytes; p < pos; ++p) step(src_[p], line, col);
    n.line = line, n.col = col;
  }
  // Adds an operand to an expression node. Chains (a + b + …, x|f|g, a.b.c, a[i][j], f()()) are
  // parsed by loops, so Deeper does not see them, but everything that walks the tree they build
  // (scopes, rendering, destruction) recurses: an 8,000-term sum crashed on the stack. Their
  // height is bounded here, as each node is built, so no tree deeper than the bound ever exists.
  void adopt(Node& n, NodePtr kid) {
    if (kid && kid->height >= n.height) {
      n.height = kid->height + 1;
      if (n.height > kMaxTreeDepth)
        source_error(src_, cur().pos,
                     detail::message("an expression at most ", kMaxTreeDepth,
                                     " levels deep (each operator, filter, test, attribute, subscript or call of a "
                                     "chain is a level)"),
                     "a deeper one");
    }
    n.kids.push_back(std::move(kid));
  }
  struct Deeper {
    explicit Deeper(Parser& p) : p(p) {
      if (++p.depth_ > kMaxParseDepth) p.error(detail::message("at most ", kMaxParseDepth, " levels of nesting"));
    }
    ~Deeper() { --p.depth_; }
    Parser& p;
  };

 private:
  // ---- statements ----
  // Statements up to a `{% name %}` in `ends` (or the end of the template when ends is empty);
  // `end` gets the name, the tag's '%}' not yet consumed.
  NodePtr parse_body(const std::vector<std::string>& ends, std::string& end) {
    Deeper d(*this);
    NodePtr block = node(N::Block, cur());
    for (;;) {
      const Token& tok = cur();
      const auto want = [&] {
        std::string w;
        for (const auto& e : ends) w += (w.empty() ? "'{% " : " or '{% ") + e + " %}'";
        return w.empty() ? std::string("a statement") : w;
      };
      if (tok.type == T::End) {
        if (!ends.empty()) error(want());
        return block;
      }
      if (tok.type == T::Text) {
        NodePtr n = node(N::Text, tok);
        n->str = tok.text;
        block->kids.push_back(std::move(n));
        ++i_;
      } else if (tok.type == T::VarBegin) {
        ++i_;
        NodePtr n = node(N::Output, tok);
        n->kids.push_back(parse_tuple());
        expect(T::VarEnd, "'}}'");
        block->kids.push_back(std::move(n));
      } else {
        ++i_;
        const std::string name = expect_name("a statement name");
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
          end = name;
          return block;
        }
        if (name.rfind("end", 0) == 0 || name == "else" || name == "elif")
          source_error(src_, t_[i_ - 1].pos, want(), "'{% " + name.substr(0, 40) + " %}'");
        block->kids.push_back(parse_statement(name, tok));
      }
    }
  }

  NodePtr parse_statement(const std::string& name, const Token& at) {
    if (name == "if") return parse_if(at);
    if (name == "for") return parse_for(at);
    if (name == "set") return parse_set(at);
    if (name == "macro") return parse_macro(at);
    if (name == "break" || name == "continue") {
      if (loops_ == 0) source_error(src_, at.pos, "'" + name + "' inside a for loop", "it outside one");
      NodePtr n = node(name == "break" ? N::Break : N::Continue, at);
      expect(T::BlockEnd, "'%}'");
      return n;
    }
    if (name == "generation") {  // transformers' assistant-mask tag: renders its body
      expect(T::BlockEnd, "'%}'");
      std::string end;
      NodePtr body = parse_body({"endgeneration"}, end);
      expect(T::BlockEnd, "'%}'");
      return body;
    }
    source_error(src_, at.pos + 2, "a statement this interpreter supports (if, for, set, macro, break, continue, generation)",
                 "'" + name.substr(0, 40) + "'");
  }

  NodePtr parse_if(const Token& at) {
    NodePtr n = node(N::If, at);
    for (;;) {
      n->kids.push_back(parse_tuple());
      expect(T::BlockEnd, "'%}'");
      std::string end;
      n->kids.push_back(parse_body({"elif", "else", "endif"}, end));
      if (end == "elif") continue;
      if (end == "else") {
        expect(T::BlockEnd, "'%}'");
        n->kids.push_back(parse_body({"endif"}, end));
      }
      expect(T::BlockEnd, "'%}'");
      return n;
    }
  }

  void parse_targets(Node& n) {
    const bool paren = is_op("(");
    if (paren) ++i_;
    n.names.push_back(expect_name("a loop variable"));
    while (is_op(",")) {
      ++i_;
      n.flag = true;
      if (cur().type != T::Name) break;
      n.names.push_back(expect_name());
    }
    if (paren) expect_op(")");
  }

  NodePtr parse_for(const Token& at) {
    NodePtr n = node(N::For, at);
    parse_targets(*n);
    if (!is_name("in")) error("'in'");
    ++i_;
    n->kids.push_back(parse_tuple(/*no_condexpr=*/true));
    NodePtr filter;
    if (is_name("if")) {
      ++i_;
      filter = parse_expression();
    }
    if (is_name("recursive")) error("'%}' (recursive loops are not supported)");
    expect(T::BlockEnd, "'%}'");
    ++loops_;
    std::string end;
    NodePtr body = parse_body({"else", "endfor"}, end);
    --loops_;
    NodePtr otherwise;
    if (end == "else") {
      expect(T::BlockEnd, "'%}'");
      const int saved = loops_;
      loops_ = 0;  // `else` runs outside the loop
      otherwise = parse_body({"endfor"}, end);
      loops_ = saved;
    }
    expect(T::BlockEnd, "'%}'");
    n->kids.push_back(std::move(body));
    n->kids.push_back(std::move(filter));
    n->kids.push_back(std::move(otherwise));
    return n;
  }

  NodePtr parse_set(const Token& at) {
    NodePtr n = node(N::Set, at);
    n->names.push_back(expect_name("a variable name"));
    if (is_op(".")) {
      ++i_;
      n->str = expect_name("an attribute name");
    } else {
      while (is_op(",")) {
        ++i_;
        n->flag = true;
        n->names.push_back(expect_name());
      }
    }
    if (cur().type == T::BlockEnd && n->str.empty() && !n->flag) {
      ++i_;
      n->kind = N::SetBlock;
      std::string end;
      n->kids.push_back(parse_body({"endset"}, end));
      expect(T::BlockEnd, "'%}'");
      return n;
    }
    expect_op("=");
    n->kids.push_back(parse_tuple());
    expect(T::BlockEnd, "'%}'");
    return n;
  }

  NodePtr parse_macro(const Token& at) {
    NodePtr n = node(N::Macro, at);
    n->str = expect_name("a macro name");
    expect_op("(");
    while (!is_op(")")) {
      if (!n->names.empty()) expect_op(",");
      if (is_op(")")) break;
      n->names.push_back(expect_name("a parameter name"));
      NodePtr def;
      if (is_op("=")) {
        ++i_;
        def = parse_expression();
      } else if (n->kids.size() && n->kids.back()) {
        error("a default value (parameters after one with a default need one)");
      }
      n->kids.push_back(std::move(def));
    }
    ++i_;
    expect(T::BlockEnd, "'%}'");
    const int saved = loops_;
    loops_ = 0;
    std::string end;
    n->kids.push_back(parse_body({"endmacro"}, end));
    loops_ = saved;
    if (cur().type == T::Name) ++i_;  // {% endmacro name %}
    expect(T::BlockEnd, "'%}'");
    return n;
  }

  // ---- expressions ----
  // expr [, expr ...] as a tuple (in outputs, `if` conditions, `set` values, `for` iterables).
  NodePtr parse_tuple(bool no_condexpr = false) {
    const Token& at = cur();
    NodePtr first = no_condexpr ? parse_or() : parse_expression();
    if (!is_op(",")) return first;
    NodePtr t = node(N::TupleLit, at);
    adopt(*t, std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type == T::VarEnd || cur().type == T::BlockEnd || is_op(")") || is_name("if")) break;
      adopt(*t, no_condexpr ? parse_or() : parse_expression());
    }
    return t;
  }

  NodePtr parse_expression() {
    Deeper d(*this);
    const Token& at = cur();
    NodePtr x = parse_or();
    while (is_name("if")) {
      ++i_;
      NodePtr c = node(N::Cond, at);
      adopt(*c, std::move(x));
      adopt(*c, parse_or());
      NodePtr otherwise;
      if (is_name("else")) {
        ++i_;
        otherwise = parse_expression();
      }
      adopt(*c, std::move(otherwise));
      x = std::move(c);
    }
    return x;
  }

  NodePtr binary(const Token& at, std::string op, NodePtr a, NodePtr b) {
    NodePtr n = node(N::Binary, at);
    n->str = std::move(op);
    adopt(*n, std::move(a));
    adopt(*n, std::move(b));
    return n;
  }

  NodePtr parse_or() {
    NodePtr x = parse_and();
    while (is_name("or")) {
      const Token& at = t_[i_++];
      x = binary(at, "or", std::move(x), parse_and());
    }
    return x;
  }
  NodePtr parse_and() {
    NodePtr x = parse_not();
    while (is_name("and")) {
      const Token& at = t_[i_++];
      x = binary(at, "and", std::move(x), parse_not());
    }
    return x;
  }
  NodePtr parse_not() {
    if (is_name("not")) {
      Deeper d(*this);
      NodePtr n = node(N::Unary, t_[i_++]);
      n->str = "not";
      adopt(*n, parse_not());
      return n;
    }
    return parse_compare();
  }
  NodePtr parse_compare() {
    NodePtr x = parse_math1();
    for (;;) {
      const Token& at = cur();
      std::string op;
      if (cur().type == T::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == T::Name && peek().text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        return x;
      }
      x = binary(at, op, std::move(x), parse_math1());  // chained comparisons: (a < b) < c, as jinja2 does not
    }
  }
  NodePtr parse_math1() {
    NodePtr x = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = t_[i_++];
      x = binary(at, at.text, std::move(x), parse_concat());
    }
    return x;
  }
  NodePtr parse_concat() {
    NodePtr x = parse_math2();
    while (is_op("~")) {
      const Token& at = t_[i_++];
      x = binary(at, "~", std::move(x), parse_math2());
    }
    return x;
  }
  NodePtr parse_math2() {
    NodePtr x = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = t_[i_++];
      x = binary(at, at.text, std::move(x), parse_pow());
    }
    return x;
  }
  NodePtr parse_pow() {
    NodePtr x = parse_unary(true);
    while (is_op("**")) {
      const Token& at = t_[i_++];
      x = binary(at, "**", std::move(x), parse_unary(true));
    }
    return x;
  }
  NodePtr parse_unary(bool with_filter) {
    Deeper d(*this);
    NodePtr x;
    if (is_op("-") || is_op("+")) {
      x = node(N::Unary, cur());
      x->str = t_[i_++].text;
      adopt(*x, parse_unary(false));
    } else {
      x = parse_postfix(parse_primary());
    }
    if (with_filter) x = parse_filter_expr(std::move(x));
    return x;
  }

  NodePtr parse_primary() {
    Deeper d(*this);
    const Token& at = cur();
    switch (at.type) {
      case T::Name: {
        ++i_;
        NodePtr n = node(N::Literal, at);
        if (at.text == "true" || at.text == "True") n->value = Value::boolean(true);
        else if (at.text == "false" || at.text == "False") n->value = Value::boolean(false);
        else if (at.text == "none" || at.text == "None") n->value = Value::none();
        else n->kind = N::Name, n->str = at.text;
        return n;
      }
      case T::String: {
        NodePtr n = node(N::Literal, at);
        std::string s;
        while (cur().type == T::String) s += t_[i_++].text;  // adjacent literals join
        n->value = Value::str(std::move(s));
        return n;
      }
      case T::Int: {
        ++i_;
        NodePtr n = node(N::Literal, at);
        int64_t v = 0;
        for (char c : at.text)
          if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v))
            source_error(src_, at.pos, "an integer below 2^63", "'" + at.text.substr(0, 40) + "'");
        n->value = Value::integer(v);
        return n;
      }
      case T::Float: {
        ++i_;
        NodePtr n = node(N::Literal, at);
        n->value = Value::number(std::strtod(at.text.c_str(), nullptr));
        return n;
      }
      case T::Op:
        if (at.text == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            return node(N::TupleLit, at);
          }
          NodePtr x = parse_expression();
          if (is_op(",")) {
            NodePtr t = node(N::TupleLit, at);
            adopt(*t, std::move(x));
            while (is_op(",")) {
              ++i_;
              if (is_op(")")) break;
              adopt(*t, parse_expression());
            }
            x = std::move(t);
          }
          expect_op(")");
          return x;
        }
        if (at.text == "[") {
          ++i_;
          NodePtr n = node(N::ListLit, at);
          while (!is_op("]")) {
            if (!n->kids.empty()) expect_op(",");
            if (is_op("]")) break;
            adopt(*n, parse_expression());
          }
          ++i_;
          return n;
        }
        if (at.text == "{") {
          ++i_;
          NodePtr n = node(N::DictLit, at);
          while (!is_op("}")) {
            if (!n->kids.empty()) expect_op(",");
            if (is_op("}")) break;
            adopt(*n, parse_expression());
            expect_op(":");
            adopt(*n, parse_expression());
          }
          ++i_;
          return n;
        }
        break;
      default:
        break;
    }
    error("an expression");
  }

  NodePtr parse_postfix(NodePtr x) {
    for (;;) {
      const Token& at = cur();
      if (is_op(".")) {
        ++i_;
        NodePtr n = node(N::Attr, at);
        if (cur().type == T::Name) {
          n->str = t_[i_++].text;
        } else if (cur().type == T::Int) {  // x.0 is x[0]
          n->kind = N::Item;
          NodePtr idx = node(N::Literal, cur());
          idx->value = Value::integer(std::strtoll(t_[i_++].text.c_str(), nullptr, 10));
          adopt(*n, std::move(x));
          adopt(*n, std::move(idx));
          x = std::move(n);
          continue;
        } else {
          error("an attribute name");
        }
        adopt(*n, std::move(x));
        x = std::move(n);
      } else if (is_op("[")) {
        ++i_;
        x = parse_subscript(at, std::move(x));
      } else if (is_op("(")) {
        x = parse_call(std::move(x));
      } else {
        return x;
      }
    }
  }

  NodePtr parse_subscript(const Token& at, NodePtr obj) {
    Deeper d(*this);
    NodePtr parts[3];
    int colons = 0;
    for (;;) {
      if (is_op("]")) break;
      if (is_op(":")) {
        if (++colons > 2) error("']'");
        ++i_;
        continue;
      }
      if (parts[colons]) error(colons ? "']'" : "':' or ']'");
      parts[colons] = parse_expression();
    }
    ++i_;
    if (colons == 0) {
      if (!parts[0]) error("an index");
      NodePtr n = node(N::Item, at);
      adopt(*n, std::move(obj));
      adopt(*n, std::move(parts[0]));
      return n;
    }
    NodePtr n = node(N::Slice, at);
    adopt(*n, std::move(obj));
    for (auto& p : parts) adopt(*n, std::move(p));
    return n;
  }

  // (args) into n->kids and n->names, after kids[0].
  void parse_args(Node& n) {
    expect_op("(");
    bool kw_seen = false;
    while (!is_op(")")) {
      if (n.kids.size() > 1) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error("an argument (*args and **kwargs are not supported)");
      if (cur().type == T::Name && peek().type == T::Op && peek().text == "=") {
        n.names.push_back(t_[i_].text);
        i_ += 2;
        kw_seen = true;
      } else {
        if (kw_seen) error("a keyword argument (positional arguments come first)");
        n.names.emplace_back();
      }
      adopt(n, parse_expression());
    }
    ++i_;
  }

  NodePtr parse_call(NodePtr callee) {
    Deeper d(*this);
    NodePtr n = node(N::Call, cur());
    n->line = callee->line, n->col = callee->col;
    adopt(*n, std::move(callee));
    parse_args(*n);
    return n;
  }

  NodePtr parse_filter_expr(NodePtr x) {
    for (;;) {
      const Token& at = cur();
      if (is_op("|")) {
        ++i_;
        Deeper d(*this);
        NodePtr n = node(N::Filter, at);
        n->str = expect_name("a filter name");
        adopt(*n, std::move(x));
        if (is_op("(")) parse_args(*n);
        x = std::move(n);
      } else if (is_name("is")) {
        ++i_;
        Deeper d(*this);
        NodePtr n = node(N::Test, at);
        if (is_name("not")) ++i_, n->flag = true;
        n->str = expect_name("a test name");
        adopt(*n, std::move(x));
        if (is_op("(")) {
          parse_args(*n);
        } else if ((cur().type == T::Name && !is_name("else") && !is_name("or") && !is_name("and") &&
                    !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is")) ||
                   cur().type == T::String || cur().type == T::Int || cur().type == T::Float ||
                   is_op("(") || is_op("[") || is_op("{")) {
          n->names.emplace_back();
          adopt(*n, parse_postfix(parse_primary()));
        }
        x = std::move(n);
      } else if (is_op("(")) {
        x = parse_call(std::move(x));
      } else {
        return x;
      }
    }
  }

  std::string src_;
  std::vector<Token> t_;
  size_t i_ = 0;
  std::vector<std::pair<int, int>> marks_;  // (line, column) at every kMarkBytes-th byte
  int depth_ = 0;
  int loops_ = 0;
};

}  // namespace

NodePtr parse(std::string_view source) {
  NodePtr root = Parser(lex(source)).parse_template();
  analyze_scopes(*root);
  return root;
}

}  // namespace mhsa::jinja
