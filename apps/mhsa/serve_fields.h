// apps/mhsa/serve_fields.h — checks of a JSON request's fields, shared by the server's APIs
// (OpenAI's completions, chat and Responses; Anthropic's Messages). Each failure is an ApiError
// (HTTP 400) whose message names the field, what was expected and what was given.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mhsa::cli {

// An answer other than 200: the status and what went wrong. Each API writes it in its own shape
// (OpenAI's {"error": {message, type, param, code}}, Anthropic's {"type": "error", "error": ...}).
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param, code;  // "" is written as null
};

// A request body that must be a JSON object: a 400 "invalid_json" naming the place of a syntax error.
nlohmann::json parse_body(std::string_view body);

[[noreturn]] void bad_field(const std::string& param, const std::string& expected, const nlohmann::json& got);
// An option mhsa does not implement: "PARAM: WHAT is not supported by mhsa serve".
[[noreturn]] void unsupported_field(const std::string& param, const std::string& what);

// The field, or null when absent or null (the APIs treat null as absent).
const nlohmann::json* field(const nlohmann::json& body, const char* key);
double number_field(const nlohmann::json& body, const char* key, double fallback, double lo, double hi,
                    bool lo_open = false);
int64_t integer_field(const nlohmann::json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi);
bool boolean_field(const nlohmann::json& body, const char* key, bool fallback);
std::string string_field(const nlohmann::json& v, const std::string& param);

}  // namespace mhsa::cli
