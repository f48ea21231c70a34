// apps/mhsa/serve_fields.cpp — see serve_fields.h.
#include "serve_fields.h"

#include "io/json.h"

namespace mhsa::cli {

using json = nlohmann::json;
using detail::json_excerpt;
using detail::message;

json parse_body(std::string_view body) {
  json b;
  try {
    b = detail::parse_json(body, "request", "body", "a JSON object");
  } catch (const Error& e) {
    throw ApiError{400, e.what(), "invalid_request_error", "", "invalid_json"};
  }
  if (!b.is_object()) bad_field("body", "a JSON object", b);
  return b;
}

void bad_field(const std::string& param, const std::string& expected, const json& got) {
  throw ApiError{400, message(param, ": expected ", expected, ", got ", json_excerpt(got)), "invalid_request_error",
                 param, ""};
}

void unsupported_field(const std::string& param, const std::string& what) {
  throw ApiError{400, message(param, ": ", what, " is not supported by mhsa serve"), "invalid_request_error", param,
                 "unsupported_parameter"};
}

const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number_field(const json& body, const char* key, double fallback, double lo, double hi, bool lo_open) {
  const json* v = field(body, key);
  if (!v) return fallback;
  const std::string range = message("a number in ", lo_open ? "(" : "[", lo, ", ", hi, "]");
  if (!v->is_number()) bad_field(key, range, *v);
  const double x = v->get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) bad_field(key, range, *v);
  return x;
}

int64_t integer_field(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return fallback;
  const std::string range = message("an integer in [", lo, ", ", hi, "]");
  if (!v->is_number_integer()) bad_field(key, range, *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) bad_field(key, range, *v);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) bad_field(key, range, *v);
  return x;
}

bool boolean_field(const json& body, const char* key, bool fallback) {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad_field(key, "true or false", *v);
  return v->get<bool>();
}

std::string string_field(const json& v, const std::string& param) {
  if (!v.is_string()) bad_field(param, "a string", v);
  return v.get<std::string>();
}

}  // namespace mhsa::cli
