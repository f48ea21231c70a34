// apps/mhsa/main.cpp — the mhsa command-line tool: parses, validates, prints; the work is in the
// library. Exit status 0 on success (and for --help, --version); 2 for every usage error (a
// CLI11 parse error or an mhsa::Error: one line "mhsa: error: ...", then where to find the
// options); 1 when the output cannot be written (a full disk) or something unexpected fails.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

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

// Levenshtein distance: how "--tmp" is near "--temp".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "; did you mean --temp?" for the nearest of `names` within a third of the word's length (at
// least 2 edits), or nothing: a suggestion should be a likely typo, not any option.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& name : names)
    if (const size_t d = edit_distance(word, name); d < best_distance) {
      best = name;
      best_distance = d;
    }
  return best.empty() ? "" : "; did you mean " + best + "?";
}

std::vector<std::string> command_names(CLI::App& app) {
  std::vector<std::string> names;
  for (CLI::App* c : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(c->get_name());
  return names;
}

// The first word typed that CLI11 left over (`left`: its message's list, "0.5 --tmp") and that looks
// like an option (not a negative number or "-"), without any "=value": what the user mistyped.
std::string unknown_option(const std::string& left, const std::vector<std::string>& typed) {
  std::vector<std::string> words;
  for (size_t at = 0; at < left.size();) {
    const size_t end = std::min(left.find(' ', at), left.size());
    words.push_back(left.substr(at, end - at));
    at = end + 1;
  }
  for (const std::string& arg : typed) {
    if (arg.size() < 2 || arg[0] != '-' || std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.') continue;
    if (std::find(words.begin(), words.end(), arg) != words.end()) return arg.substr(0, arg.find('='));
  }
  return "";
}

// Every spelling of cmd's options ("-n", "--max-new-tokens", ...) and the tool's own (--help).
std::vector<std::string> option_names(CLI::App& cmd) {
  std::vector<std::string> names;
  for (const CLI::Option* o : cmd.get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : o->get_snames()) names.push_back("-" + n);
  }
  return names;
}

// CLI11's message in the library's words where CLI11's own read badly.
std::string usage_message(CLI::App& app, const CLI::ParseError& e, const std::vector<std::string>& typed) {
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
    if (what.rfind(prefix, 0) == 0) {
      const std::vector<CLI::App*> chosen = app.get_subcommands();
      CLI::App& cmd = chosen.empty() ? app : *chosen.back();
      if (const std::string option = unknown_option(what.substr(prefix.size()), typed); !option.empty())
        return "unknown option " + option + did_you_mean(option, option_names(cmd));
      return "unexpected argument: " + what.substr(prefix.size());
    }
  return what;
}

}  // namespace

int main(int argc, char** argv) {
  if (const std::string warning = mhsa::cpu::limit_threads(); !warning.empty())  // before any parallel region
    std::fprintf(stderr, "mhsa: warning: %s\n", warning.c_str());
  CLI::App app{"mhsa: multi-head self-attention on the CPU", "mhsa"};
  app.set_version_flag("--version", "mhsa 0.1.0");
  app.footer("Run 'mhsa help COMMAND' (or 'mhsa COMMAND --help') for a command's options.");
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
  // `mhsa help` is `mhsa --help`, `mhsa help CMD` is `mhsa CMD --help` (as git and cargo read them).
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "help") args = args.size() > 1 ? std::vector<std::string>{args[1], "--help"}
                                                                  : std::vector<std::string>{"--help"};
  try {
    if (!args.empty() && args[0][0] != '-' && !is_command(app, args[0])) {
      std::fprintf(stderr, "mhsa: error: unknown command '%s': expected %s%s\nRun 'mhsa --help' for the commands.\n",
                   args[0].c_str(), command_list(app).c_str(), did_you_mean(args[0], command_names(app)).c_str());
      return 2;
    }
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
    app.parse(reversed);
    mhsa::cli::flush_stdout();
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const std::vector<CLI::App*> chosen = app.get_subcommands();
    std::fprintf(stderr, "mhsa: error: %s\nRun 'mhsa%s --help' for the %s.\n", usage_message(app, e, args).c_str(),
                 chosen.empty() ? "" : (" " + chosen.back()->get_name()).c_str(), chosen.empty() ? "commands" : "options");
    return 2;
  } catch (const mhsa::WriteError& e) {  // a file the command writes (a checkpoint, a GGUF): a full disk
    std::fputs(mhsa::cli::error_line(e.what()).c_str(), stderr);
    return 1;
  } catch (const mhsa::Error& e) {
    std::fputs(mhsa::cli::error_line(e.what()).c_str(), stderr);
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
