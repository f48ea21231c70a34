// bench/bench_grammar.cpp — the cost of constrained decoding's token mask (mhsa/grammar.h) over a
// real vocabulary: a JSON text that a schema allows is tokenized, and the constraint is walked
// through its tokens, each step's mask timed, on a new sequence's state (no transition or mask
// known before: the first steps pay for computing them, later ones find the states a JSON text
// returns to). Also the vocabulary's trie build and the schema's compile. Prints microseconds of
// CPU time per token (median, mean, largest). Not a correctness test (tests/cpp/test_grammar.cpp
// compares masks with brute force).
//
//   bench_grammar TOKENIZER (a GGUF file or a tokenizer directory) [rounds = 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "mhsa/grammar.h"
#include "mhsa/tokenizer.h"

namespace {

using clock_type = std::chrono::steady_clock;
double us(clock_type::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
              "zip": {"type": "string"}}, "required": ["street", "city", "zip"], "additionalProperties": false},
  "active": {"type": "boolean"}, "score": {"type": "number"}},
  "required": ["name", "age", "email", "tags", "address", "active", "score"], "additionalProperties": false})";

const char* kText = R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "poetry", "engines"], "address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"}, "active": true, "score": 97.5})";

struct Walk {
  std::vector<double> per_token;  // µs of each step's mask
};

// The thread's CPU time: the mask is one thread's work, and on a shared host wall time would count
// the other processes' turns too.
double cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

Walk walk(mhsa::ConstraintState& s, const std::vector<int32_t>& ids) {
  Walk w;
  for (const int32_t t : ids) {
    const double t0 = cpu_us();
    const bool ok = s.allows(t);
    w.per_token.push_back(cpu_us() - t0);
    if (!ok) {
      std::fprintf(stderr, "bench_grammar: token %d not allowed: the text does not follow the schema\n", t);
      std::exit(1);
    }
    s.advance(t);
  }
  return w;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_grammar TOKENIZER [rounds]\n");
    return 2;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const mhsa::Tokenizer tok = mhsa::Tokenizer::load_dir(argv[1]);
  auto t0 = clock_type::now();
  const auto vocab = mhsa::TokenVocabulary::from_tokenizer(tok, tok.vocab_size());
  const double build_ms = us(clock_type::now() - t0) / 1000;
  t0 = clock_type::now();
  const mhsa::Grammar g = mhsa::Grammar::from_json_schema(kSchema);
  const double compile_ms = us(clock_type::now() - t0) / 1000;
  const mhsa::Constraint c(g, vocab);
  const std::vector<int32_t> ids = tok.encode(kText);
  std::vector<double> medians, means, largest;
  for (int r = 0; r < rounds; ++r) {
    mhsa::ConstraintState s = c.start();
    const Walk w = walk(s, ids);
    double total = 0;
    for (const double x : w.per_token) total += x;
    medians.push_back(median(w.per_token));
    means.push_back(total / static_cast<double>(w.per_token.size()));
    largest.push_back(*std::max_element(w.per_token.begin(), w.per_token.end()));
  }
  std::printf("vocabulary: %lld tokens, trie built in %.1f ms; schema compiled in %.2f ms; text: %zu tokens\n",
              static_cast<long long>(vocab->size()), build_ms, compile_ms, ids.size());
  std::printf("mask per token (a new sequence's state each round): median %.1f us, mean %.1f us, largest %.1f us "
              "(medians of %d rounds)\n",
              median(medians), median(means), median(largest), rounds);
  return 0;
}
