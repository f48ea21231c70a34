// apps/mhsa/explain_cmd.cpp — `mhsa explain`: what every attention head of a model (any family) does on a
// prompt, as a self-contained HTML report (--out), BertViz-style JSON (--json) or a terminal
// heatmap of one head (--format text). The numbers come from mhsa::explain (mhsa/explain.h); this
// file lays them out. The page (markup, style, script) is apps/mhsa/explain_report.html, built
// into the binary by cmake/embed.cmake; the data goes where the page says <!-- mhsa:data -->.
//
// Every layer × head at full resolution would not fit a page (GPT-2 small on 1000 tokens holds
// 144 million probabilities), so the report stores three levels, each base64 in its own
// <script type="text/plain"> block that the page decodes only when it needs it:
//   - thumbnails: every head max-pooled to at most kThumbSize² cells, 8 bits (round(255·p));
//   - detail: every head max-pooled to at most n² cells, 8 bits, n as large as kDetailBudget allows
//     (n = T, every probability, for short prompts or small models);
//   - exact: the chosen head's float32 probabilities, bit for bit those of the JSON.
// Max-pooling (not averaging) keeps a single strongly attended token visible when shrunk.
// Causal matrices are stored as their lower triangles (j ≤ i), row by row.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "default_model.h"
#include "explain_report_html.h"
#include "explain_tokens.h"
#include "io/file.h"
#include "mhsa/chat.h"
#include "mhsa/error.h"
#include "mhsa/explain.h"
#include "mhsa/model.h"
#include "mhsa/tokenizer.h"
#include "options.h"
#include "output.h"

namespace mhsa::cli {

// A token's bytes as text: invalid UTF-8 becomes U+FFFD; spaces and control characters stay.
std::string token_text(std::string_view bytes) {
  std::string s;
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    bool ok = len > 0 && i + len <= bytes.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (ok) {
      s.append(bytes.substr(i, len));
      i += len;
    } else {
      s += "\uFFFD";
      ++i;
    }
  }
  return s;
}

// A token's text as a label that shows every character: a space "·", a newline "↵", a tab "→",
// other control characters their Unicode control pictures (U+2400 + c, U+2421 for DEL). One
// character for one, so the label lines up with the text character by character (the report
// dims what was replaced).
std::string token_label(std::string_view text) {
  std::string s;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == ' ') s += "\u00B7";
    else if (c == '\n') s += "\u21B5";
    else if (c == '\t') s += "\u2192";
    else if (c < 0x20) s += std::string{'\xE2', '\x90', static_cast<char>(0x80 + c)};
    else if (c == 0x7F) s += "\u2421";
    else s += ch;
  }
  return s;
}

// A conversation through the model's chat template (as transformers' apply_chat_template, no
// generation prompt), its ids, and each token's role: the role of the message whose text it begins
// in. A message's text ends where the conversation rendered up to it stops agreeing with the whole
// one (templates render each message after the ones before it). The conversation must fit
// max_tokens (`limit` says why, `who` begins the errors) before the prefixes are rendered:
// rendering every prefix is quadratic in the number of messages. `mhsa explain --messages` and
// `mhsa serve`'s /v1/explain both come here, so the two give the same tokens.
std::vector<int32_t> conversation_ids(const Tokenizer& tok, const std::vector<ChatMessage>& messages, int64_t max_tokens,
                                      std::string_view limit, std::string_view who, std::vector<std::string>& roles) {
  if (tok.chat_template().empty())
    throw Error(detail::message(who, ": expected a model with a chat template, got one without (use --prompt)"));
  nlohmann::json list = nlohmann::json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  const std::string whole = tok.apply_chat_template(list.dump());
  const std::vector<int32_t> ids = tok.encode(whole, EncodeOptions{false, true});
  if (static_cast<int64_t>(ids.size()) > max_tokens)
    throw Error(detail::message(who, ": expected at most ", max_tokens, " tokens (", limit, "), got ", ids.size(), " tokens"));
  std::vector<size_t> ends(messages.size());
  for (size_t k = 0; k + 1 < messages.size(); ++k) {  // the common prefix with the whole conversation
    nlohmann::json prefix(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(k + 1));
    const std::string part = tok.apply_chat_template(prefix.dump());
    size_t n = 0;
    while (n < part.size() && n < whole.size() && part[n] == whole[n]) ++n;
    ends[k] = n;
  }
  ends.back() = whole.size();
  size_t at = 0, k = 0;
  for (int32_t id : ids) {
    while (k + 1 < ends.size() && at >= ends[k]) ++k;
    roles.push_back(messages[k].role);
    at += tok.token_bytes(id).size();
  }
  return ids;
}

std::string base64(const std::vector<uint8_t>& bytes) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  s.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = (uint32_t{bytes[i]} << 16) | (i + 1 < bytes.size() ? uint32_t{bytes[i + 1]} << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t{bytes[i + 2]} : 0);
    s += kDigits[(n >> 18) & 63];
    s += kDigits[(n >> 12) & 63];
    s += i + 1 < bytes.size() ? kDigits[(n >> 6) & 63] : '=';
    s += i + 2 < bytes.size() ? kDigits[n & 63] : '=';
  }
  return s;
}

namespace {

namespace fs = std::filesystem;
using detail::message;

constexpr int64_t kThumbSize = 64;              // grid heatmaps are drawn 64 px wide
constexpr int64_t kDetailBudget = 6 << 20;      // bytes of 8-bit detail for all heads: ~8 MB of base64
constexpr int64_t kTraceEnds = 8;               // the walk-through shows the first and last 8 tokens
constexpr int64_t kTextColumns = 96;            // the terminal heatmap pools longer prompts to this

struct ExplainArgs {
  std::string model, dtype;
  std::string prompt, messages;
  int64_t layer = 0;
  int64_t head = 0;
  std::string out;
  std::string json;
  std::string format = "html";
  int threads = 0;
};

// ---- text helpers ----------------------------------------------------------------------------

// Code points in a UTF-8 string (its width in a terminal, for the characters tokens hold).
size_t width(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// `s` cut or padded to `w` terminal columns.
std::string fit(const std::string& s, size_t w) {
  if (width(s) <= w) return s + std::string(w - width(s), ' ');
  std::string cut;
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((s[i] & 0xC0) != 0x80 && ++n == w) break;
    cut += s[i];
  }
  return cut + "\u2026";
}

// ---- probabilities, pooled -------------------------------------------------------------------

// Max-pools a causal [T, T] matrix to [n, n] (n ≤ T): block b covers rows and columns
// [b·T/n, (b+1)·T/n). Returns the lower triangle (bj ≤ bi), row by row; blocks above it are 0.
std::vector<float> pool_lower(const float* p, int64_t T, int64_t n) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(n * (n + 1) / 2));
  std::vector<float> column_max(static_cast<size_t>(T));
  for (int64_t bi = 0; bi < n; ++bi) {
    const int64_t r0 = bi * T / n, r1 = (bi + 1) * T / n;
    std::fill(column_max.begin(), column_max.begin() + r1, 0.0f);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j <= r; ++j) column_max[static_cast<size_t>(j)] = std::max(column_max[static_cast<size_t>(j)], p[r * T + j]);
    for (int64_t bj = 0; bj <= bi; ++bj) {
      const int64_t c0 = bj * T / n, c1 = (bj + 1) * T / n;
      out.push_back(*std::max_element(column_max.begin() + c0, column_max.begin() + c1));
    }
  }
  return out;
}

void append_u8(std::vector<uint8_t>& bytes, const std::vector<float>& values) {
  for (float v : values) bytes.push_back(static_cast<uint8_t>(std::lround(std::clamp(v, 0.0f, 1.0f) * 255.0f)));
}

// The largest detail size n ≤ T whose lower triangles for every head fit kDetailBudget (never
// below the thumbnails' size).
int64_t detail_size(int64_t T, int64_t heads) {
  int64_t n = T;
  while (n > kThumbSize && heads * n * (n + 1) / 2 > kDetailBudget) --n;
  return n;
}

// ---- JSON ------------------------------------------------------------------------------------

void append_float(std::string& s, float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  s.append(buf, r.ptr);
}

// {"tokens": [...], "ids": [...], "attention": [layer][1][H][T][T]}, streamed: the full
// precision nested lists of a long prompt run to gigabytes, too many for a json object in memory.
void write_json(OutputFile& f, const std::vector<std::string>& tokens, const std::vector<std::string>& roles,
                const Explanation& e) {
  if (!roles.empty()) f.write("{\"roles\": " + nlohmann::json(roles).dump() + ", ");
  f.write((roles.empty() ? "{" : "") + std::string("\"tokens\": ") +
          nlohmann::json(tokens).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
          ", \"ids\": " + nlohmann::json(e.ids).dump() + ", \"attention\": [");
  std::string row;
  for (size_t l = 0; l < e.attention.size(); ++l) {
    const Tensor& a = e.attention[l];  // [1, H, T, T]
    const int64_t H = a.dim(1), T = a.dim(2);
    f.write(l ? ", [[" : "[[");
    for (int64_t h = 0; h < H; ++h) {
      f.write(h ? ", [" : "[");
      for (int64_t i = 0; i < T; ++i) {
        row.assign(i ? ", [" : "[");
        for (int64_t j = 0; j < T; ++j) {
          if (j) row += ", ";
          append_float(row, a.data()[(h * T + i) * T + j]);
        }
        row += ']';
        f.write(row);
      }
      f.write("]");
    }
    f.write("]]");
  }
  f.write("]}\n");
  f.commit();
}

// ---- the HTML report -------------------------------------------------------------------------

double rounded(float v) {  // 4 significant digits: what a table shows, and a smaller page
  if (!std::isfinite(v)) return v;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", static_cast<double>(v));
  return std::strtod(buf, nullptr);
}

// Rows `rows` of a [T, W] tensor, every column (or, for [T, T] ones, the columns `rows`); −∞ is null.
nlohmann::json rows_of(const Tensor& t, const std::vector<int64_t>& rows, bool square) {
  nlohmann::json out = nlohmann::json::array();
  const int64_t W = t.dim(1);
  for (int64_t i : rows) {
    nlohmann::json r = nlohmann::json::array();
    const auto cell = [&](int64_t j) {
      const float v = t.data()[i * W + j];
      r.push_back(std::isfinite(v) ? nlohmann::json(rounded(v)) : nlohmann::json(nullptr));
    };
    if (square)
      for (int64_t j : rows) cell(j);
    else
      for (int64_t j = 0; j < W; ++j) cell(j);
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::json trace_json(const HeadTrace& t) {
  const int64_t T = t.x.dim(0);
  std::vector<int64_t> rows;  // every token of a short prompt, else the first and last kTraceEnds
  for (int64_t i = 0; i < T; ++i)
    if (T <= 2 * kTraceEnds || i < kTraceEnds || i >= T - kTraceEnds) rows.push_back(i);
  nlohmann::json j;
  j["rows"] = rows;
  const std::pair<const char*, const Tensor*> vectors[] = {
      {"token_embedding", &t.token_embedding}, {"position_embedding", &t.position_embedding}, {"x", &t.x},
      {"ln", &t.ln}, {"q", &t.q}, {"k", &t.k}, {"v", &t.v}, {"head_out", &t.head_out}, {"concat", &t.concat},
      {"out", &t.out}};
  for (const auto& [name, tensor] : vectors) j[name] = rows_of(*tensor, rows, false);
  j["scores"] = rows_of(t.scores, rows, true);
  j["scaled"] = rows_of(t.scaled, rows, true);
  j["probs"] = rows_of(t.probs, rows, true);
  return j;
}

std::string script_block(const std::string& id, const std::string& type, const std::string& text) {
  return "<script id=\"" + id + "\" type=\"" + type + "\">" + text + "</script>\n";
}

std::string report_html(const fs::path& model, const ModelConfig& c, const std::vector<std::string>& texts,
                        const std::vector<std::string>& labels, const std::vector<std::string>& roles,
                        const Explanation& e) {
  const auto T = static_cast<int64_t>(e.ids.size());
  const int64_t L = c.num_layers, H = c.num_heads, layer = e.trace.layer, head = e.trace.head;
  const int64_t thumb = std::min(T, kThumbSize), detail = detail_size(T, L * H);

  nlohmann::json meta;
  meta["model"] = model.string();
  meta["tokens"] = texts;
  meta["labels"] = labels;
  if (!roles.empty()) meta["roles"] = roles;
  meta["ids"] = e.ids;
  meta["layers"] = L;
  meta["heads"] = H;
  meta["embed_dim"] = c.hidden_size;
  meta["head_dim"] = c.head_dim;
  meta["chosen"] = {layer, head};
  meta["thumb_size"] = thumb;
  meta["detail_size"] = detail;
  const std::pair<const char*, double HeadSummary::*> metrics[] = {{"entropy", &HeadSummary::entropy},
      {"first_token", &HeadSummary::first_token}, {"previous_token", &HeadSummary::previous_token},
      {"self", &HeadSummary::self}};
  for (const auto& [key, field] : metrics) {  // [layer][head] tables, one per metric
    nlohmann::json& table = meta["summaries"][key] = nlohmann::json::array();
    for (const std::vector<HeadSummary>& heads : e.summaries) {
      nlohmann::json& row = table.emplace_back(nlohmann::json::array());
      for (const HeadSummary& s : heads) row.push_back(s.*field);
    }
  }
  meta["trace"] = trace_json(e.trace);
  // '<' as \u003c: no "</script>" or "<!--" in a token can end or confuse the script block.
  std::string meta_text;
  for (char ch : meta.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
    meta_text += ch == '<' ? std::string("\\u003c") : std::string(1, ch);

  std::string data = script_block("mhsa-meta", "application/json", meta_text);
  std::vector<uint8_t> thumbs;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < H; ++h) append_u8(thumbs, pool_lower(e.attention[l].data() + h * T * T, T, thumb));
  data += script_block("mhsa-thumbs", "text/plain", base64(thumbs));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<uint8_t> bytes;
      append_u8(bytes, pool_lower(e.attention[l].data() + h * T * T, T, detail));
      data += script_block(message("mhsa-detail-", l, "-", h), "text/plain", base64(bytes));
    }
  std::vector<uint8_t> exact;  // float32, little-endian, whatever the host's byte order
  const float* p = e.attention[static_cast<size_t>(layer)].data() + head * T * T;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      uint32_t bits;
      std::memcpy(&bits, &p[i * T + j], 4);
      for (int b = 0; b < 4; ++b) exact.push_back(static_cast<uint8_t>(bits >> (8 * b)));
    }
  data += script_block("mhsa-exact", "text/plain", base64(exact));

  std::string page = kExplainReportHtml;
  const std::string marker = "<!-- mhsa:data -->";
  const size_t at = page.find(marker);
  if (at == std::string::npos) throw Error("mhsa explain: the built-in report page has no <!-- mhsa:data --> marker");
  return page.replace(at, marker.size(), data);
}

// ---- the terminal heatmap --------------------------------------------------------------------

void print_text(const std::vector<std::string>& labels, const Explanation& e, int64_t layer, int64_t head) {
  const auto T = static_cast<int64_t>(labels.size());
  const int64_t n = std::min(T, kTextColumns);
  const std::vector<float> cells = pool_lower(e.attention[static_cast<size_t>(layer)].data() + head * T * T, T, n);
  const auto shade = [](float p) {
    return p < 0.05f ? "\u00B7" : p < 0.2f ? "\u2591" : p < 0.4f ? "\u2592" : p < 0.7f ? "\u2593" : "\u2588";
  };
  std::printf("layer %lld, head %lld: row = query token, column = key token it attends to%s\n",
              static_cast<long long>(layer), static_cast<long long>(head),
              n < T ? message(" (each cell the max over ", T / n, "\u2013", (T + n - 1) / n, " tokens)").c_str() : "");
  std::printf("\u00B7 < 0.05 \u2264 \u2591 < 0.2 \u2264 \u2592 < 0.4 \u2264 \u2593 < 0.7 \u2264 \u2588   (blank: the future, masked)\n");
  std::string ticks;  // every 10th column's key token index, written from that column on
  for (int64_t j = 0; j < n; j += 10) ticks += fit(std::to_string(j * T / n), static_cast<size_t>(std::min<int64_t>(10, n - j)));
  std::printf("%s %s\n", std::string(20, ' ').c_str(), ticks.c_str());
  const size_t digits = std::to_string(T - 1).size();
  size_t k = 0;
  for (int64_t bi = 0; bi < n; ++bi) {
    const int64_t r0 = bi * T / n, r1 = (bi + 1) * T / n;
    const std::string index = std::to_string(r0);
    const std::string label = r1 - r0 == 1 ? std::string(digits - index.size(), ' ') + index + " " + labels[static_cast<size_t>(r0)]
                                           : message(r0, "\u2013", r1 - 1);
    std::string line = fit(label, 20) + "\u2502";
    for (int64_t bj = 0; bj <= bi; ++bj) line += shade(cells[k++]);
    std::printf("%s\n", line.c_str());
  }
  const HeadSummary& s = e.summaries[static_cast<size_t>(layer)][static_cast<size_t>(head)];
  std::printf("entropy %.3f nats, first token %.3f, previous token %.3f, self %.3f (means over query rows 1..T-1)\n",
              s.entropy, s.first_token, s.previous_token, s.self);
}

// ---- the command -----------------------------------------------------------------------------

// --messages: the conversation from a JSON file (or standard input), through conversation_ids.
std::vector<int32_t> messages_file_ids(const Tokenizer& tok, const std::string& path, int64_t max_positions,
                                       std::vector<std::string>& roles) {
  constexpr size_t kMaxBytes = size_t{16} << 20;  // as mhsa chat's --messages
  std::string text;
  if (path == "-") {
    char buf[65536];
    while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) {
      text.append(buf, static_cast<size_t>(std::cin.gcount()));
      if (text.size() > kMaxBytes)
        throw Error(message("mhsa explain: --messages: expected at most ", kMaxBytes >> 20, " MiB on standard input, got more"));
    }
  } else {
    detail::InputFile f(path, "mhsa explain", "--messages");
    if (f.size() > kMaxBytes)
      throw Error(message("mhsa explain: --messages: expected a file of at most ", kMaxBytes >> 20, " MiB, got ",
                          f.size(), " bytes"));
    text = f.read_all();
  }
  return conversation_ids(tok, ChatSession::parse_messages(text), max_positions, "the model's context",
                          "mhsa explain: --messages", roles);
}

void run(ExplainArgs a) {
  use_threads(a.threads);
  if (a.format == "html" && a.out.empty() && a.json.empty())
    throw Error("mhsa explain: --out: expected a file for the HTML report (or --json FILE, or --format text), got none");
  const LoadedModel loaded = load_model(model_dir(a.model), a.dtype);  // --model, or the embedded default model
  const Model& model = loaded.model;
  const Tokenizer& tok = loaded.tokenizer;
  const ModelConfig& c = model.config();
  if (a.prompt == "-") a.prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::vector<std::string> roles;  // with --messages: each token's message role
  // As `mhsa generate`: tokenizer.json as transformers' tokenizer(prompt) (BOS added).
  const std::vector<int32_t> ids =
      a.messages.empty() ? tok.encode(a.prompt, EncodeOptions{tok.is_tokenizer_json(), tok.is_tokenizer_json()})
                         : messages_file_ids(tok, a.messages, c.max_positions, roles);
  const char* input = a.messages.empty() ? "--prompt" : "--messages";
  if (ids.empty()) throw Error(message("mhsa explain: ", input, ": expected some text, got an empty prompt"));
  if (static_cast<int64_t>(ids.size()) > c.max_positions)
    throw Error(message("mhsa explain: ", input, ": expected at most ", c.max_positions,
                        " tokens (the model's context), got ", ids.size(), " tokens"));
  if (a.layer < 0 || a.layer >= c.num_layers)
    throw Error(message("mhsa explain: --layer: expected a layer in [0, ", c.num_layers, "), got ", a.layer));
  if (a.head < 0 || a.head >= c.num_heads)
    throw Error(message("mhsa explain: --head: expected a head in [0, ", c.num_heads, "), got ", a.head));
  std::optional<OutputFile> json, out;  // opened first: a path that cannot be written fails before the work
  if (!a.json.empty()) json.emplace(a.json, "--json");
  if (!a.out.empty()) out.emplace(a.out, "--out");

  const Explanation e = explain(model, ids, a.layer, a.head);
  std::vector<std::string> texts, labels, token_strings;
  for (int32_t id : ids) {
    texts.push_back(token_text(tok.token_bytes(id)));
    labels.push_back(token_label(texts.back()));
    token_strings.push_back(tok.token_string(id));
  }
  if (json) write_json(*json, token_strings, roles, e);
  if (a.format == "text") print_text(labels, e, a.layer, a.head);
  if (out) {
    const std::string page = report_html(loaded.dir, c, texts, labels, roles, e);
    out->write(page);
    out->commit();
    std::fprintf(stderr, "mhsa explain: wrote %s (%zu tokens, %lld layers x %lld heads, %.1f MB)\n", a.out.c_str(),
                 ids.size(), static_cast<long long>(c.num_layers), static_cast<long long>(c.num_heads),
                 static_cast<double>(page.size()) / 1e6);
  }
}

}  // namespace

void add_explain_command(CLI::App& app) {
  auto a = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand("explain", "What every attention head of a model (GPT-2, Llama, Qwen, Mistral, Gemma 2) attends to on a prompt");
  CLI::Option* prompt = cmd->add_option("-p,--prompt", a->prompt, "the text to look at ('-' reads stdin)");
  CLI::Option* messages = cmd->add_option("--messages", a->messages,
                  "or a conversation: a JSON file ('-': stdin) of {\"role\", \"content\"} objects, through the "
                  "model's chat template; the report shows each token's role");
  cmd->add_option("-m,--model", a->model, "a model directory, a GGUF file, or a name: smollm2 (the default), kjv");
  add_dtype_option(cmd, a->dtype);
  cmd->add_option("--layer", a->layer, "the layer to walk through step by step (and --format text's)")
      ->default_val(0)
      ->check(any_integer());
  cmd->add_option("--head", a->head, "the head of that layer")->default_val(0)->check(any_integer());
  cmd->add_option("--out", a->out, "write the HTML report here (self-contained: open it in any browser)");
  cmd->add_option("--json", a->json,
                  "write {\"tokens\", \"ids\", \"attention\": [layer][1][H][T][T]} here (BertViz head_view layout)");
  cmd->add_option("--format", a->format, "html: the report (--out); text: a heatmap of one head on stdout")
      ->default_val("html")
      ->check(one_of({"html", "text"}));
  add_threads_option(cmd, a->threads);
  cmd->callback([a, prompt, messages] {
    if ((prompt->count() > 0) == (messages->count() > 0))
      throw Error(prompt->count() == 0 ? "mhsa explain: --prompt: expected --prompt TEXT or --messages FILE, got neither"
                                       : "mhsa explain: --messages: expected --prompt or --messages, got both");
    if (messages->count() > 0 && a->messages.empty())
      throw Error("mhsa explain: --messages: expected a JSON file ('-': standard input), got ''");
    run(*a);
  });
}

}  // namespace mhsa::cli
