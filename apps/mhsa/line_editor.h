// apps/mhsa/line_editor.h — the lines `mhsa chat` reads from a terminal, with line editing and a
// history of the session's lines (libedit, BSD-licensed: arrows, Ctrl-A/E/K/W, Ctrl-R search, Up
// for earlier lines). Only for a terminal: from a pipe or a file, chat reads plain lines itself.
// Built without libedit (its headers absent), open() returns nothing and chat reads as from a pipe.
#pragma once

#include <memory>
#include <string>

namespace mhsa::cli {

class LineEditor {
 public:
  // An editor showing `prompt`, or nullptr where standard input and output are not both a terminal
  // or libedit is not built in.
  static std::unique_ptr<LineEditor> open(const char* prompt);
  virtual ~LineEditor() = default;
  // One line without its newline, added to the history. Returns false at the end of input (Ctrl-D
  // at an empty line). A signal during the read (Ctrl-C: SIGINT caught without SA_RESTART) drops the
  // line typed so far and sets `interrupted`.
  virtual bool read(std::string& line, bool& interrupted) = 0;
};

}  // namespace mhsa::cli
