// constrain/json_schema.cpp — JSON Schema compiled to GBNF text (then parsed like any grammar), the
// subset OpenAI's strict structured outputs takes. Every keyword is either enforced or refused by
// name, never silently dropped; annotations (title, description, ...) are read past. Not a
// validator: what it generates is always valid, but where the schema allows a choice (key order,
// whitespace, optional properties' presence) the grammar allows one form of it: properties in the
// schema's order, whitespace bounded as llama.cpp bounds it (so a model cannot pad for ever).
#include <map>
#include <set>
#include <string>

#include "constrain/rules.h"
#include "core/check.h"
#include "io/json.h"
#include "mhsa/error.h"

namespace mhsa::detail {

namespace {

using json = nlohmann::ordered_json;

// The primitives, emitted once.
constexpr std::string_view kPrimitives = R"(ws ::= | " " | "\n" [ \t]{0,20}
json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-string ::= "\"" json-char* "\""
json-integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-number ::= json-integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
json-boolean ::= "true" | "false"
json-null ::= "null"
)";

// Bytes as a GBNF literal: quotes, backslashes and control bytes escaped, UTF-8 kept as it is.
std::string literal(std::string_view bytes) {
  std::string out = "\"";
  for (const char c : bytes) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Keywords that say nothing about the values allowed.
const std::set<std::string, std::less<>> kAnnotations = {"title", "description", "default", "examples", "$schema",
                                                         "$id", "$comment", "deprecated", "readOnly", "writeOnly",
                                                         "$defs", "definitions"};

class Compiler {
 public:
  Compiler(const json& root, std::string_view source) : root_(root), source_(source) {}

  std::string run() {
    const std::string top = compile(root_, "", 0);
    return "root ::= " + top + "\n" + rules_ + std::string(kPrimitives);
  }

 private:
  [[noreturn]] void refuse(const std::string& path, const std::string& what) const {
    throw Error(message(source_, " at ", path.empty() ? "/" : path, ": ", what));
  }

  std::string rule(const std::string& body) {
    const std::string name = message("s", count_++);
    rules_ += name + " ::= " + body + "\n";
    return name;
  }

  int64_t count(const json& s, const char* key, const std::string& path) {
    const json& v = s[key];
    if (!v.is_number_integer() && !v.is_number_unsigned())
      refuse(path + "/" + key, message("expected a non-negative integer, got ", json_excerpt(v)));
    if (v.is_number_integer() && v.get<int64_t>() < 0)
      refuse(path + "/" + key, message("expected a non-negative integer, got ", v.get<int64_t>()));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMaxRepeat) : v.get<int64_t>() > kMaxRepeat)
      refuse(path + "/" + key, message("at most ", kMaxRepeat, " is supported, got ", json_excerpt(v)));
    return v.get<int64_t>();
  }

  // `x` repeated m..n times (n -1: unbounded) in GBNF.
  static std::string repeat(const std::string& x, int64_t m, int64_t n) {
    if (n < 0) return message(x, "{", m, ",}");
    return message(x, "{", m, ",", n, "}");
  }

  std::string compile(const json& s, const std::string& path, int depth) {
    if (depth > kMaxJsonDepth) refuse(path, message("schemas nested deeper than ", kMaxJsonDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return "json-value";
      refuse(path, "the schema false allows no value");
    }
    if (!s.is_object()) refuse(path, message("expected a schema (an object or a boolean), got ", json_excerpt(s)));
    for (const auto& [key, value] : s.items()) {
      static const std::set<std::string, std::less<>> known = {
          "type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems",
          "maxItems", "anyOf", "$ref", "minLength", "maxLength"};
      if (known.count(key) || kAnnotations.count(key)) continue;
      std::string hint;
      if (key == "oneOf") hint = " (anyOf is)";
      if (key == "pattern" || key == "format" || key == "patternProperties") hint = " (regular expressions and formats are not enforced)";
      refuse(path + "/" + key, "'" + key + "' is not supported" + hint);
    }
    if (s.contains("$ref")) {
      if (s.size() > 1)
        for (const auto& [key, value] : s.items())
          if (key != "$ref" && !kAnnotations.count(key)) refuse(path + "/" + key, "'" + key + "' beside '$ref' is not supported");
      return ref(s["$ref"], path + "/$ref", depth);
    }
    if (s.contains("const")) return literal(s["const"].dump());
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) refuse(path + "/enum", message("expected a non-empty array, got ", json_excerpt(e)));
      std::string body;
      for (const json& v : e) body += (body.empty() ? "" : " | ") + literal(v.dump());
      return "(" + body + ")";
    }
    if (s.contains("anyOf")) {
      const json& a = s["anyOf"];
      if (!a.is_array() || a.empty()) refuse(path + "/anyOf", message("expected a non-empty array of schemas, got ", json_excerpt(a)));
      std::string body;
      for (size_t i = 0; i < a.size(); ++i)
        body += (i ? " | " : "") + compile(a[i], message(path, "/anyOf/", i), depth + 1);
      return "(" + body + ")";
    }
    if (s.contains("type") && s["type"].is_array()) {
      const json& types = s["type"];
      if (types.empty()) refuse(path + "/type", "expected a type or a non-empty array of types, got []");
      std::string body;
      for (size_t i = 0; i < types.size(); ++i) {
        json one = s;
        one["type"] = types[i];
        body += (i ? " | " : "") + typed(one, types[i], message(path, "/type/", i), path, depth, true);
      }
      return "(" + body + ")";
    }
    std::string type;
    if (s.contains("type")) {
      if (!s["type"].is_string()) refuse(path + "/type", message("expected a type name, got ", json_excerpt(s["type"])));
      return typed(s, s["type"], path + "/type", path, depth);
    }
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
      return typed(s, "object", path, path, depth);
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed(s, "array", path, path, depth);
    if (s.contains("minLength") || s.contains("maxLength")) return typed(s, "string", path, path, depth);
    return "json-value";
  }

  // One type's values. listed: one of a list of types, where keywords of the others are read past
  // (maxLength with ["string", "null"] constrains the strings only); alone, a keyword that cannot
  // apply to the type is refused as the mistake it likely is.
  std::string typed(const json& s, const json& type_value, const std::string& type_path, const std::string& path,
                    int depth, bool listed = false) {
    if (!type_value.is_string()) refuse(type_path, message("expected a type name, got ", json_excerpt(type_value)));
    const std::string type = type_value.get<std::string>();
    const auto only = [&](std::initializer_list<const char*> allowed) {
      static const char* value_keys[] = {"properties", "required", "additionalProperties", "items", "minItems",
                                         "maxItems", "minLength", "maxLength"};
      for (const char* k : value_keys) {
        if (listed || !s.contains(k)) continue;
        if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return std::string_view(a) == k; }) ==
            allowed.end())
          refuse(path + "/" + k, "'" + std::string(k) + "' does not apply to type '" + type + "'");
      }
    };
    if (type == "string") {
      only({"minLength", "maxLength"});
      if (!s.contains("minLength") && !s.contains("maxLength")) return "json-string";
      const int64_t m = s.contains("minLength") ? count(s, "minLength", path) : 0;
      const int64_t n = s.contains("maxLength") ? count(s, "maxLength", path) : -1;
      if (n >= 0 && n < m) refuse(path + "/maxLength", message("expected at least minLength (", m, "), got ", n));
      return rule("\"\\\"\" " + repeat("json-char", m, n) + " \"\\\"\"");
    }
    if (type == "integer") {
      only({});
      return "json-integer";
    }
    if (type == "number") {
      only({});
      return "json-number";
    }
    if (type == "boolean") {
      only({});
      return "json-boolean";
    }
    if (type == "null") {
      only({});
      return "json-null";
    }
    if (type == "array") {
      only({"items", "minItems", "maxItems"});
      const std::string item = s.contains("items") ? compile(s["items"], path + "/items", depth + 1) : "json-value";
      const int64_t m = s.contains("minItems") ? count(s, "minItems", path) : 0;
      const int64_t n = s.contains("maxItems") ? count(s, "maxItems", path) : -1;
      if (n >= 0 && n < m) refuse(path + "/maxItems", message("expected at least minItems (", m, "), got ", n));
      if (n == 0) return "\"[\" ws \"]\"";
      const std::string one = rule(item + " ws");
      const std::string more = rule("\",\" ws " + one);
      const std::string tail = repeat(more, std::max<int64_t>(m - 1, 0), n < 0 ? -1 : n - 1);
      if (m == 0) return rule("\"[\" ws ( " + one + " " + tail + " )? \"]\"");
      return rule("\"[\" ws " + one + " " + tail + " \"]\"");
    }
    if (type == "object") {
      only({"properties", "required", "additionalProperties"});
      return object(s, path, depth);
    }
    refuse(type_path, "unknown type '" + type + "' (expected string, integer, number, boolean, null, array or object)");
  }

  std::string object(const json& s, const std::string& path, int depth) {
    std::vector<std::pair<std::string, std::string>> props;  // (key literal, value rule)
    std::set<std::string> required;
    if (s.contains("required")) {
      const json& r = s["required"];
      if (!r.is_array()) refuse(path + "/required", message("expected an array of property names, got ", json_excerpt(r)));
      for (const json& k : r) {
        if (!k.is_string()) refuse(path + "/required", message("expected property names, got ", json_excerpt(k)));
        required.insert(k.get<std::string>());
      }
    }
    std::vector<char> optional;
    if (s.contains("properties")) {
      const json& p = s["properties"];
      if (!p.is_object()) refuse(path + "/properties", message("expected an object of schemas, got ", json_excerpt(p)));
      for (const auto& [key, sub] : p.items()) {
        const std::string value = compile(sub, path + "/properties/" + key, depth + 1);
        props.emplace_back(literal(json(key).dump()), value);
        optional.push_back(!required.count(key));
      }
    }
    for (const std::string& k : required)
      if (!s.contains("properties") || !s["properties"].contains(k))
        refuse(path + "/required", "'" + k + "' is required but not among the properties");
    const json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (extra && !extra->is_boolean() && !extra->is_object())
      refuse(path + "/additionalProperties", message("expected a boolean or a schema, got ", json_excerpt(*extra)));
    if (props.empty()) {
      if (extra && extra->is_boolean() && !extra->get<bool>()) return "\"{\" ws \"}\"";
      if (!extra || extra->is_boolean()) return "json-object";
      const std::string value = compile(*extra, path + "/additionalProperties", depth + 1);
      const std::string kv = rule("json-string ws \":\" ws " + value + " ws");
      return rule("\"{\" ws ( " + kv + " ( \",\" ws " + kv + " )* )? \"}\"");
    }
    // The declared properties in order (extra ones never generated: every instance is still
    // valid). first_i: properties i.. with none written yet; rest_i: with one written (a comma).
    const size_t n = props.size();
    std::vector<std::string> kv(n), first(n + 1), rest(n + 1);
    for (size_t i = 0; i < n; ++i) kv[i] = rule(props[i].first + " ws \":\" ws " + props[i].second + " ws");
    first[n] = rest[n] = "";
    for (size_t i = n; i-- > 0;) {
      const std::string after = rest[i + 1].empty() ? "" : " " + rest[i + 1];
      const std::string with = "\",\" ws " + kv[i] + after;
      std::string r = optional[i] ? rule(with + (rest[i + 1].empty() ? " | " : " | " + rest[i + 1])) : rule(with);
      std::string f = optional[i] ? rule(kv[i] + after + " | " + (first[i + 1].empty() ? "" : first[i + 1]))
                                  : rule(kv[i] + after);
      rest[i] = r;
      first[i] = f;
    }
    return rule("\"{\" ws " + first[0] + " \"}\"");
  }

  // "#", "#/$defs/name", any JSON pointer into this document; a rule per target, made once, so
  // recursive schemas work.
  std::string ref(const json& r, const std::string& path, int depth) {
    if (!r.is_string()) refuse(path, message("expected a string, got ", json_excerpt(r)));
    const std::string target = r.get<std::string>();
    if (const auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#')
      refuse(path, "only references into this schema ('#', '#/$defs/...') are supported, got '" + target + "'");
    const json* node = &root_;
    try {
      node = &root_.at(json::json_pointer(target.substr(1)));
    } catch (const std::exception&) {
      refuse(path, "'" + target + "' does not point into this schema");
    }
    const std::string name = message("ref", refs_.size());
    refs_.emplace(target, name);
    const std::string body = compile(*node, target.substr(1), depth + 1);
    rules_ += name + " ::= " + body + "\n";
    return name;
  }

  const json& root_;
  std::string source_;
  std::string rules_;
  std::map<std::string, std::string> refs_;
  int count_ = 0;
};

}  // namespace

std::string schema_to_gbnf(std::string_view schema_json, std::string_view source) {
  const json schema = parse_ordered_json(schema_json, source, "schema", "a JSON Schema");
  return Compiler(schema, source).run();
}

}  // namespace mhsa::detail
