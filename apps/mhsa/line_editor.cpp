// apps/mhsa/line_editor.cpp — see line_editor.h.
#include "line_editor.h"

#include <langinfo.h>
#include <unistd.h>

#include <cerrno>
#include <clocale>
#include <cstdio>
#include <string_view>

#ifdef MHSA_HAVE_LIBEDIT
#include <histedit.h>
#endif

namespace mhsa::cli {

#ifdef MHSA_HAVE_LIBEDIT
namespace {

const char* g_prompt = "> ";  // libedit asks a C callback for the prompt

extern "C" char* prompt_of(EditLine*) { return const_cast<char*>(g_prompt); }

class EditLineEditor final : public LineEditor {
 public:
  explicit EditLineEditor(const char* prompt) {
    g_prompt = prompt;
    // libedit reads characters in LC_CTYPE's encoding; a chat is UTF-8 whatever the environment
    // says (in the C locale it would echo "中" as octal escapes).
    std::setlocale(LC_CTYPE, "");
    if (std::string_view(nl_langinfo(CODESET)) != "UTF-8") std::setlocale(LC_CTYPE, "C.UTF-8");
    el_ = el_init("mhsa", stdin, stdout, stderr);
    history_ = history_init();
    HistEvent ev;
    history(history_, &ev, H_SETSIZE, 1000);
    history(history_, &ev, H_SETUNIQUE, 1);
    el_set(el_, EL_EDITOR, "emacs");
    el_set(el_, EL_PROMPT, prompt_of);
    el_set(el_, EL_HIST, history, history_);
    el_set(el_, EL_SIGNAL, 0);  // chat's own SIGINT handler stays: a Ctrl-C ends the read with EINTR
  }
  ~EditLineEditor() override {
    el_end(el_);
    history_end(history_);
  }

  bool read(std::string& line, bool& interrupted) override {
    line.clear();
    interrupted = false;
    int count = 0;
    errno = 0;
    const char* got = el_gets(el_, &count);
    if (got == nullptr) {
      if (count < 0 && errno == EINTR) {
        interrupted = true;
        return true;
      }
      return false;  // Ctrl-D, or the terminal gone
    }
    line.assign(got, static_cast<size_t>(count));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) {
      HistEvent ev;
      history(history_, &ev, H_ENTER, line.c_str());
    }
    return true;
  }

 private:
  EditLine* el_ = nullptr;
  History* history_ = nullptr;
};

}  // namespace

std::unique_ptr<LineEditor> LineEditor::open(const char* prompt) {
  if (isatty(0) != 1 || isatty(1) != 1) return nullptr;
  return std::make_unique<EditLineEditor>(prompt);
}
#else
std::unique_ptr<LineEditor> LineEditor::open(const char*) { return nullptr; }
#endif

}  // namespace mhsa::cli
