// apps/mhsa/commands.h — one registration function per subcommand; main.cpp wires them to CLI11.
#pragma once

#include <CLI/CLI.hpp>

namespace mhsa::cli {

// `mhsa attention`: runs scaled_dot_product_attention on random inputs of a chosen shape.
void add_attention_command(CLI::App& app);
// `mhsa bench`: the standard speed cases against the machine's measured FMA peak and bandwidth.
void add_bench_command(CLI::App& app);
// `mhsa chat`: a conversation with a model through its chat template, or one answer to a JSON file.
void add_chat_command(CLI::App& app);
// `mhsa perplexity`: a model's perplexity on a text file, as llama.cpp's llama-perplexity computes it.
void add_perplexity_command(CLI::App& app);
// `mhsa quantize`: a model directory written as a GGUF file (f32, f16, bf16 or q8_0) for llama.cpp.
void add_quantize_command(CLI::App& app);
// `mhsa serve`: an OpenAI-compatible HTTP server (completions, chat completions, streaming).
void add_serve_command(CLI::App& app);
// `mhsa tokenize`: GPT-2 token ids of a text, with a model directory's tokenizer.
void add_tokenize_command(CLI::App& app);
// `mhsa generate`: continues a prompt with a GPT-2 model directory, streaming the text.
void add_generate_command(CLI::App& app);
// `mhsa explain`: what every head attends to, as an HTML report, JSON or a terminal heatmap.
void add_explain_command(CLI::App& app);
// `mhsa train`: trains a byte-level GPT on a text file, with checkpoints that resume bit for bit.
void add_train_command(CLI::App& app);

}  // namespace mhsa::cli
