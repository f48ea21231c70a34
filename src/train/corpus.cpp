// train/corpus.cpp — a training text as tokens (see TextCorpus in mhsa/train.h): its held-out
// tail, the byte counts that turn nats per token into bits per byte, and its fingerprint.
#include "mhsa/train.h"

#include <cmath>
#include <cstdio>

#include "core/check.h"
#include "io/file.h"

namespace mhsa {
namespace {

// "<size> bytes, FNV-1a <hash>" (64-bit FNV-1a: fast, and any edit changes it).
std::string text_fingerprint(std::string_view bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return detail::message(bytes.size(), " bytes, FNV-1a ", hex);
}

}  // namespace

TextCorpus TextCorpus::load(const std::filesystem::path& file, double val_fraction, int64_t context,
                            const Tokenizer& tokenizer) {
  using detail::fail;
  using detail::message;
  constexpr std::string_view fn = "TextCorpus::load";
  const std::string bytes = detail::read_file(file, fn, "data");
  if (!(val_fraction > 0 && val_fraction < 0.5))
    fail(fn, "val_fraction", "a fraction in (0, 0.5)", std::to_string(val_fraction));
  const int64_t n = static_cast<int64_t>(bytes.size());
  const int64_t n_val = static_cast<int64_t>(std::llround(double(n) * val_fraction));
  TextCorpus c;
  c.train = tokenizer.encode(std::string_view(bytes).substr(0, static_cast<size_t>(n - n_val)));
  c.val = tokenizer.encode(std::string_view(bytes).substr(static_cast<size_t>(n - n_val)));
  c.train_bytes = n - n_val;
  c.val_bytes = n_val;
  c.fingerprint = text_fingerprint(bytes);
  const auto train_tokens = static_cast<int64_t>(c.train.size()), val_tokens = static_cast<int64_t>(c.val.size());
  if (train_tokens < 2 * (context + 1) || val_tokens < context + 1)
    fail(fn, "data",
         message("at least ", 2 * (context + 1), " training and ", context + 1, " validation tokens for a context of ",
                 context, " (validation fraction ", val_fraction, ")"),
         message(train_tokens, " and ", val_tokens, " tokens from the ", n, " bytes of '", file.string(), "'"));
  return c;
}

}  // namespace mhsa
