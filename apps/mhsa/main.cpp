// apps/mhsa/main.cpp — the mhsa command-line tool: parses, validates, prints; the work is in the
// library. Exit status 0 on success (and for --help, --version); 2 for every usage error (a
// CLI11 parse error or an mhsa::Error: one line "mhsa: error: ...", then where to find the
// options); 1 when the output cannot be written (a full disk) or something unexpected fails.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "core/cpu.h"
#include "mhsa/error.h"
#include "output.h"

namespace {

// "attention, bench, chat, explain, generate, tokenize or train".
std::string command_list(CLI::App& app) {
  const std::vector<CLI::App*> commands = app.get_subcommands([](CLI::App*) { return true; });
  std::string list;
  for (size_t i = 0; i < commands.size(); ++i)
    list += (i == 0 ? "" : i + 1 == commands.size() ? " or " : ", ") + commands[i]->get_name();
  return list;
}

bool is_command(CLI::App& app, const std::string& name) {
  return !app.get_subcommands([&](CLI::App* c) { return c->check_name(name); }).empty();
}

// CLI11's message in the library's words where CLI11's own read badly.
std::string usage_message(CLI::App& app, const CLI::ParseError& e) {
  const std::string what = e.what(), kind = e.get_name(), name = what.substr(0, what.find(':'));
  if (kind == "RequiredError" && app.get_subcommands().empty())
    return "expected a command (" + command_list(app) + "), got none";
  if (kind == "ArgumentMismatch" && what.ends_with(" missing"))  // "--seed: 1 required UINT missing"
    return name + ": expected a value, got none";
  if (kind == "ConversionError" && what.rfind("Could not convert: ", 0) == 0) {  // a flag given a value
    const size_t eq = what.find(" = ");
    const std::string flag = what.substr(19, eq - 19), value = eq == std::string::npos ? "" : what.substr(eq + 3);
    return flag + ": expected true or false (or no value), got '" + value + "'";
  }
  for (const std::string prefix : {"The following argument was not expected: ",
                                   "The following arguments were not expected: "})
    if (what.rfind(prefix, 0) == 0) return "unexpected argument: " + what.substr(prefix.size());
  return what;
}

}  // namespace

int main(int argc, char** argv) {
  if (const std::string warning = mhsa::cpu::limit_threads(); !warning.empty())  // before any parallel region
    std::fprintf(stderr, "mhsa: warning: %s\n", warning.c_str());
  CLI::App app{"mhsa: multi-head self-attention on the CPU"};
  app.set_version_flag("--version", "mhsa 0.1.0");
  app.require_subcommand(1);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later option overrides
  mhsa::cli::add_attention_command(app);
  mhsa::cli::add_bench_command(app);
  mhsa::cli::add_chat_command(app);
  mhsa::cli::add_explain_command(app);
  mhsa::cli::add_generate_command(app);
  mhsa::cli::add_perplexity_command(app);
  mhsa::cli::add_quantize_command(app);
  mhsa::cli::add_serve_command(app);
  mhsa::cli::add_tokenize_command(app);
  mhsa::cli::add_train_command(app);
  try {
    if (argc > 1 && argv[1][0] != '-' && !is_command(app, argv[1])) {
      std::fprintf(stderr, "mhsa: error: unknown command '%s': expected %s\nRun 'mhsa --help' for the commands.\n",
                   argv[1], command_list(app).c_str());
      return 2;
    }
    app.parse(argc, argv);
    mhsa::cli::flush_stdout();
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const std::vector<CLI::App*> chosen = app.get_subcommands();
    std::fprintf(stderr, "mhsa: error: %s\nRun 'mhsa%s --help' for the %s.\n", usage_message(app, e).c_str(),
                 chosen.empty() ? "" : (" " + chosen.back()->get_name()).c_str(), chosen.empty() ? "commands" : "options");
    return 2;
  } catch (const mhsa::WriteError& e) {  // a file the command writes (a checkpoint, a GGUF): a full disk
    std::fprintf(stderr, "mhsa: error: %s\n", e.what());
    return 1;
  } catch (const mhsa::Error& e) {
    std::fprintf(stderr, "mhsa: error: %s\n", e.what());
    return 2;
  } catch (const mhsa::cli::OutputError& e) {
    std::fprintf(stderr, "mhsa: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mhsa: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
