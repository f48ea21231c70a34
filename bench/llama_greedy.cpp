// bench/llama_greedy.cpp — the peer side of bench/greedy_vs_llama_cpp.py: llama.cpp's library
// (libllama, built by bench/llama_cpp_peer.sh) runs a GGUF file on given prompt token ids and
// prints the greedy continuation's ids, one JSON array per prompt line. Greedy is the argmax of
// llama_get_logits_ith (the first of equal maxima, as llama.cpp's greedy sampler picks). Not part
// of mhsa: compiled by the bench script against the peer's headers and static libraries.
//
//   llama_greedy MODEL.gguf N_NEW THREADS f32|f16 < prompts   (a line of space-separated ids each)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL.gguf N_NEW THREADS f32|f16 < prompts\n", argv[0]);
    return 2;
  }
  const int n_new = std::atoi(argv[2]), threads = std::atoi(argv[3]);
  const bool kv_f16 = std::strcmp(argv[4], "f16") == 0;
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!model) {
    std::fprintf(stderr, "llama_greedy: cannot load %s\n", argv[1]);
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<llama_token> ids;
    std::istringstream in(line);
    for (llama_token id; in >> id;) ids.push_back(id);
    if (ids.empty()) continue;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(ids.size() + n_new + 1);
    cp.n_batch = cp.n_ctx;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.type_k = cp.type_v = kv_f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    llama_context* ctx = llama_init_from_model(model, cp);  // a fresh context (cache) per prompt
    if (!ctx) {
      std::fprintf(stderr, "llama_greedy: cannot create a context\n");
      return 1;
    }
    std::vector<llama_token> out;
    llama_batch batch = llama_batch_get_one(ids.data(), static_cast<int32_t>(ids.size()));
    llama_token next = 0;
    for (int i = 0; i < n_new; ++i) {
      if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "llama_greedy: llama_decode failed\n");
        return 1;
      }
      const float* logits = llama_get_logits_ith(ctx, -1);
      next = 0;
      for (int v = 1; v < n_vocab; ++v)
        if (logits[v] > logits[next]) next = v;
      out.push_back(next);
      batch = llama_batch_get_one(&next, 1);
    }
    std::printf("[");
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? ", " : "", out[i]);
    std::printf("]\n");
    std::fflush(stdout);
    llama_free(ctx);
  }
  llama_model_free(model);
  return 0;
}
