// text/text_stream.h — generated text with stop strings, released as it becomes final: the tail
// of an unfinished UTF-8 character and any tail that may still become a stop string are held
// back; a stop string ends the text and is not part of it. Used by `mhsa generate` and the serving
// scheduler. Not thread-safe; not a decoder (it is given bytes or decoded pieces).
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/unicode_data.h"

namespace mhsa::text {

class TextStream {
 public:
  // Empty stop strings are dropped (they would match everywhere and nowhere).
  explicit TextStream(std::vector<std::string> stop) : stop_(std::move(stop)) {
    std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
  }

  // Adds a token's bytes; returns true when a stop string has appeared (the text is cut before it).
  bool add(std::string_view bytes) {
    text_ += bytes;
    for (const std::string& s : stop_) {
      const size_t from = text_.size() >= bytes.size() + s.size() ? text_.size() - bytes.size() - s.size() + 1 : 0;
      const size_t at = text_.find(s, from);
      if (at != std::string::npos) {
        text_.resize(at);
        stopped_ = true;
        matched_ = s;  // each match cuts the text shorter: the last one found is the earliest
      }
    }
    return stopped_;
  }
  // The bytes that can be given out now (all of them once finished).
  std::string take(bool finished) {
    size_t end = text_.size();
    if (!finished) {
      end -= incomplete_utf8_tail(text_);
      for (const std::string& s : stop_)  // a tail that is a proper prefix of a stop string
        for (size_t k = std::min(s.size() - 1, end); k > 0; --k)
          if (text_.compare(end - k, k, s, 0, k) == 0) {
            end -= k;
            break;
          }
      end = std::max(end, given_);
    }
    std::string out = text_.substr(given_, end - given_);
    given_ = end;
    return out;
  }
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }
  // The stop string that ended the text ("" until one has).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stop_;
  std::string text_;
  size_t given_ = 0;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace mhsa::text
