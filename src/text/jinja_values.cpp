// text/jinja_values.cpp — the values of the Jinja subset (text/jinja.h) as Python sees them:
// truthiness, ==, <, str(), repr(), json.dumps (transformers' `tojson`), iteration, conversion from
// JSON, and the size and nesting checks every new string, list and dict goes through. Not here:
// filters, tests and methods (jinja_builtins.cpp).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "mhsa/error.h"
#include "text/jinja.h"

namespace mhsa::jinja {

void check_size(const Node& at, size_t bytes) {
  if (bytes > kMaxStringBytes) fail_at(at, detail::message("expected strings of at most ", kMaxStringBytes, " bytes, got ", bytes));
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) >> 6) == 2) ++n;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

Value make_list(const Node& at, std::vector<Value> items, bool tuple) {
  if (items.size() > kMaxItems) fail_at(at, detail::message("expected lists of at most ", kMaxItems, " items, got ", items.size()));
  auto l = std::make_shared<List>();
  for (const Value& v : items) {
    l->depth = std::max(l->depth, 1 + v.depth());
    l->holds_namespace = l->holds_namespace || v.reaches_namespace();
  }
  if (l->depth > kMaxValueDepth) fail_at(at, detail::message("expected values nested at most ", kMaxValueDepth, " deep, got deeper"));
  l->items = std::move(items);
  l->tuple = tuple;
  Value v;
  v.kind = Kind::List;
  v.list = std::move(l);
  return v;
}

Value make_dict(const Node& at, std::vector<std::pair<std::string, Value>> items) {
  if (items.size() > kMaxItems) fail_at(at, detail::message("expected dicts of at most ", kMaxItems, " items, got ", items.size()));
  auto d = std::make_shared<Dict>();
  for (const auto& kv : items) {
    d->depth = std::max(d->depth, 1 + kv.second.depth());
    d->holds_namespace = d->holds_namespace || kv.second.reaches_namespace();
  }
  if (d->depth > kMaxValueDepth) fail_at(at, detail::message("expected values nested at most ", kMaxValueDepth, " deep, got deeper"));
  d->items = std::move(items);
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::move(d);
  return v;
}

Value as_view(Value list, const char* view) {
  auto l = std::make_shared<List>(*list.list);
  l->view = view;
  list.list = std::move(l);
  return list;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        throw Error(detail::message("ChatTemplate::render: variables: expected integers below 2^63, got ", u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      auto l = std::make_shared<List>();
      for (const auto& x : j) {
        l->items.push_back(from_json(x));
        l->depth = std::max(l->depth, 1 + l->items.back().depth());
      }
      Value v;
      v.kind = Kind::List;
      v.list = std::move(l);
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (const auto& [k, x] : j.items()) {
        d->items.emplace_back(k, from_json(x));
        d->depth = std::max(d->depth, 1 + d->items.back().second.depth());
      }
      Value v;
      v.kind = Kind::Dict;
      v.dict = std::move(d);
      return v;
    }
    default: throw Error("ChatTemplate::render: variables: expected JSON values, got binary data");
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0;
    case Kind::Str: return !v.s.empty();
    case Kind::List: return is_generator(v) || !v.list->items.empty();
    case Kind::Dict: return v.dict->is_namespace || !v.dict->items.empty();
    case Kind::Func: return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::List: return v.list->view ? v.list->view : v.list->tuple ? "tuple" : "list";
    case Kind::Dict: return v.dict->is_namespace ? "Namespace" : "dict";
    case Kind::Func: return v.fn->macro ? "Macro" : "function";
  }
  return "?";
}

std::string excerpt(const Value& v) {
  if (v.undef()) return "an undefined value";
  if (v.kind == Kind::None) return "None";
  if (v.kind == Kind::Func) return "function " + v.fn->name;
  static const Node nowhere{};
  std::string r = repr(nowhere, v.depth() > 3 ? Value::str("…") : v);
  if (r.size() > 60) {
    size_t cut = 60;
    while (cut > 0 && (static_cast<unsigned char>(r[cut]) >> 6) == 2) --cut;
    r = r.substr(0, cut) + "…";
  }
  const std::string t = type_name(v);
  return (t[0] == 'i' ? "an " : "a ") + t + " " + r;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') sign = "-", sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else {
      const size_t int_digits = static_cast<size_t>(exp) + 1;
      if (digits.size() < int_digits) digits.append(int_digits - digits.size(), '0');
      out = digits.substr(0, int_digits) + "." + (digits.size() > int_digits ? digits.substr(int_digits) : "0");
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant += "." + digits.substr(1);
  const int a = std::abs(exp);
  return sign + mant + "e" + (exp < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
}

namespace {

std::string repr_str(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') out += "\\\\";
    else if (c == q) out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += "\\x", out += hex[c >> 4], out += hex[c & 15];
    else if (c == 0xc2 && i + 1 < s.size() &&
             (static_cast<unsigned char>(s[i + 1]) <= 0xa0 || static_cast<unsigned char>(s[i + 1]) == 0xad)) {
      const auto d = static_cast<unsigned char>(s[++i]);  // U+0080..U+00A0, U+00AD: not printable
      out += "\\x", out += hex[d >> 4], out += hex[d & 15];
    } else if ((c >> 4) == 14 && i + 2 < s.size()) {
      const uint32_t cp = (c & 15u) << 12 | (static_cast<unsigned char>(s[i + 1]) & 63u) << 6 |
                          (static_cast<unsigned char>(s[i + 2]) & 63u);
      // The separators and format characters of the Basic Multilingual Plane that Python escapes.
      if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
          (cp >= 0x205f && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff ||
          (cp >= 0xfff9 && cp <= 0xfffb)) {
        out += "\\u";
        for (int sh = 12; sh >= 0; sh -= 4) out += hex[(cp >> sh) & 15];
      } else {
        out.append(s, i, 3);
      }
      i += 2;
    } else out += static_cast<char>(c);
  }
  return out + q;
}

void json_str(std::string& out, const std::string& s, bool ensure_ascii) {
  static const char* hex = "0123456789abcdef";
  const auto u4 = [&](uint32_t u) {
    out += "\\u";
    for (int sh = 12; sh >= 0; sh -= 4) out += hex[(u >> sh) & 15];
  };
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\b') out += "\\b";
    else if (c == '\f') out += "\\f";
    else if (c < 0x20) u4(c);
    else if (c >= 0x80 && ensure_ascii) {
      const int n = (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : 3;
      uint32_t cp = c & (0x3f >> n);
      for (int k = 0; k < n && i + 1 < s.size(); ++k) cp = cp << 6 | (static_cast<unsigned char>(s[++i]) & 0x3f);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        u4(0xd800 | (cp >> 10));
        u4(0xdc00 | (cp & 0x3ff));
      } else {
        u4(cp);
      }
    } else out += static_cast<char>(c);
  }
  out += '"';
}

void json_value(const Node& at, std::string& out, const Value& v, const std::string* indent, int level, bool sort_keys,
                bool ensure_ascii, const std::string& item_sep, const std::string& key_sep) {
  check_size(at, out.size());
  const auto newline = [&](int lvl) {
    if (!indent) return;
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += *indent;
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : float_repr(v.f);
      return;
    case Kind::Str: json_str(out, v.s, ensure_ascii); return;
    case Kind::List: {
      if (is_generator(v) || v.list->view) break;
      if (v.list->items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Value& x : v.list->items) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        json_value(at, out, x, indent, level + 1, sort_keys, ensure_ascii, item_sep, key_sep);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->is_namespace) break;
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        json_str(out, kv->first, ensure_ascii);
        out += key_sep;
        json_value(at, out, kv->second, indent, level + 1, sort_keys, ensure_ascii, item_sep, key_sep);
      }
      newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  fail_at(at, "expected a value JSON can hold for tojson, got " + excerpt(v));
}

}  // namespace

std::string tojson(const Node& at, const Value& v, const Value& indent, bool sort_keys, bool ensure_ascii,
                   const std::string& item_sep, const std::string& key_sep) {
  std::string ind;
  const std::string* ip = nullptr;
  if (indent.kind == Kind::Str) {
    ind = indent.s, ip = &ind;
  } else if (indent.kind == Kind::Int || indent.kind == Kind::Bool) {
    const int64_t n = indent.kind == Kind::Bool ? indent.b : indent.i;
    if (n > 1000) fail_at(at, detail::message("expected an indent of at most 1000, got ", n));
    ind.assign(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
    ip = &ind;
  } else if (indent.kind != Kind::None && !indent.undef()) {
    fail_at(at, "expected an integer or a string as the indent of tojson, got " + excerpt(indent));
  }
  std::string out;
  json_value(at, out, v, ip, 0, sort_keys, ensure_ascii, item_sep.empty() ? (ip ? "," : ", ") : item_sep,
             key_sep.empty() ? ": " : key_sep);
  check_size(at, out.size());
  return out;
}

std::string repr(const Node& at, const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::Str: return repr_str(v.s);
    case Kind::List: {
      if (is_generator(v)) fail_at(at, "expected a value to print, got a generator (add '| list')");
      std::string out = v.list->view ? std::string(v.list->view) + "([" : std::string(1, v.list->tuple ? '(' : '[');
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += ", ";
        out += repr(at, v.list->items[k]);
        check_size(at, out.size());
      }
      if (v.list->tuple && v.list->items.size() == 1) out += ',';
      return out + (v.list->view ? "])" : v.list->tuple ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_str(k) + ": " + repr(at, x);
        check_size(at, out.size());
      }
      return out + (v.dict->is_namespace ? "}>" : "}");
    }
    default: return to_str(at, v);
  }
}

std::string to_str(const Node& at, const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return float_repr(v.f);
    case Kind::Str: return v.s;
    case Kind::Func: return "<" + type_name(v) + " " + v.fn->name + ">";
    default: return repr(at, v);
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_num() && b.is_num()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      const long double x = a.kind == Kind::Float ? a.f : a.kind == Kind::Bool ? a.b : a.i;
      const long double y = b.kind == Kind::Float ? b.f : b.kind == Kind::Bool ? b.b : b.i;
      return x == y;
    }
    return (a.kind == Kind::Bool ? a.b : a.i) == (b.kind == Kind::Bool ? b.b : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::Str: return a.s == b.s;
    case Kind::List: {
      if (is_generator(a) || is_generator(b)) return a.list == b.list;
      if (a.list->tuple != b.list->tuple || a.list->items.size() != b.list->items.size()) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!equal(a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->is_namespace || b.dict->is_namespace) return a.dict == b.dict;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* w = b.dict->find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    }
    case Kind::Func: return a.fn == b.fn;
    default: return false;
  }
}

bool less(const Node& at, const Value& a, const Value& b) {
  if (a.is_num() && b.is_num()) {
    const long double x = a.kind == Kind::Float ? a.f : a.kind == Kind::Bool ? a.b : a.i;
    const long double y = b.kind == Kind::Float ? b.f : b.kind == Kind::Bool ? b.b : b.i;
    return x < y;
  }
  if (a.kind == Kind::Str && b.kind == Kind::Str) return a.s < b.s;
  if (a.list && b.list && a.list->tuple == b.list->tuple) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k)
      if (!equal(x[k], y[k])) return less(at, x[k], y[k]);
    return x.size() < y.size();
  }
  if (a.undef()) fail_at(at, a.s);
  if (b.undef()) fail_at(at, b.s);
  fail_at(at, "expected values that can be ordered, got " + excerpt(a) + " and " + excerpt(b));
}

std::vector<Value> iterate(const Node& at, const Value& v) {
  std::vector<Value> out;
  if (v.list) return v.list->items;
  if (v.dict && !v.dict->is_namespace) {
    for (const auto& kv : v.dict->items) out.push_back(Value::str(kv.first));
    return out;
  }
  if (v.kind == Kind::Str) {
    for (std::string_view cp : code_points(v.s)) out.push_back(Value::str(std::string(cp)));
    return out;
  }
  if (v.undef()) return out;
  fail_at(at, "expected something iterable, got " + excerpt(v));
}

}  // namespace mhsa::jinja
