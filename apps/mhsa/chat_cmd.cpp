// apps/mhsa/chat_cmd.cpp — `mhsa chat`: a conversation with an instruction-tuned model through its
// chat template (mhsa::ChatSession: the history stays in the KV cache, each turn evaluates only
// its new tokens).
//
// Interactive: a prompt, the answer streamed as it is made; Ctrl-C during an answer stops it (the
// part shown stays in the conversation), Ctrl-C at the prompt discards the line; /reset starts
// over (keeping --system), /help lists these, /exit or Ctrl-D quits. On a terminal lines are read
// with editing and history (line_editor.h).
// For scripts: --prompt TEXT asks one question, --messages FILE.json (or - for stdin) answers a
// whole conversation; either answers once and exits, with --json as one object. --verbose writes a line per turn to stderr: prompt tokens evaluated
// and reused from the cache, tokens per second.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "default_model.h"
#include "io/file.h"
#include "io/json.h"
#include "line_editor.h"
#include "mhsa/chat.h"
#include "mhsa/error.h"
#include "options.h"
#include "output.h"
#include "constraint_options.h"
#include "speculation_options.h"
#include "text/text_stream.h"

namespace mhsa::cli {
namespace {

constexpr uint64_t kMaxFileBytes = uint64_t{16} << 20;  // --messages and --chat-template
constexpr size_t kMaxLineBytes = size_t{4} << 20;       // one line typed or piped in

struct ChatArgs {
  std::string model, system, chat_template, messages, prompt, dtype, kv_dtype;
  ChatOptions options;
  SamplingArgs sampling;  // --stop, --logit-bias, --seed
  bool json = false, verbose = false;
  SpeculationArgs speculation;
  ConstraintArgs constraint;
  int threads = 0;
};

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);  // set from a signal handler

extern "C" void on_sigint(int) { g_interrupted.store(true); }

// SIGINT sets g_interrupted. `restart`: interrupted system calls resume (while answering, so
// that a write to the terminal is not cut); otherwise a read at the prompt returns EINTR.
void catch_sigint(bool restart) {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = restart ? SA_RESTART : 0;
  sigaction(SIGINT, &sa, nullptr);
}

std::string read_bounded(const std::string& path, const char* option) {
  std::string text;
  if (path == "-") {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(0, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Error(detail::message("mhsa chat: ", option, ": reading standard input: ", std::strerror(errno)));
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > kMaxFileBytes)
        throw Error(detail::message("mhsa chat: ", option, ": expected at most ", kMaxFileBytes >> 20,
                                    " MiB on standard input, got more"));
    }
    return text;
  }
  detail::InputFile f(path, "mhsa chat", option);
  if (f.size() > kMaxFileBytes)
    throw Error(detail::message("mhsa chat: ", option, ": expected a file of at most ", kMaxFileBytes >> 20,
                                " MiB, got ", f.size(), " bytes"));
  return f.read_all();
}

// One line from standard input, without its newline. Returns false at the end of input (a last
// line without a newline is returned first). A Ctrl-C while reading discards what was typed and
// sets `interrupted`.
bool read_line(std::string& line, bool& interrupted) {
  line.clear();
  interrupted = false;
  char c;
  for (;;) {
    const ssize_t n = ::read(0, &c, 1);
    if (n < 0 && errno == EINTR) {
      if (g_interrupted.exchange(false)) {
        interrupted = true;
        return true;
      }
      continue;
    }
    if (n < 0) throw Error(detail::message("mhsa chat: reading standard input: ", std::strerror(errno)));
    if (n == 0) return !line.empty();
    if (c == '\n') break;
    if (line.size() == kMaxLineBytes)
      throw Error(detail::message("mhsa chat: input: expected lines of at most ", kMaxLineBytes >> 20, " MiB, got a longer one"));
    line += c;
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

void print_stats(const ChatTurn& t) {
  const double rate = t.decode_seconds > 0 ? t.generated_tokens / t.decode_seconds : 0.0;
  const double prefill = t.prefill_seconds > 0 ? t.evaluated_tokens / t.prefill_seconds : 0.0;
  std::fprintf(stderr,
               "mhsa chat: prompt %lld tokens: %lld evaluated (%.1f tokens/s), %lld reused from the cache; "
               "%lld generated at %.1f tokens/s; finish: %s\n",
               static_cast<long long>(t.prompt_tokens), static_cast<long long>(t.evaluated_tokens), prefill,
               static_cast<long long>(t.reused_tokens), static_cast<long long>(t.generated_tokens), rate,
               finish_reason_name(t.finish));
  const SpeculationStats& sp = t.speculation;
  if (sp.drafted > 0)
    std::fprintf(stderr, "mhsa chat: speculation: %lld of %lld guesses kept (%.0f%%), %.2f tokens per forward\n",
                 static_cast<long long>(sp.accepted), static_cast<long long>(sp.drafted),
                 100.0 * static_cast<double>(sp.accepted) / static_cast<double>(sp.drafted),
                 sp.forwards ? static_cast<double>(t.generated_tokens - 1) / static_cast<double>(sp.forwards) : 0.0);
}

// One answer, printed as it is made unless `print` is false. The text goes through a TextStream
// for --stop: a stop string ends the answer, is not printed, and is left out of the conversation
// (the next turn re-renders it, reusing the cache up to where it differs).
ChatTurn answer(ChatSession& session, const std::vector<std::string>& stop, bool print,
                const std::function<ChatTurn(const TextCallback&)>& ask) {
  text::TextStream stream(stop);
  ChatTurn t = ask([&](std::string_view piece) {
    if (stream.stopped()) return false;  // the decoder's last bytes, after a stop string
    const bool hit = stream.add(piece);
    if (print) {
      write_stdout(stream.take(hit));
      flush_stdout();
    }
    return !hit;
  });
  if (print) write_stdout(stream.take(true));
  if (stream.stopped()) {
    t.text = stream.text();
    t.finish = FinishReason::end_of_turn;  // "stop", as OpenAI reports a stop string
    std::vector<ChatMessage> messages = session.messages();
    messages.back().content = t.text;
    session.set_messages(std::move(messages));
  }
  return t;
}

// --messages or --prompt: one answer, printed as it is made, or one JSON object with --json.
void answer_once(ChatSession& session, const ChatArgs& a, int64_t context) {
  const char* option = a.messages.empty() ? "--prompt" : "--messages";
  std::vector<ChatMessage> messages = a.messages.empty()
                                          ? std::vector<ChatMessage>{{"user", a.prompt}}
                                          : ChatSession::parse_messages(read_bounded(a.messages, "--messages"));
  if (!a.system.empty()) {
    if (messages[0].role == "system")
      throw Error("mhsa chat: --system: expected no system message in --messages, got one there too");
    messages.insert(messages.begin(), {"system", a.system});
  }
  session.set_messages(std::move(messages));
  catch_sigint(true);
  const ChatTurn t = answer(session, a.sampling.stop, !a.json,
                            [&](const TextCallback& print) { return session.reply(print, &g_interrupted); });
  if (t.finish == FinishReason::context_full && t.generated_tokens == 0)
    throw Error(detail::message("mhsa chat: ", option, ": expected a conversation of fewer than ", context,
                                " tokens (the model's context, with room for an answer), got ", t.prompt_tokens,
                                " tokens"));
  if (a.json) {
    const nlohmann::json j = {{"role", "assistant"},         {"content", t.text},
                              {"finish_reason", finish_reason_name(t.finish)},
                              {"prompt_tokens", t.prompt_tokens}, {"completion_tokens", t.generated_tokens},
                              {"cached_tokens", t.reused_tokens}, {"seed", a.options.generation.seed},
                              {"speculation",
                               {{"forwards", t.speculation.forwards},
                                {"drafted", t.speculation.drafted},
                                {"accepted", t.speculation.accepted}}}};
    write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } else {
    write_stdout("\n");
    flush_stdout();  // the answer first, then any notice, on one terminal
    if (t.finish == FinishReason::max_tokens)
      std::fprintf(stderr, "mhsa chat: answer cut at --max-new-tokens = %lld tokens\n",
                   static_cast<long long>(a.options.generation.max_new_tokens));
    if (t.finish == FinishReason::context_full)
      std::fprintf(stderr, "mhsa chat: answer cut where it filled the model's context (%lld tokens)\n",
                   static_cast<long long>(context));
  }
  flush_stdout();
  if (a.verbose) print_stats(t);
}

constexpr const char* kHelp =
    "  /reset   start a new conversation (keeping --system)\n"
    "  /exit    quit (also /quit, or Ctrl-D at an empty prompt)\n"
    "  /help    this list\n"
    "  Ctrl-C   stops an answer; at the prompt, discards the line\n";

void converse(ChatSession& session, const ChatArgs& a, int64_t context) {
  const bool tty = isatty(0) == 1;
  if (tty)
    std::fprintf(stderr, "mhsa chat: %lld tokens of context. /help lists the commands, /reset clears the conversation, "
                 "/exit or Ctrl-D quits; Ctrl-C stops an answer.\n", static_cast<long long>(context));
  const std::unique_ptr<LineEditor> editor = LineEditor::open("> ");  // editing and history on a terminal
  std::string line;
  for (;;) {
    if (tty && !editor) {
      write_stdout("> ");
      flush_stdout();
    }
    catch_sigint(false);
    bool interrupted = false;
    if (!(editor ? editor->read(line, interrupted) : read_line(line, interrupted))) break;
    g_interrupted.store(false);
    if (interrupted) {  // the terminal has dropped what was typed
      if (tty) write_stdout("\n");
      continue;
    }
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      session.reset();
      std::fprintf(stderr, "mhsa chat: conversation cleared\n");
      continue;
    }
    if (line == "/help" || line == "/?") {
      std::fputs(kHelp, stderr);
      continue;
    }
    if (line[0] == '/' && line.find(' ') == std::string::npos) {
      std::fprintf(stderr, "mhsa chat: unknown command '%s': expected /help, /reset or /exit\n",
                   detail::printable(line).c_str());
      continue;
    }
    catch_sigint(true);
    g_interrupted.store(false);
    try {
      const ChatTurn t = answer(session, a.sampling.stop, true,
                                [&](const TextCallback& print) { return session.send(line, print, &g_interrupted); });
      write_stdout("\n");
      flush_stdout();
      if (t.finish == FinishReason::stopped) std::fprintf(stderr, "mhsa chat: answer stopped\n");
      if (t.finish == FinishReason::max_tokens)
        std::fprintf(stderr, "mhsa chat: answer cut at --max-new-tokens = %lld tokens\n",
                     static_cast<long long>(a.options.generation.max_new_tokens));
      if (t.finish == FinishReason::context_full)
        std::fprintf(stderr, "mhsa chat: the conversation fills the model's context (%lld tokens)%s; "
                     "/reset to start a new one\n", static_cast<long long>(context),
                     t.generated_tokens == 0 ? " and the message was not sent" : "");
      if (a.verbose) print_stats(t);
    } catch (const Error& e) {  // a template's raise_exception, invalid UTF-8: the chat goes on
      std::fputs(error_line(e.what()).c_str(), stderr);
    }
    g_interrupted.store(false);
  }
  if (tty) write_stdout("\n");
  flush_stdout();
}

void run(ChatArgs& a) {
  use_threads(a.threads);
  finish_sampling_options(a.sampling, a.options.generation);
  const ResolvedModel resolved = model_dir(a.model);
  const std::filesystem::path& dir = resolved.path;
  const LoadedModel loaded = load_model(resolved, a.dtype, a.kv_dtype);
  if (!a.chat_template.empty()) {
    a.options.chat_template = read_bounded(a.chat_template, "--chat-template");
    if (a.options.chat_template.empty())
      throw Error("mhsa chat: --chat-template: expected a Jinja template, got an empty file");
  } else if (loaded.tokenizer.chat_template().empty()) {
    const std::string where =
        std::filesystem::is_regular_file(dir)
            ? detail::message("tokenizer.chat_template in the GGUF file '", dir.string(), "'")
            : detail::message("chat_template in '", (dir / "tokenizer_config.json").string(), "' or '",
                              (dir / "chat_template.jinja").string(), "'");
    throw Error(detail::message("mhsa chat: --model: expected a chat template (", where,
                                "), got none; give one with --chat-template FILE"));
  }
  a.options.system = a.system;
  std::unique_ptr<LoadedModel> draft;
  apply_speculation(a.speculation, effective_dtype(resolved, a.dtype), a.options.generation, draft);
  if (draft && draft->tokenizer.vocab_size() != loaded.tokenizer.vocab_size())
    throw Error(detail::message("mhsa chat: --model-draft: expected a model with --model's tokenizer (",
                                loaded.tokenizer.vocab_size(), " tokens), got one of ", draft->tokenizer.vocab_size(),
                                " tokens"));
  // End tokens: the model's; the session adds its template's end-of-turn token (ChatSession).
  a.options.generation.constraint = load_constraint(a.constraint, loaded.tokenizer, loaded.model.config().vocab_size,
                                                    loaded.model.config().eos_token_ids, "mhsa chat");
  ChatSession session(loaded.model, loaded.tokenizer, a.options);
  const int64_t context = loaded.model.config().max_positions;
  if (a.sampling.seed_drawn && !a.json)
    std::fprintf(stderr, "mhsa chat: seed %llu (-s %llu repeats this conversation)\n",
                 static_cast<unsigned long long>(a.options.generation.seed),
                 static_cast<unsigned long long>(a.options.generation.seed));
  if (!a.messages.empty() || !a.prompt.empty())
    answer_once(session, a, context);
  else
    converse(session, a, context);
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "Chat with an instruction-tuned model through its chat template");
  cmd->add_option("-m,--model", a->model,
                  "a model directory (config.json, model.safetensors, tokenizer.json and tokenizer_config.json "
                  "with its chat_template), a GGUF file, or a name: smollm2 (the default)");
  add_dtype_option(cmd, a->dtype);
  add_kv_dtype_option(cmd, a->kv_dtype);
  cmd->add_option("--system", a->system, "a system message at the start of the conversation");
  cmd->add_option("--chat-template", a->chat_template, "a Jinja chat template file to use instead of the model's");
  cmd->add_option("--messages", a->messages,
                  "answer this conversation and exit: a JSON file ('-': stdin) holding an array of "
                  "{\"role\", \"content\"} objects or {\"messages\": [...]}");
  cmd->add_option("-p,--prompt", a->prompt, "ask this one question, print the answer and exit");
  cmd->add_flag("--json", a->json,
                "with --prompt or --messages: print one JSON object (role, content, finish_reason, prompt_tokens, "
                "completion_tokens, cached_tokens)");
  cmd->add_flag("-v,--verbose", a->verbose,
                "a line per turn on stderr: prompt tokens evaluated and reused from the cache, tokens/s");
  GenerationOptions& g = a->options.generation;
  add_sampling_options(cmd, g, a->sampling, 512, "tokens per answer at most");
  add_speculation_options(cmd, a->speculation);
  add_constraint_options(cmd, a->constraint);
  add_threads_option(cmd, a->threads);
  cmd->callback([a] {
    if (a->json && a->messages.empty() && a->prompt.empty())
      throw Error("mhsa chat: --json: expected --prompt TEXT or --messages FILE with it, got neither");
    if (!a->messages.empty() && !a->prompt.empty())
      throw Error("mhsa chat: --prompt: expected either --prompt or --messages, got both");
    run(*a);
  });
}

}  // namespace mhsa::cli
