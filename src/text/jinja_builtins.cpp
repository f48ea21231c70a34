// text/jinja_builtins.cpp — the filters, tests and methods of the Jinja subset (text/jinja.h),
// each with jinja2 3.1's (or Python's) behaviour and argument order, `tojson` as transformers
// overrides it. Only what chat templates use; an unknown filter, test or method is an error
// naming it, never a silent guess. Case mappings (upper, lower, title, capitalize) change ASCII
// letters only.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mhsa/error.h"
#include "text/jinja.h"

namespace mhsa::jinja {
namespace {

// Python's str.isspace() set, as UTF-8: the length of the whitespace character at s[i], or 0.
size_t space_at(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  const auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  if (c == 0xc2 && (at(1) == 0x85 || at(1) == 0xa0)) return 2;
  if (c == 0xe1 && at(1) == 0x9a && at(2) == 0x80) return 3;
  if (c == 0xe2 && at(1) == 0x80 && ((at(2) >= 0x80 && at(2) <= 0x8a) || at(2) == 0xa8 || at(2) == 0xa9 || at(2) == 0xaf))
    return 3;
  if (c == 0xe2 && at(1) == 0x81 && at(2) == 0x9f) return 3;
  if (c == 0xe3 && at(1) == 0x80 && at(2) == 0x80) return 3;
  return 0;
}


std::vector<std::string> split(const Node& at, const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.kind == Kind::None || sep.undef()) {  // runs of whitespace, none at the ends
    size_t i = 0;
    while (i < s.size()) {
      size_t w;
      while (i < s.size() && (w = space_at(s, i))) i += w;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        out.push_back(strip(rest, nullptr, false, true));
        break;
      }
      const size_t b = i;
      while (i < s.size() && !space_at(s, i)) ++i;
      out.push_back(s.substr(b, i - b));
    }
    return out;
  }
  if (sep.kind != Kind::Str) fail_at(at, "expected a string separator for split(), got " + excerpt(sep));
  if (sep.s.empty()) fail_at(at, "expected a non-empty separator for split(), got ''");
  size_t b = 0, p;
  while ((maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) && (p = s.find(sep.s, b)) != std::string::npos) {
    out.push_back(s.substr(b, p - b));
    b = p + sep.s.size();
  }
  out.push_back(s.substr(b));
  return out;
}

std::string replace(const Node& at, const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every code point
    const std::vector<std::string_view> cps = code_points(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) out += to, ++n;
      if (k < cps.size()) out += cps[k];
      check_size(at, out.size());
    }
    return out;
  }
  size_t b = 0, p;
  int64_t n = 0;
  while ((count < 0 || n < count) && (p = s.find(from, b)) != std::string::npos) {
    out.append(s, b, p - b);
    out += to;
    check_size(at, out.size());
    b = p + from.size();
    ++n;
  }
  out.append(s, b);
  check_size(at, out.size());
  return out;
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) {
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return s;
}

// jinja2's title: words start after '-', whitespace, '(', '{', '[' or '<'.
std::string title(const std::string& s) {
  std::string out;
  bool start = true;
  for (size_t i = 0; i < s.size();) {
    const size_t w = space_at(s, i);
    const char c = s[i];
    if (w || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
      const size_t n = w ? w : 1;
      out.append(s, i, n);
      i += n;
      start = true;
      continue;
    }
    out += start ? ascii_case(std::string(1, c), true) : ascii_case(std::string(1, c), false);
    start = false;
    ++i;
  }
  return out;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  return ascii_case(s.substr(0, 1), true) + ascii_case(s.substr(1), false);
}

// Python's str.splitlines().
std::vector<std::string> splitlines(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    if (c == '\r') n = i + 1 < s.size() && s[i + 1] == '\n' ? 2 : 1;
    else if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) n = 1;
    else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) n = 2;
    else if (c == 0xe2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
             (static_cast<unsigned char>(s[i + 2]) == 0xa8 || static_cast<unsigned char>(s[i + 2]) == 0xa9))
      n = 3;
    if (n) {
      out.push_back(s.substr(b, i - b));
      i += n;
      b = i;
    } else {
      ++i;
    }
  }
  if (b < s.size()) out.push_back(s.substr(b));
  return out;
}

// Arguments by position or name, as Python binds them.
struct Params {
  const Node& at;
  const std::string& fn;
  Args& args;
  Kwargs& kwargs;
  std::vector<std::string> names;

  Value get(size_t k, Value dflt) {
    for (auto& [name, v] : kwargs)
      if (name == names[k]) {
        if (k < args.size()) fail_at(at, detail::message("expected one value for argument '", name, "' of ", fn, ", got two"));
        return v;
      }
    return k < args.size() ? args[k] : dflt;
  }
  void check() {
    if (args.size() > names.size())
      fail_at(at, detail::message("expected at most ", names.size(), " positional arguments to ", fn, ", got ", args.size()));
    for (const auto& [name, v] : kwargs)
      if (std::find(names.begin(), names.end(), name) == names.end())
        fail_at(at, detail::message("expected the arguments of ", fn, ", got an unknown keyword '", name, "'"));
  }
};

Params params(const Node& at, const std::string& fn, Args& args, Kwargs& kwargs, std::vector<std::string> names) {
  Params p{at, fn, args, kwargs, std::move(names)};
  p.check();
  return p;
}

const std::string& want_str(const Node& at, const Value& v, const char* what) {
  if (v.kind != Kind::Str) fail_at(at, detail::message("expected a string ", what, ", got ", excerpt(v)));
  return v.s;
}

int64_t want_int(const Node& at, const Value& v, const char* what) {
  if (v.kind == Kind::Int) return v.i;
  if (v.kind == Kind::Bool) return v.b;
  fail_at(at, detail::message("expected an integer ", what, ", got ", excerpt(v)));
}

// Python's int() / float() of a string: surrounding whitespace and '_' between digits allowed.
bool parse_int(const std::string& text, int64_t& out) {
  std::string s = strip(text, nullptr, true, true), digits;
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  for (; i < s.size(); ++i) {
    if (s[i] == '_' && !digits.empty() && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') continue;
    if (s[i] < '0' || s[i] > '9') return false;
    digits += s[i];
  }
  if (digits.empty()) return false;
  int64_t v = 0;
  for (char c : digits)
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, neg ? -(c - '0') : c - '0', &v)) return false;
  out = v;
  return true;
}

bool parse_float(const std::string& text, double& out) {
  std::string s = strip(text, nullptr, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// jinja2's attribute lookup of selectattr/map: "a.b.0" walks keys and indexes.
Value attribute_path(Evaluator& ev, const Node& at, const Value& item, const std::string& path) {
  Value v = item;
  size_t b = 0;
  for (;;) {
    const size_t e = path.find('.', b);
    const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    int64_t idx = 0;
    Value key = parse_int(part, idx) && !part.empty() && part[0] >= '0' && part[0] <= '9' ? Value::integer(idx) : Value::str(part);
    if (v.undef()) return v;
    if (v.dict) {
      const Value* x = key.kind == Kind::Str ? v.dict->find(key.s) : nullptr;
      v = x ? *x : Value::undefined("'" + type_name(v) + " object' has no attribute '" + part + "'");
    } else if (v.list && key.kind == Kind::Int) {
      const auto n = static_cast<int64_t>(v.list->items.size());
      v = idx >= 0 && idx < n ? v.list->items[static_cast<size_t>(idx)] : Value::undefined("no such element");
    } else {
      v = Value::undefined("'" + type_name(v) + " object' has no attribute '" + part + "'");
    }
    (void)ev;
    (void)at;
    if (e == std::string::npos) return v;
    b = e + 1;
  }
}

}  // namespace

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<std::string_view> cps = code_points(s);
  const std::vector<std::string_view> set = chars ? code_points(*chars) : std::vector<std::string_view>{};
  const auto strippable = [&](std::string_view cp) {
    if (!chars) return space_at(cp, 0) == cp.size();
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strippable(cps[b])) ++b;
  if (right)
    while (e > b && strippable(cps[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

bool has_test(const std::string& name) {
  static const char* const tests[] = {"defined", "undefined", "none", "boolean", "false", "true", "integer", "float",
                                      "number", "string", "mapping", "iterable", "sequence", "callable", "sameas",
                                      "escaped", "in", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le",
                                      "<=", "gt", "greaterthan", ">", "ge", ">=", "odd", "even", "divisibleby",
                                      "lower", "upper"};
  return std::find(std::begin(tests), std::end(tests), name) != std::end(tests);
}

bool call_test(Evaluator& ev, const Node& at, const std::string& name, const Value& v, const Args& args) {
  (void)ev;
  const size_t nargs = name == "defined" || name == "undefined" || name == "none" || name == "boolean" ||
                               name == "false" || name == "true" || name == "integer" || name == "float" ||
                               name == "number" || name == "string" || name == "mapping" || name == "iterable" ||
                               name == "sequence" || name == "callable" || name == "escaped" || name == "odd" ||
                               name == "even" || name == "lower" || name == "upper"
                           ? 0 : 1;
  if (!has_test(name)) fail_at(at, "expected a test this interpreter supports, got '" + name + "'");
  if (args.size() != nargs)
    fail_at(at, detail::message("expected ", nargs, " arguments to test '", name, "', got ", args.size()));
  if (name == "defined") return !v.undef();
  if (name == "undefined") return v.undef();
  if (name == "none") return v.kind == Kind::None;
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "false") return v.kind == Kind::Bool && !v.b;
  if (name == "true") return v.kind == Kind::Bool && v.b;
  if (name == "integer") return v.kind == Kind::Int;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "number") return v.is_num();
  if (name == "string") return v.kind == Kind::Str;
  if (name == "mapping") return v.dict && !v.dict->is_namespace;
  if (name == "iterable") return v.list || (v.dict && !v.dict->is_namespace) || v.kind == Kind::Str || v.undef();
  if (name == "sequence") return v.list || (v.dict && !v.dict->is_namespace) || v.kind == Kind::Str || v.undef();
  if (name == "callable") return v.kind == Kind::Func;
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    const std::string s = to_str(at, v);
    bool cased = false;
    for (char c : s) {
      if ((name == "lower" && c >= 'A' && c <= 'Z') || (name == "upper" && c >= 'a' && c <= 'z')) return false;
      cased = cased || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }
    return cased;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    const Value& dv = name == "divisibleby" ? args[0] : Value::integer(2);
    if (!v.is_num() || !dv.is_num()) fail_at(at, "expected numbers for test '" + name + "', got " + excerpt(v));
    if (v.kind == Kind::Float || dv.kind == Kind::Float) {
      const double x = v.kind == Kind::Float ? v.f : static_cast<double>(v.kind == Kind::Bool ? v.b : v.i);
      const double d = dv.kind == Kind::Float ? dv.f : static_cast<double>(dv.kind == Kind::Bool ? dv.b : dv.i);
      if (d == 0) fail_at(at, "expected a nonzero divisor, got 0");
      double r = std::fmod(x, d);
      if (r != 0 && ((r < 0) != (d < 0))) r += d;
      return name == "odd" ? r == 1 : r == 0;
    }
    const int64_t x = want_int(at, v, "to test"), d = want_int(at, dv, "divisor");
    if (d == 0) fail_at(at, "expected a nonzero divisor, got 0");
    const int64_t r = d == -1 ? 0 : ((x % d) + d) % d;
    return name == "odd" ? r == 1 : r == 0;
  }
  const Value& o = args[0];
  if (name == "sameas") {
    if (v.kind != o.kind) return false;
    if (v.list) return v.list == o.list;
    if (v.dict) return v.dict == o.dict;
    return equal(v, o);
  }
  if (name == "in") {
    if (o.kind == Kind::Str) return v.kind == Kind::Str && o.s.find(v.s) != std::string::npos;
    if (o.list) return std::any_of(o.list->items.begin(), o.list->items.end(), [&](const Value& x) { return equal(x, v); });
    if (o.dict) return v.kind == Kind::Str && o.dict->find(v.s);
    if (o.undef()) return false;
    fail_at(at, "expected a container for test 'in', got " + excerpt(o));
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, o);
  if (name == "ne" || name == "!=") return !equal(v, o);
  if (name == "lt" || name == "lessthan" || name == "<") return less(at, v, o);
  if (name == "le" || name == "<=") return !less(at, o, v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(at, o, v);
  return !less(at, v, o);  // ge
}

Value method(const Value& self, const std::string& name) {
  static const char* const str_methods[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper",
                                            "lower", "title", "capitalize", "replace", "find", "count", "join"};
  static const char* const dict_methods[] = {"get", "items", "keys", "values"};
  bool known = false;
  if (self.kind == Kind::Str) known = std::find(std::begin(str_methods), std::end(str_methods), name) != std::end(str_methods);
  if (self.dict && !self.dict->is_namespace)
    known = std::find(std::begin(dict_methods), std::end(dict_methods), name) != std::end(dict_methods);
  if (!known) return Value::undefined("'" + type_name(self) + " object' has no attribute '" + name + "'");
  Value v;
  v.kind = Kind::Func;
  auto f = std::make_shared<Func>();
  f->name = type_name(self) + "." + name;
  f->self = std::make_shared<const Value>(self);
  v.fn = std::move(f);
  return v;
}

Value call_method(Evaluator& ev, const Node& at, const Func& f, Args args, Kwargs kwargs) {
  const Value& self = *f.self;
  const std::string name = f.name.substr(f.name.find('.') + 1);
  const std::string fn = f.name + "()";
  if (self.dict) {
    if (name == "get") {
      Params p = params(at, fn, args, kwargs, {"key", "default"});
      const Value key = p.get(0, Value::undefined("missing key"));
      if (key.undef()) fail_at(at, "expected a key for dict.get(), got none");
      const Value* v = key.kind == Kind::Str ? self.dict->find(key.s) : nullptr;
      return v ? *v : p.get(1, Value::none());
    }
    params(at, fn, args, kwargs, {});
    std::vector<Value> out;
    for (const auto& [k, v] : self.dict->items) {
      if (name == "keys") out.push_back(Value::str(k));
      else if (name == "values") out.push_back(v);
      else out.push_back(make_list(at, {Value::str(k), v}, true));
    }
    ev.charge(at, out.size());
    return as_view(make_list(at, std::move(out)), name == "keys" ? "dict_keys" : name == "values" ? "dict_values" : "dict_items");
  }
  const std::string& s = self.s;
  ev.charge(at, s.size() / 16);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p = params(at, fn, args, kwargs, {"chars"});
    const Value chars = p.get(0, Value::none());
    const std::string* cs = chars.kind == Kind::None ? nullptr : &want_str(at, chars, "of characters to strip");
    return Value::str(strip(s, cs, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    Params p = params(at, fn, args, kwargs, {"sep", "maxsplit"});
    std::vector<Value> out;
    for (std::string& part : split(at, s, p.get(0, Value::none()), want_int(at, p.get(1, Value::integer(-1)), "maxsplit")))
      out.push_back(Value::str(std::move(part)));
    return make_list(at, std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    Params p = params(at, fn, args, kwargs, {"prefix"});
    const Value x = p.get(0, Value::undefined("missing"));
    std::vector<Value> options = x.list && x.list->tuple ? x.list->items : std::vector<Value>{x};
    for (const Value& o : options) {
      const std::string& t = want_str(at, o, "(or tuple of strings) to compare with");
      if (name == "startswith" ? s.compare(0, t.size(), t) == 0
                               : s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "upper" || name == "lower") return params(at, fn, args, kwargs, {}), Value::str(ascii_case(s, name == "upper"));
  if (name == "title") {  // Python's str.title: a letter after a non-letter starts a word
    params(at, fn, args, kwargs, {});
    std::string out = s;
    bool prev_letter = false;
    for (char& c : out) {
      const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      if (letter) c = ascii_case(std::string(1, c), !prev_letter)[0];
      prev_letter = letter;
    }
    return Value::str(std::move(out));
  }
  if (name == "capitalize") return params(at, fn, args, kwargs, {}), Value::str(capitalize(s));
  if (name == "replace") {
    Params p = params(at, fn, args, kwargs, {"old", "new", "count"});
    return Value::str(replace(at, s, want_str(at, p.get(0, Value::none()), "to replace"),
                              want_str(at, p.get(1, Value::none()), "to replace with"),
                              want_int(at, p.get(2, Value::integer(-1)), "count")));
  }
  if (name == "find" || name == "count") {
    Params p = params(at, fn, args, kwargs, {"sub"});
    const std::string& t = want_str(at, p.get(0, Value::none()), "to look for");
    if (name == "find") {
      const size_t pos = s.find(t);
      if (pos == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<int64_t>(code_points(s.substr(0, pos)).size()));
    }
    if (t.empty()) return Value::integer(static_cast<int64_t>(code_points(s).size()) + 1);
    int64_t n = 0;
    for (size_t pos = 0; (pos = s.find(t, pos)) != std::string::npos; pos += t.size()) ++n;
    return Value::integer(n);
  }
  // join
  Params p = params(at, fn, args, kwargs, {"iterable"});
  std::string out;
  bool first = true;
  for (const Value& x : iterate(at, p.get(0, Value::none()))) {
    if (!first) out += s;
    first = false;
    out += want_str(at, x, "to join");
    check_size(at, out.size());
  }
  return Value::str(std::move(out));
}

Value call_filter(Evaluator& ev, const Node& at, const std::string& name, const Value& v, Args args, Kwargs kwargs) {
  const std::string fn = "filter '" + name + "'";
  const auto str_of = [&](const Value& x) {
    std::string s = to_str(at, x);
    ev.charge(at, s.size() / 16);
    return s;
  };
  if (name == "trim") {
    Params p = params(at, fn, args, kwargs, {"chars"});
    const Value chars = p.get(0, Value::none());
    return Value::str(strip(str_of(v), chars.kind == Kind::None ? nullptr : &want_str(at, chars, "of characters"), true, true));
  }
  if (name == "length" || name == "count") {
    params(at, fn, args, kwargs, {});
    if (v.kind == Kind::Str) return Value::integer(static_cast<int64_t>(code_points(v.s).size()));
    if (v.list && !is_generator(v)) return Value::integer(static_cast<int64_t>(v.list->items.size()));
    if (v.dict && !v.dict->is_namespace) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
    if (v.undef()) return Value::integer(0);
    fail_at(at, "expected something with a length, got " + excerpt(v));
  }
  if (name == "upper" || name == "lower") return params(at, fn, args, kwargs, {}), Value::str(ascii_case(str_of(v), name == "upper"));
  if (name == "title") return params(at, fn, args, kwargs, {}), Value::str(title(str_of(v)));
  if (name == "capitalize") return params(at, fn, args, kwargs, {}), Value::str(capitalize(str_of(v)));
  if (name == "default" || name == "d") {
    Params p = params(at, fn, args, kwargs, {"default_value", "boolean"});
    const bool boolean = truthy(p.get(1, Value::boolean(false)));
    if (v.undef() || (boolean && !truthy(v))) return p.get(0, Value::str(""));
    return v;
  }
  if (name == "tojson") {  // transformers': json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    Params p = params(at, fn, args, kwargs, {"ensure_ascii", "indent", "separators", "sort_keys"});
    const Value seps = p.get(2, Value::none());
    std::string item_sep, key_sep;
    if (seps.kind != Kind::None) {
      if (!seps.list || seps.list->items.size() != 2)
        fail_at(at, "expected separators as a pair of strings, got " + excerpt(seps));
      item_sep = want_str(at, seps.list->items[0], "item separator");
      key_sep = want_str(at, seps.list->items[1], "key separator");
      if (item_sep.empty() || key_sep.empty()) fail_at(at, "expected non-empty separators, got an empty one");
    }
    std::string out = tojson(at, v, p.get(1, Value::none()), truthy(p.get(3, Value::boolean(false))),
                             truthy(p.get(0, Value::boolean(false))), item_sep, key_sep);
    ev.charge(at, out.size() / 16);
    return Value::str(std::move(out));
  }
  if (name == "string") return params(at, fn, args, kwargs, {}), Value::str(str_of(v));
  if (name == "safe") return params(at, fn, args, kwargs, {}), v;
  if (name == "escape" || name == "e" || name == "forceescape") {
    params(at, fn, args, kwargs, {});
    std::string out;
    for (char c : str_of(v)) {
      if (c == '&') out += "&amp;";
      else if (c == '<') out += "&lt;";
      else if (c == '>') out += "&gt;";
      else if (c == '"') out += "&#34;";
      else if (c == '\'') out += "&#39;";
      else out += c;
    }
    check_size(at, out.size());
    return Value::str(std::move(out));
  }
  if (name == "int") {
    Params p = params(at, fn, args, kwargs, {"default", "base"});
    const Value dflt = p.get(0, Value::integer(0));
    if (want_int(at, p.get(1, Value::integer(10)), "base") != 10) fail_at(at, "expected base 10 for filter 'int', got another");
    if (v.undef()) fail_at(at, v.s);  // int(Undefined) raises
    if (v.kind == Kind::Int) return v;
    if (v.kind == Kind::Bool) return Value::integer(v.b);
    double d = 0;
    int64_t i = 0;
    if (v.kind == Kind::Str && parse_int(v.s, i)) return Value::integer(i);
    if (v.kind == Kind::Float) d = v.f;
    else if (v.kind != Kind::Str || !parse_float(v.s, d)) return dflt;
    if (!std::isfinite(d)) return dflt;
    if (std::fabs(d) >= 9223372036854775808.0)
      fail_at(at, "expected results within 64-bit integers, got " + float_repr(d) + " in filter 'int'");
    return Value::integer(static_cast<int64_t>(d));
  }
  if (name == "float") {
    Params p = params(at, fn, args, kwargs, {"default"});
    if (v.undef()) fail_at(at, v.s);  // float(Undefined) raises
    if (v.is_num()) return Value::number(v.kind == Kind::Float ? v.f : v.kind == Kind::Bool ? v.b : static_cast<double>(v.i));
    double d = 0;
    if (v.kind == Kind::Str && parse_float(v.s, d)) return Value::number(d);
    return p.get(0, Value::number(0.0));
  }
  if (name == "abs") {
    params(at, fn, args, kwargs, {});
    if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
    const int64_t x = want_int(at, v, "for filter 'abs'");
    if (x == INT64_MIN) fail_at(at, "expected results within 64-bit integers, got an overflow in abs");
    return Value::integer(x < 0 ? -x : x);
  }
  if (name == "round") {
    Params p = params(at, fn, args, kwargs, {"precision", "method"});
    const int64_t prec = want_int(at, p.get(0, Value::integer(0)), "precision");
    const std::string method = want_str(at, p.get(1, Value::str("common")), "method");
    if (prec < -300 || prec > 300) fail_at(at, detail::message("expected a precision in [-300, 300], got ", prec));
    if (method != "common" && method != "ceil" && method != "floor")
      fail_at(at, "expected method 'common', 'ceil' or 'floor', got '" + method + "'");
    if (!v.is_num()) fail_at(at, "expected a number to round, got " + excerpt(v));
    if (method == "common" && v.kind != Kind::Float && prec >= 0) return v.kind == Kind::Bool ? Value::integer(v.b) : v;
    const double x = v.kind == Kind::Float ? v.f : v.kind == Kind::Bool ? v.b : static_cast<double>(v.i);
    if (method != "common") {
      const double scale = std::pow(10.0, static_cast<double>(prec));
      return Value::number((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
    }
    if (!std::isfinite(x) || prec < 0) {
      if (prec < 0) {
        const double scale = std::pow(10.0, static_cast<double>(-prec));
        return Value::number(std::nearbyint(x / scale) * scale);
      }
      return Value::number(x);
    }
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(prec, 340)), x);
    return Value::number(std::strtod(buf, nullptr));
  }
  if (name == "first" || name == "last") {
    params(at, fn, args, kwargs, {});
    const std::vector<Value> items = iterate(at, v);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return params(at, fn, args, kwargs, {}), make_list(at, iterate(at, v));
  if (name == "reverse") {
    params(at, fn, args, kwargs, {});
    if (v.kind == Kind::Str) {
      std::vector<std::string_view> cps = code_points(v.s);
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::str(std::move(out));
    }
    std::vector<Value> items = iterate(at, v);
    std::reverse(items.begin(), items.end());
    return as_view(make_list(at, std::move(items)), "generator");
  }
  if (name == "join") {
    Params p = params(at, fn, args, kwargs, {"d", "attribute"});
    const std::string sep = str_of(p.get(0, Value::str("")));
    const Value attr = p.get(1, Value::none());
    std::string out;
    bool first = true;
    for (const Value& x : iterate(at, v)) {
      if (!first) out += sep;
      first = false;
      out += str_of(attr.kind == Kind::None ? x : attribute_path(ev, at, x, to_str(at, attr)));
      check_size(at, out.size());
    }
    return Value::str(std::move(out));
  }
  if (name == "replace") {
    Params p = params(at, fn, args, kwargs, {"old", "new", "count"});
    const Value count = p.get(2, Value::none());
    return Value::str(replace(at, str_of(v), str_of(p.get(0, Value::none())), str_of(p.get(1, Value::none())),
                              count.kind == Kind::None ? -1 : want_int(at, count, "count")));
  }
  if (name == "items") {
    params(at, fn, args, kwargs, {});
    if (v.undef()) return make_list(at, {});
    if (!v.dict || v.dict->is_namespace) fail_at(at, "expected a mapping for filter 'items', got " + excerpt(v));
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict->items) out.push_back(make_list(at, {Value::str(k), x}, true));
    return make_list(at, std::move(out));
  }
  if (name == "indent") {
    Params p = params(at, fn, args, kwargs, {"width", "first", "blank"});
    const Value width = p.get(0, Value::integer(4));
    std::string ind;
    if (width.kind == Kind::Str) ind = width.s;
    else ind.assign(static_cast<size_t>(std::clamp<int64_t>(want_int(at, width, "width"), 0, 1000)), ' ');
    const bool first = truthy(p.get(1, Value::boolean(false))), blank = truthy(p.get(2, Value::boolean(false)));
    const std::vector<std::string> lines = splitlines(want_str(at, v, "to indent") + "\n");
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) out += '\n';
      if (k && (blank || !lines[k].empty())) out += ind;
      out += lines[k];
      check_size(at, out.size());
    }
    if (first) out = ind + out;
    return Value::str(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool attr = name.size() > 6;
    const bool keep = name[0] == 's';
    if (!kwargs.empty()) fail_at(at, "expected positional arguments to " + fn + ", got keyword arguments");
    if (attr && args.empty()) fail_at(at, "expected an attribute name for " + fn + ", got none");
    const std::string path = attr ? to_str(at, args[0]) : "";
    const size_t t = attr ? 1 : 0;
    std::string test;
    if (args.size() > t) test = want_str(at, args[t], "test name");
    const Args test_args(args.begin() + static_cast<ptrdiff_t>(std::min(args.size(), t + 1)), args.end());
    std::vector<Value> out;
    for (const Value& x : iterate(at, v)) {
      ev.charge(at, 1);
      const Value y = attr ? attribute_path(ev, at, x, path) : x;
      const bool pass = test.empty() ? truthy(y) : call_test(ev, at, test, y, test_args);
      if (pass == keep) out.push_back(x);
    }
    return as_view(make_list(at, std::move(out)), "generator");
  }
  if (name == "map") {
    std::vector<Value> out;
    const Value* attr = nullptr;
    Value dflt;
    for (const auto& [k, x] : kwargs) {
      if (k == "attribute") attr = &x;
      else if (k == "default") dflt = x;
    }
    if (attr) {
      if (!args.empty()) fail_at(at, "expected no positional arguments to filter 'map' with attribute=, got some");
      for (const Value& x : iterate(at, v)) {
        Value y = attribute_path(ev, at, x, to_str(at, *attr));
        out.push_back(y.undef() && !dflt.undef() ? dflt : y);
      }
      return as_view(make_list(at, std::move(out)), "generator");
    }
    if (args.empty()) fail_at(at, "expected a filter name or attribute= for filter 'map', got neither");
    const std::string filter = want_str(at, args[0], "filter name");
    if (filter == "map") fail_at(at, "expected a filter other than 'map' inside map, got 'map'");
    for (const Value& x : iterate(at, v)) {
      ev.charge(at, 1);
      out.push_back(call_filter(ev, at, filter, x, Args(args.begin() + 1, args.end()), kwargs));
    }
    return as_view(make_list(at, std::move(out)), "generator");
  }
  if (name == "sum") {
    Params p = params(at, fn, args, kwargs, {"attribute", "start"});
    const Value attr = p.get(0, Value::none());
    Value total = p.get(1, Value::integer(0));
    for (const Value& x : iterate(at, v)) {
      const Value y = attr.kind == Kind::None ? x : attribute_path(ev, at, x, to_str(at, attr));
      if (!total.is_num() || !y.is_num()) fail_at(at, "expected numbers to sum, got " + excerpt(y));
      if (total.kind == Kind::Float || y.kind == Kind::Float)
        total = Value::number((total.kind == Kind::Float ? total.f : static_cast<double>(total.kind == Kind::Bool ? total.b : total.i)) +
                              (y.kind == Kind::Float ? y.f : static_cast<double>(y.kind == Kind::Bool ? y.b : y.i)));
      else if (__builtin_add_overflow(total.kind == Kind::Bool ? total.b : total.i, y.kind == Kind::Bool ? y.b : y.i, &total.i))
        fail_at(at, "expected results within 64-bit integers, got an overflow in sum");
      else total.kind = Kind::Int;
    }
    return total;
  }
  fail_at(at, "expected a filter this interpreter supports, got '" + name + "'");
}

}  // namespace mhsa::jinja
