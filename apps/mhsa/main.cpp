// apps/mhsa/main.cpp — the mhsa command-line tool: parses, validates, prints; the work is in the
// library. Every mhsa::Error becomes a one-line message and exit status 2.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "mhsa/error.h"

int main(int argc, char** argv) {
  CLI::App app{"mhsa: multi-head self-attention on the CPU"};
  app.set_version_flag("--version", "mhsa 0.1.0");
  app.require_subcommand(1);
  mhsa::cli::add_attention_command(app);
  mhsa::cli::add_bench_command(app);
  mhsa::cli::add_explain_command(app);
  mhsa::cli::add_generate_command(app);
  mhsa::cli::add_tokenize_command(app);
  mhsa::cli::add_train_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mhsa::Error& e) {
    std::fprintf(stderr, "mhsa: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mhsa: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
