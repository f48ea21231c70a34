// text/jinja.h — an interpreter for the subset of Jinja that chat templates use, with the
// environment transformers renders them in (trim_blocks, lstrip_blocks, loop controls, the
// `raise_exception` and `strftime_now` globals, its `tojson`, an immutable sandbox). Shared by the
// lexer and parser (jinja_lex.cpp, jinja_parse.cpp), the evaluator (jinja_eval.cpp), the values
// (jinja_values.cpp) and the builtins (jinja_builtins.cpp).
// Not a general template engine: no inheritance, includes, imports, autoescaping or `call` blocks;
// integers are 64-bit (overflow is an error) and case mappings are ASCII only.
//
// Everything is bounded so that a hostile template or input cannot crash or hang: parse nesting,
// value nesting, macro recursion, string and list sizes, the output and the total work. Every
// failure is an mhsa::Error naming the template line and column.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mhsa::jinja {

// ---- limits ---------------------------------------------------------------------------------
constexpr int kMaxParseDepth = 100;          // nested expressions and statements
constexpr int kMaxTreeDepth = 256;           // an expression's tree: each link of a chain (a + b + …,
                                             // x|f|g, a.b.c, a[i][j], f()()) is a level
constexpr int kMaxEvalDepth = 1000;          // nodes evaluated inside one another, macro bodies
                                             // included (~1.5 KB of stack each)
constexpr int kMaxValueDepth = 100;          // lists and dicts inside one another
constexpr int kMaxCallDepth = 50;            // macro calls inside macro calls
constexpr size_t kMaxSourceBytes = 1 << 20;   // the template's text: compiling is linear, ~0.3 s
                                              // and ~120 MB of tree at 1 MiB of `{{ 1 + 2 }}`;
                                              // real chat templates are under 20 KB
constexpr size_t kMaxStringBytes = 64 << 20;  // any one string, the output included
constexpr size_t kMaxItems = 1 << 20;         // any one list or dict
constexpr int64_t kMaxRange = 100000;        // range(), as jinja2's sandbox
constexpr int64_t kWorkBudget = 10'000'000;   // nodes evaluated + bytes and items built / 16

// ---- values ---------------------------------------------------------------------------------
struct Value;
struct Node;
struct Scope;
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

struct List {
  std::vector<Value> items;
  bool tuple = false;
  // What Python would hold instead of a list: "dict_keys"/"dict_values"/"dict_items" (printed
  // so), or "generator" (select, map, reverse...: always true, no length, not printable).
  const char* view = nullptr;
  int depth = 1;
  bool holds_namespace = false;  // an item is a namespace() or holds one
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, keys unique
  bool is_namespace = false;                           // the only mutable object
  int depth = 1;
  bool holds_namespace = false;  // a value is a namespace() or holds one
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

// A callable: a global function (name), a bound method (name + self) or a macro.
struct Func {
  std::string name;
  std::shared_ptr<const Value> self;          // bound methods
  const Node* macro = nullptr;                // macros
  std::shared_ptr<Scope> closure;             // macros: where they were defined
};

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, Str, List, Dict, Func };

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str; Undefined: why it is undefined ("'x' is undefined"), for errors
  std::shared_ptr<const List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<const Func> fn;

  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value str(std::string x) { Value v; v.kind = Kind::Str; v.s = std::move(x); return v; }
  static Value undefined(std::string why) { Value v; v.s = std::move(why); return v; }
  bool undef() const { return kind == Kind::Undefined; }
  bool is_num() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  int depth() const { return list ? list->depth : dict ? dict->depth : 0; }
  // Whether this is a namespace() or a list or dict holding one. A namespace attribute may not be
  // set to such a value: namespaces are the only mutable objects, so none can come to hold itself
  // (a cycle of shared pointers, never freed).
  bool reaches_namespace() const {
    return (dict && (dict->is_namespace || dict->holds_namespace)) || (list && list->holds_namespace);
  }
};

// ---- syntax tree ----------------------------------------------------------------------------
enum class N : uint8_t {
  // statements
  Text, Output, Block, If, For, Set, SetBlock, Macro, Break, Continue,
  // expressions
  Literal, Name, ListLit, TupleLit, DictLit, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, Cond,
};

struct Node {
  N kind;
  int line = 0, col = 0;
  std::string str;                         // text, name, operator, attribute, filter/test name
  Value value;                             // Literal
  std::vector<std::unique_ptr<Node>> kids; // operands, bodies (see jinja_parse.cpp per kind)
  std::vector<std::string> names;          // kwarg names (calls), targets (for/set), params (macro)
  bool flag = false;                       // Test: negated; For/Set: tuple target
  std::vector<std::string> missing;        // the template's Block, For, Macro: names its frame
                                           // starts with as undefined (jinja_scopes.cpp)
  int height = 1;                          // expressions: levels from this node down (bounded
                                           // by kMaxTreeDepth at parse)
};
using NodePtr = std::unique_ptr<Node>;

// Parses `source` (the template text) into a Block. Throws mhsa::Error
// "ChatTemplate: source: line L, column C: expected ..., got ...".
NodePtr parse(std::string_view source);

// Fills Node::missing for the template and every loop and macro in it, as jinja2's compiler
// scopes names (called by parse).
void analyze_scopes(Node& root);

// Renders a parsed template with `vars` (a JSON object: messages, add_generation_prompt, ...) as
// its context, the transformers globals beside them.
std::string render(const Node& root, const nlohmann::ordered_json& vars);

// ---- shared by the evaluator and the builtins ---------------------------------------------
// Where an error happened, for messages.
[[noreturn]] void fail_at(const Node& at, const std::string& what);

// Variables: a chain of scopes. A for loop's iteration and a macro call open one; `if` does not.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* lookup(std::string_view name) const;
  void set(const std::string& name, Value v);
};

// One render: the scope chain, the output being written, the work done.
struct Evaluator {
  enum class Flow { Normal, Break, Continue };
  std::shared_ptr<Scope> scope;
  std::string* out = nullptr;
  int64_t work = 0;
  int call_depth = 0;
  int depth = 0;  // eval/exec calls in progress, bounded by kMaxEvalDepth
  // Scopes that hold a macro: the macro's closure points back at them, a cycle render() breaks.
  std::vector<std::shared_ptr<Scope>> macro_scopes;

  Value eval(const Node& n);
  Flow exec(const Node& n);
  Value call(const Node& at, const Value& callee, Args args, Kwargs kwargs);
  // Counts work (nodes, bytes / 16, items) against kWorkBudget.
  void charge(const Node& at, size_t units);

 private:
  Value eval_binary(const Node& n);
  Value eval_attr(const Node& n, const Value& obj, const std::string& name);
  Value eval_item(const Node& n, const Value& obj, const Value& key);
  Value eval_slice(const Node& n);
  Flow exec_for(const Node& n);
  void exec_set(const Node& n);
  Value call_macro(const Node& at, const Func& f, Args args, Kwargs kwargs);
  void emit(const Node& at, std::string_view s);
};

bool truthy(const Value& v);
inline bool is_generator(const Value& v) { return v.list && v.list->view && v.list->view[0] == 'g'; }
// `list` as one of Python's views or a generator (List::view).
Value as_view(Value list, const char* view);
std::string to_str(const Node& at, const Value& v);  // Python str(); undefined is ""
std::string repr(const Node& at, const Value& v);    // Python repr()
std::string type_name(const Value& v);              // Python's type name: 'str', 'dict', ...
std::string excerpt(const Value& v);                // for messages: "a str 'abc…'"
bool equal(const Value& a, const Value& b);
// Python's <, or an error for types that do not order.
bool less(const Node& at, const Value& a, const Value& b);
Value make_list(const Node& at, std::vector<Value> items, bool tuple = false);
Value make_dict(const Node& at, std::vector<std::pair<std::string, Value>> items);
Value from_json(const nlohmann::ordered_json& j);
// Python's float repr: "1.0", "1e+20", "0.0001".
std::string float_repr(double x);
// Python's str.strip / lstrip / rstrip: whitespace (Python's isspace set; chars = nullptr) or any
// code point of `chars`, from the left and/or the right.
std::string strip(const std::string& s, const std::string* chars, bool left, bool right);
// Code points of UTF-8 text (the source and JSON strings are valid UTF-8).
std::vector<std::string_view> code_points(std::string_view s);
// The items a for loop or a filter walks: a list's items, a dict's keys, a string's characters.
std::vector<Value> iterate(const Node& at, const Value& v);
void check_size(const Node& at, size_t bytes);

// Builtins. `args` are positional, `kwargs` named; each checks its arguments.
Value call_filter(Evaluator& ev, const Node& at, const std::string& name, const Value& input, Args args,
                  Kwargs kwargs);
bool call_test(Evaluator& ev, const Node& at, const std::string& name, const Value& input, const Args& args);
bool has_test(const std::string& name);
// A string's or a dict's method (`s.strip`, `d.items`), or undefined when there is none.
Value method(const Value& self, const std::string& name);
Value call_method(Evaluator& ev, const Node& at, const Func& f, Args args, Kwargs kwargs);
std::string tojson(const Node& at, const Value& v, const Value& indent, bool sort_keys, bool ensure_ascii,
                   const std::string& item_sep, const std::string& key_sep);

}  // namespace mhsa::jinja
