// text/jinja_eval.cpp — the evaluator of the Jinja subset (text/jinja.h): statements, expressions,
// scopes, macros and the globals transformers gives chat templates (raise_exception,
// strftime_now, namespace, dict, range). Semantics follow jinja2 3.1 under transformers'
// ImmutableSandboxedEnvironment: Python's operators and truthiness, jinja2's Undefined (printing
// gives "", using it in arithmetic or reading its attributes fails), a scope per loop iteration
// (a `set` inside a loop does not leak; `namespace` attributes do), macros that see their
// defining scope as it is when they are called. Not here: filters, tests, methods and value
// formatting (jinja_builtins.cpp).
#include <cmath>
#include <ctime>
#include <string>
#include <vector>

#include "mhsa/error.h"
#include "text/jinja.h"

namespace mhsa::jinja {

void fail_at(const Node& at, const std::string& what) {
  throw Error(detail::message("ChatTemplate::render: template line ", at.line, ", column ", at.col, ": ", what));
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

namespace {
// The value of a name with no binding (built by appends: GCC 12 warns on "'" + name + "'").
Value undefined_name(std::string_view name) {
  std::string what = "'";
  what += name;
  what += "' is undefined";
  return Value::undefined(std::move(what));
}
}  // namespace

const Value* Scope::lookup(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

void Evaluator::charge(const Node& at, size_t units) {
  work += static_cast<int64_t>(std::min<size_t>(units, kWorkBudget));
  if (work > kWorkBudget)
    fail_at(at, detail::message("expected a template that renders within ", kWorkBudget,
                                " steps, got one that takes more (a loop too long or strings too large)"));
}

void Evaluator::emit(const Node& at, std::string_view s) {
  if (out->size() + s.size() > kMaxStringBytes)
    fail_at(at, detail::message("expected output of at most ", kMaxStringBytes, " bytes, got more"));
  charge(at, s.size() / 16);
  out->append(s);
}

namespace {

Value func(std::string name) {
  Value v;
  v.kind = Kind::Func;
  auto f = std::make_shared<Func>();
  f->name = std::move(name);
  v.fn = std::move(f);
  return v;
}

[[noreturn]] void fail_undefined(const Node& at, const Value& v) { fail_at(at, v.s.empty() ? "undefined value" : v.s); }

int64_t as_int(const Node& at, const Value& v, const char* what) {
  if (v.kind == Kind::Int) return v.i;
  if (v.kind == Kind::Bool) return v.b;
  if (v.undef()) fail_undefined(at, v);
  fail_at(at, detail::message("expected an integer ", what, ", got ", excerpt(v)));
}

double as_float(const Value& v) { return v.kind == Kind::Float ? v.f : v.kind == Kind::Bool ? v.b : static_cast<double>(v.i); }

// Python's floor division and modulo.
int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

Value arithmetic(const Node& at, const std::string& op, const Value& a, const Value& b) {
  const auto unsupported = [&]() -> Value {
    fail_at(at, detail::message("expected operands that support '", op, "', got ", excerpt(a), " and ", excerpt(b)));
  };
  // Python's '%' string formatting is refused whatever its right side (jinja2 would format with an
  // undefined one too: Undefined passes for a mapping).
  if (op == "%" && a.kind == Kind::Str) unsupported();
  if (a.undef()) fail_undefined(at, a);
  if (b.undef()) fail_undefined(at, b);
  if (a.is_num() && b.is_num()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float && op != "/") {
      const int64_t x = a.kind == Kind::Bool ? a.b : a.i, y = b.kind == Kind::Bool ? b.b : b.i;
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
      else if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
      else if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
      else if (op == "//" || op == "%") {
        if (y == 0) fail_at(at, "expected a nonzero divisor, got 0");
        if (x == INT64_MIN && y == -1) overflow = true;
        else r = op == "//" ? floor_div(x, y) : x - floor_div(x, y) * y;
      } else if (op == "**") {
        if (y < 0) return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
        r = 1;
        for (int64_t k = 0; k < y && !overflow; ++k) {
          overflow = __builtin_mul_overflow(r, x, &r);
          if (r == 0 || r == 1 || (r == -1 && x == -1)) {  // the rest is known
            if (x == -1) r = (y % 2) ? -1 : 1;
            break;
          }
        }
      }
      if (overflow) fail_at(at, detail::message("expected results within 64-bit integers, got an overflow in '", op, "'"));
      return Value::integer(r);
    }
    const double x = as_float(a), y = as_float(b);
    if ((op == "/" || op == "//" || op == "%") && y == 0) fail_at(at, "expected a nonzero divisor, got 0");
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "/") return Value::number(x / y);
    if (op == "//") return Value::number(std::floor(x / y));
    if (op == "%") {
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::number(r);
    }
    if (op == "**") {
      if (x < 0 && y != std::floor(y)) fail_at(at, "expected a real result of '**', got a complex one");
      if (x == 0 && y < 0) fail_at(at, "expected a nonzero base for a negative power, got 0");
      return Value::number(std::pow(x, y));
    }
  }
  if (op == "+" && a.kind == Kind::Str && b.kind == Kind::Str) {
    check_size(at, a.s.size() + b.s.size());
    return Value::str(a.s + b.s);
  }
  if (op == "+" && a.list && b.list && a.list->tuple == b.list->tuple) {
    std::vector<Value> items = a.list->items;
    items.insert(items.end(), b.list->items.begin(), b.list->items.end());
    return make_list(at, std::move(items), a.list->tuple);
  }
  if (op == "*" && ((a.kind == Kind::Str || a.list) && (b.kind == Kind::Int || b.kind == Kind::Bool)))
    return arithmetic(at, op, b, a);
  if (op == "*" && (a.kind == Kind::Int || a.kind == Kind::Bool) && (b.kind == Kind::Str || b.list)) {
    const int64_t n = std::max<int64_t>(0, a.kind == Kind::Bool ? a.b : a.i);
    const size_t unit = b.kind == Kind::Str ? b.s.size() : b.list->items.size();
    if (unit && static_cast<uint64_t>(n) > (b.kind == Kind::Str ? kMaxStringBytes : kMaxItems) / unit)
      fail_at(at, detail::message("expected a repetition of at most ", b.kind == Kind::Str ? kMaxStringBytes : kMaxItems,
                                  b.kind == Kind::Str ? " bytes" : " items", ", got ", n, " × ", unit));
    if (b.kind == Kind::Str) {
      std::string s;
      s.reserve(unit * static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) s += b.s;
      return Value::str(std::move(s));
    }
    std::vector<Value> items;
    for (int64_t k = 0; k < n; ++k) items.insert(items.end(), b.list->items.begin(), b.list->items.end());
    return make_list(at, std::move(items), b.list->tuple);
  }
  return unsupported();
}

bool contains(const Node& at, const Value& needle, const Value& hay) {
  if (hay.kind == Kind::Str) {
    if (needle.kind != Kind::Str)
      fail_at(at, detail::message("expected a string on the left of 'in' a string, got ", excerpt(needle)));
    return hay.s.find(needle.s) != std::string::npos;
  }
  if (hay.list) {
    for (const Value& x : hay.list->items)
      if (equal(x, needle)) return true;
    return false;
  }
  if (hay.dict) {
    if ((needle.list && !needle.list->tuple) || needle.dict)
      fail_at(at, "expected a hashable value on the left of 'in' a mapping, got " + excerpt(needle));
    return needle.kind == Kind::Str && hay.dict->find(needle.s) != nullptr;
  }
  if (hay.undef()) return false;
  fail_at(at, detail::message("expected a string, list or mapping on the right of 'in', got ", excerpt(hay)));
}

// Python's slice indices for a sequence of n items.
std::vector<size_t> slice_indices(const Node& at, int64_t n, const Value& start, const Value& stop, const Value& step) {
  const int64_t st = step.kind == Kind::None || step.undef() ? 1 : as_int(at, step, "slice step");
  if (st == 0) fail_at(at, "expected a nonzero slice step, got 0");
  const auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.kind == Kind::None || v.undef()) return dflt;
    int64_t x = as_int(at, v, "slice index");
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

}  // namespace

Value Evaluator::eval_attr(const Node& n, const Value& obj, const std::string& name) {
  if (obj.undef()) fail_undefined(n, obj);
  if (obj.dict) {
    if (!obj.dict->is_namespace) {
      Value m = method(obj, name);  // Python attributes win over keys with `.`
      if (!m.undef()) return m;
    }
    if (const Value* v = obj.dict->find(name)) return *v;
    return Value::undefined(detail::message("'", type_name(obj), " object' has no attribute '", name, "'"));
  }
  Value m = method(obj, name);
  if (!m.undef()) return m;
  return Value::undefined(detail::message("'", type_name(obj), " object' has no attribute '", name, "'"));
}

Value Evaluator::eval_item(const Node& n, const Value& obj, const Value& key) {
  if (obj.undef()) fail_undefined(n, obj);
  if (obj.dict) {
    if (key.kind == Kind::Str) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
      if (!obj.dict->is_namespace) {
        Value m = method(obj, key.s);
        if (!m.undef()) return m;
      }
    }
    return Value::undefined(detail::message("'", type_name(obj), " object' has no attribute ", repr(n, key)));
  }
  if (((obj.list && !obj.list->view) || obj.kind == Kind::Str) && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
    const int64_t k = key.kind == Kind::Bool ? key.b : key.i;
    if (obj.list) {
      const auto size = static_cast<int64_t>(obj.list->items.size());
      const int64_t idx = k < 0 ? k + size : k;
      if (idx >= 0 && idx < size) return obj.list->items[static_cast<size_t>(idx)];
    } else {
      const std::vector<std::string_view> cps = code_points(obj.s);
      const auto size = static_cast<int64_t>(cps.size());
      const int64_t idx = k < 0 ? k + size : k;
      if (idx >= 0 && idx < size) return Value::str(std::string(cps[static_cast<size_t>(idx)]));
    }
    return Value::undefined(detail::message("'", type_name(obj), " object' has no element ", k));
  }
  if (key.kind == Kind::Str) return eval_attr(n, obj, key.s);
  return Value::undefined(detail::message("'", type_name(obj), " object' has no element ", repr(n, key)));
}

Value Evaluator::eval_slice(const Node& n) {
  const Value obj = eval(*n.kids[0]);
  Value parts[3];
  for (int k = 0; k < 3; ++k)
    if (n.kids[1 + k]) parts[k] = eval(*n.kids[1 + k]);
  if (obj.undef()) fail_undefined(n, obj);
  if (obj.kind == Kind::Str) {
    const std::vector<std::string_view> cps = code_points(obj.s);
    std::string s;
    for (size_t i : slice_indices(n, static_cast<int64_t>(cps.size()), parts[0], parts[1], parts[2])) s += cps[i];
    return Value::str(std::move(s));
  }
  if (!obj.list || is_generator(obj)) return Value::undefined("'" + type_name(obj) + " object' has no slice");  // as jinja2's getitem
  std::vector<Value> items;
  for (size_t i : slice_indices(n, static_cast<int64_t>(obj.list->items.size()), parts[0], parts[1], parts[2]))
    items.push_back(obj.list->items[i]);
  return make_list(n, std::move(items), obj.list->tuple);
}

Value Evaluator::eval_binary(const Node& n) {
  const std::string& op = n.str;
  const Value a = eval(*n.kids[0]);
  if (op == "and") return truthy(a) ? eval(*n.kids[1]) : a;
  if (op == "or") return truthy(a) ? a : eval(*n.kids[1]);
  const Value b = eval(*n.kids[1]);
  if (op == "~") {
    std::string s = to_str(n, a);
    const std::string t = to_str(n, b);
    check_size(n, s.size() + t.size());
    charge(n, (s.size() + t.size()) / 16);
    return Value::str(s + t);
  }
  if (op == "==") return Value::boolean(equal(a, b));
  if (op == "!=") return Value::boolean(!equal(a, b));
  if (op == "<") return Value::boolean(less(n, a, b));
  if (op == ">") return Value::boolean(less(n, b, a));
  if (op == "<=") return Value::boolean(!less(n, b, a));
  if (op == ">=") return Value::boolean(!less(n, a, b));
  if (op == "in") return Value::boolean(contains(n, a, b));
  if (op == "not in") return Value::boolean(!contains(n, a, b));
  Value r = arithmetic(n, op, a, b);
  if (r.kind == Kind::Str) charge(n, r.s.size() / 16);
  if (r.list) charge(n, r.list->items.size());
  return r;
}

namespace {
// One eval or exec call in progress. The parser bounds each expression's height, but macro bodies
// evaluate inside the calls that reach them, so the stack is bounded here as a whole.
struct Nested {
  Nested(Evaluator& ev, const Node& at) : ev(ev) {
    if (++ev.depth > kMaxEvalDepth) {
      --ev.depth;
      fail_at(at, detail::message("expected expressions and statements evaluated at most ", kMaxEvalDepth,
                                  " levels inside one another, got deeper (macro calls included)"));
    }
  }
  ~Nested() { --ev.depth; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;
  Evaluator& ev;
};
}  // namespace

Value Evaluator::eval(const Node& n) {
  charge(n, 1);
  const Nested nested(*this, n);
  switch (n.kind) {
    case N::Literal: return n.value;
    case N::Name: {
      if (const Value* v = scope->lookup(n.str)) return *v;
      return undefined_name(n.str);
    }
    case N::ListLit:
    case N::TupleLit: {
      std::vector<Value> items;
      for (const auto& k : n.kids) items.push_back(eval(*k));
      return make_list(n, std::move(items), n.kind == N::TupleLit);
    }
    case N::DictLit: {
      std::vector<std::pair<std::string, Value>> items;
      for (size_t k = 0; k < n.kids.size(); k += 2) {
        const Value key = eval(*n.kids[k]);
        if (key.kind != Kind::Str) fail_at(*n.kids[k], "expected a string as a dict key, got " + excerpt(key));
        Value v = eval(*n.kids[k + 1]);
        bool replaced = false;
        for (auto& [kk, vv] : items)
          if (kk == key.s) vv = v, replaced = true;
        if (!replaced) items.emplace_back(key.s, std::move(v));
      }
      return make_dict(n, std::move(items));
    }
    case N::Attr: return eval_attr(n, eval(*n.kids[0]), n.str);
    case N::Item: {
      const Value obj = eval(*n.kids[0]);
      return eval_item(n, obj, eval(*n.kids[1]));
    }
    case N::Slice: return eval_slice(n);
    case N::Call:
    case N::Filter:
    case N::Test: {
      const Value first = eval(*n.kids[0]);
      Args args;
      Kwargs kwargs;
      for (size_t k = 1; k < n.kids.size(); ++k) {
        Value v = eval(*n.kids[k]);
        if (n.names[k - 1].empty()) args.push_back(std::move(v));
        else kwargs.emplace_back(n.names[k - 1], std::move(v));
      }
      if (n.kind == N::Call) return call(n, first, std::move(args), std::move(kwargs));
      if (n.kind == N::Filter) return call_filter(*this, n, n.str, first, std::move(args), std::move(kwargs));
      if (!kwargs.empty()) fail_at(n, "expected positional arguments to a test, got keyword arguments");
      return Value::boolean(call_test(*this, n, n.str, first, args) != n.flag);
    }
    case N::Unary: {
      const Value x = eval(*n.kids[0]);
      if (n.str == "not") return Value::boolean(!truthy(x));
      if (x.undef()) fail_undefined(n, x);
      if (!x.is_num()) fail_at(n, detail::message("expected a number after unary '", n.str, "', got ", excerpt(x)));
      if (n.str == "+") return x.kind == Kind::Bool ? Value::integer(x.b) : x;
      if (x.kind == Kind::Float) return Value::number(-x.f);
      const int64_t v = x.kind == Kind::Bool ? x.b : x.i;
      if (v == INT64_MIN) fail_at(n, "expected results within 64-bit integers, got an overflow in unary '-'");
      return Value::integer(-v);
    }
    case N::Binary: return eval_binary(n);
    case N::Cond: {
      if (truthy(eval(*n.kids[1]))) return eval(*n.kids[0]);
      if (n.kids[2]) return eval(*n.kids[2]);
      return Value::undefined("the inline if expression evaluated to false and no else section was defined");
    }
    default: fail_at(n, "expected an expression, got a statement");
  }
}

Value Evaluator::call(const Node& at, const Value& callee, Args args, Kwargs kwargs) {
  if (callee.undef()) fail_undefined(at, callee);
  if (callee.kind != Kind::Func) fail_at(at, "expected something callable, got " + excerpt(callee));
  const Func& f = *callee.fn;
  if (f.macro) return call_macro(at, f, std::move(args), std::move(kwargs));
  if (f.self) return call_method(*this, at, f, std::move(args), std::move(kwargs));
  const auto want = [&](size_t lo, size_t hi, bool kw_ok) {
    if (args.size() < lo || args.size() > hi || (!kw_ok && !kwargs.empty()))
      fail_at(at, detail::message("expected ", lo == hi ? "" : "from ", lo, lo == hi ? "" : detail::message(" to ", hi),
                                  " positional arguments to ", f.name, "(), got ", args.size(),
                                  kwargs.empty() ? "" : " and keyword arguments"));
  };
  if (f.name == "raise_exception") {
    want(1, 1, false);
    std::string msg = to_str(at, args[0]);
    if (msg.size() > 500) msg = msg.substr(0, 500) + "…";
    fail_at(at, "raise_exception(" + repr(at, Value::str(msg)) + ")");
  }
  if (f.name == "strftime_now") {
    want(1, 1, false);
    if (args[0].kind != Kind::Str) fail_at(at, "expected a format string for strftime_now(), got " + excerpt(args[0]));
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t len = args[0].s.size() < 200 ? std::strftime(buf, sizeof buf, args[0].s.c_str(), &tm) : 0;
    if (len == 0 && !args[0].s.empty()) fail_at(at, "expected a strftime format giving at most 511 bytes, got " + excerpt(args[0]));
    return Value::str(std::string(buf, len));
  }
  if (f.name == "namespace" || f.name == "dict") {
    want(0, 1, true);
    std::vector<std::pair<std::string, Value>> items;
    if (!args.empty()) {
      if (!args[0].dict) fail_at(at, detail::message("expected a mapping for ", f.name, "(), got ", excerpt(args[0])));
      items = args[0].dict->items;
    }
    for (auto& [k, v] : kwargs) {
      bool replaced = false;
      for (auto& [kk, vv] : items)
        if (kk == k) vv = v, replaced = true;
      if (!replaced) items.emplace_back(k, v);
    }
    if (f.name == "namespace")
      for (const auto& [k, v] : items)
        if (!k.empty() && k[0] == '_') fail_at(at, "expected namespace attributes not starting with '_', got '" + k + "'");
    Value d = make_dict(at, std::move(items));
    d.dict->is_namespace = f.name == "namespace";
    return d;
  }
  if (f.name == "range") {
    want(1, 3, false);
    int64_t start = 0, stop = 0, step = 1;
    if (args.size() == 1) stop = as_int(at, args[0], "for range()");
    else start = as_int(at, args[0], "for range()"), stop = as_int(at, args[1], "for range()");
    if (args.size() == 3) step = as_int(at, args[2], "for range()");
    if (step == 0) fail_at(at, "expected a nonzero step for range(), got 0");
    const long double count = std::max<long double>(0, std::ceil((static_cast<long double>(stop) - start) / step));
    if (count > kMaxRange) fail_at(at, detail::message("expected a range of at most ", kMaxRange, " items, got ", count));
    std::vector<Value> items;
    for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) items.push_back(Value::integer(start + k * step));
    charge(at, items.size());
    return make_list(at, std::move(items));
  }
  fail_at(at, "expected something callable, got " + f.name);
}

Value Evaluator::call_macro(const Node& at, const Func& f, Args args, Kwargs kwargs) {
  const Node& m = *f.macro;
  const size_t nparams = m.names.size();
  if (args.size() > nparams)
    fail_at(at, detail::message("expected at most ", nparams, " arguments to macro '", m.str, "', got ", args.size()));
  if (call_depth >= kMaxCallDepth)
    fail_at(at, detail::message("expected macro calls nested at most ", kMaxCallDepth, " deep, got deeper (recursion?)"));
  auto local = std::make_shared<Scope>();
  local->parent = f.closure;
  for (const auto& name : m.missing) local->set(name, undefined_name(name));
  std::vector<bool> given(nparams, false);
  for (size_t k = 0; k < args.size(); ++k) local->set(m.names[k], std::move(args[k])), given[k] = true;
  for (auto& [name, v] : kwargs) {
    size_t k = 0;
    while (k < nparams && m.names[k] != name) ++k;
    if (k == nparams) fail_at(at, detail::message("expected the parameters of macro '", m.str, "', got '", name, "'"));
    if (given[k]) fail_at(at, detail::message("expected one value for parameter '", name, "' of macro '", m.str, "', got two"));
    local->set(name, std::move(v));
    given[k] = true;
  }
  std::string captured;
  std::string* saved_out = out;
  std::shared_ptr<Scope> saved_scope = scope;
  ++call_depth;
  scope = local;
  out = &captured;
  try {
    for (size_t k = 0; k < nparams; ++k)
      if (!given[k])
        local->set(m.names[k], m.kids[k] ? eval(*m.kids[k])
                                         : Value::undefined("parameter '" + m.names[k] + "' was not provided"));
    exec(*m.kids.back());
  } catch (...) {
    out = saved_out, scope = saved_scope, --call_depth;
    throw;
  }
  out = saved_out, scope = saved_scope, --call_depth;
  return Value::str(std::move(captured));
}

Evaluator::Flow Evaluator::exec_for(const Node& n) {
  const Value seq = eval(*n.kids[0]);
  if (seq.kind == Kind::Func) fail_at(n, "expected something to iterate over, got " + excerpt(seq));
  std::vector<Value> items = iterate(n, seq);
  const auto bind = [&](Scope& s, const Value& item) {
    if (!n.flag) {
      s.set(n.names[0], item);
      return;
    }
    std::vector<Value> parts = iterate(n, item);
    if (parts.size() != n.names.size())
      fail_at(n, detail::message("expected ", n.names.size(), " values to unpack, got ", parts.size()));
    for (size_t k = 0; k < parts.size(); ++k) s.set(n.names[k], parts[k]);
  };
  if (n.kids[2]) {  // for x in xs if cond: the loop sees only the items that pass
    std::vector<Value> kept;
    for (Value& item : items) {
      auto s = std::make_shared<Scope>();
      s->parent = scope;
      bind(*s, item);
      std::swap(scope, s);
      bool pass = false;
      try {
        pass = truthy(eval(*n.kids[2]));
      } catch (...) {
        std::swap(scope, s);
        throw;
      }
      std::swap(scope, s);
      if (pass) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const std::shared_ptr<Scope> outer = scope;
  const auto length = static_cast<int64_t>(items.size());
  // jinja2 runs `else` unless some iteration reached the end of the body: one that ended in
  // `break` or `continue` does not count.
  bool completed = false;
  try {
    for (int64_t k = 0; k < length; ++k) {
      charge(n, 8);  // an iteration builds a scope and a loop object
      auto s = std::make_shared<Scope>();
      s->parent = outer;
      bind(*s, items[static_cast<size_t>(k)]);
      std::vector<std::pair<std::string, Value>> loop = {
          {"index", Value::integer(k + 1)},
          {"index0", Value::integer(k)},
          {"revindex", Value::integer(length - k)},
          {"revindex0", Value::integer(length - k - 1)},
          {"first", Value::boolean(k == 0)},
          {"last", Value::boolean(k == length - 1)},
          {"length", Value::integer(length)},
          {"depth", Value::integer(1)},
          {"depth0", Value::integer(0)},
          {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item")},
          {"nextitem", k + 1 < length ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item")}};
      Value lv;
      lv.kind = Kind::Dict;
      lv.dict = std::make_shared<Dict>();
      lv.dict->items = std::move(loop);
      lv.dict->is_namespace = true;  // attributes only, no dict methods
      s->set("loop", std::move(lv));
      for (const auto& name : n.missing) s->set(name, undefined_name(name));
      scope = s;
      const Flow f = exec(*n.kids[1]);
      scope = outer;
      completed = completed || f == Flow::Normal;
      if (f == Flow::Break) break;
    }
  } catch (...) {
    scope = outer;
    throw;
  }
  if (!completed && n.kids[3]) return exec(*n.kids[3]);
  return Flow::Normal;
}

void Evaluator::exec_set(const Node& n) {
  Value v = eval(*n.kids[0]);
  if (!n.str.empty()) {
    const Value* target = scope->lookup(n.names[0]);
    if (!target || !target->dict || !target->dict->is_namespace)
      fail_at(n, detail::message("expected a namespace() to set attribute '", n.str, "' on, got ",
                                 target ? excerpt(*target) : "'" + n.names[0] + "' undefined"));
    if (n.str[0] == '_') fail_at(n, "expected namespace attributes not starting with '_', got '" + n.str + "'");
    if (v.reaches_namespace())  // a namespace holding itself would never be freed
      fail_at(n, detail::message("expected a value without namespace() objects in it to set attribute '", n.str,
                                 "' to, got ", excerpt(v)));
    if (v.depth() + 1 > kMaxValueDepth)
      fail_at(n, detail::message("expected values nested at most ", kMaxValueDepth, " deep, got deeper"));
    target->dict->set(n.str, std::move(v));
    target->dict->depth = std::max(target->dict->depth, 1 + target->dict->find(n.str)->depth());
    return;
  }
  if (!n.flag) {
    scope->set(n.names[0], std::move(v));
    return;
  }
  std::vector<Value> parts = iterate(n, v);
  if (parts.size() != n.names.size())
    fail_at(n, detail::message("expected ", n.names.size(), " values to unpack, got ", parts.size()));
  for (size_t k = 0; k < parts.size(); ++k) scope->set(n.names[k], std::move(parts[k]));
}

Evaluator::Flow Evaluator::exec(const Node& n) {
  charge(n, 1);
  const Nested nested(*this, n);
  switch (n.kind) {
    case N::Text: emit(n, n.str); return Flow::Normal;
    case N::Output: {
      const Value v = eval(*n.kids[0]);
      if (v.kind == Kind::Func) fail_at(n, "expected a value to print, got " + excerpt(v));
      emit(n, to_str(n, v));
      return Flow::Normal;
    }
    case N::Block:
      for (const auto& k : n.kids) {
        const Flow f = exec(*k);
        if (f != Flow::Normal) return f;
      }
      return Flow::Normal;
    case N::If: {
      size_t k = 0;
      for (; k + 1 < n.kids.size(); k += 2)
        if (truthy(eval(*n.kids[k]))) return exec(*n.kids[k + 1]);
      if (k < n.kids.size()) return exec(*n.kids[k]);
      return Flow::Normal;
    }
    case N::For: return exec_for(n);
    case N::Set: exec_set(n); return Flow::Normal;
    case N::SetBlock: {
      std::string captured;
      std::string* saved = out;
      out = &captured;
      try {
        exec(*n.kids[0]);
      } catch (...) {
        out = saved;
        throw;
      }
      out = saved;
      scope->set(n.names[0], Value::str(std::move(captured)));
      return Flow::Normal;
    }
    case N::Macro: {
      charge(n, 1000);  // bounds the scopes kept in macro_scopes
      Value v = func(n.str);
      auto f = std::make_shared<Func>(*v.fn);
      f->macro = &n;
      f->closure = scope;
      v.fn = std::move(f);
      if (macro_scopes.empty() || macro_scopes.back() != scope) macro_scopes.push_back(scope);
      scope->set(n.str, std::move(v));
      return Flow::Normal;
    }
    case N::Break: return Flow::Break;
    case N::Continue: return Flow::Continue;
    default: fail_at(n, "expected a statement, got an expression");
  }
}

std::string render(const Node& root, const nlohmann::ordered_json& vars) {
  auto globals = std::make_shared<Scope>();
  for (const char* name : {"raise_exception", "strftime_now", "namespace", "dict", "range"}) globals->set(name, func(name));
  auto context = std::make_shared<Scope>();
  context->parent = globals;
  for (const auto& [k, v] : vars.items()) context->set(k, from_json(v));
  for (const auto& name : root.missing) context->set(name, undefined_name(name));
  std::string out;
  Evaluator ev;
  ev.scope = context;
  ev.out = &out;
  struct BreakCycles {  // a macro's closure holds the macro: clear those scopes, even after an error
    Evaluator& ev;
    ~BreakCycles() {
      for (auto& s : ev.macro_scopes) s->vars.clear();
    }
  } break_cycles{ev};
  ev.exec(root);
  return out;
}

}  // namespace mhsa::jinja
