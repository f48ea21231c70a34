// apps/mhsa/explain_tokens.h — what `mhsa explain` (explain_cmd.cpp) shares with `mhsa serve`'s
// attention view (serve_web.cpp): a conversation's tokens and roles through the chat template, and
// how a token is shown, and base64 for the probabilities. Shared so that the server's view and the command's report are of the same
// tokens. Not the numbers: those are mhsa::explain's (mhsa/explain.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mhsa/chat.h"
#include "mhsa/tokenizer.h"

namespace mhsa::cli {

// A token's bytes as text: invalid UTF-8 becomes U+FFFD; spaces and control characters stay.
std::string token_text(std::string_view bytes);
// A token's text with every character visible (a space "·", a newline "↵", ...), one for one.
std::string token_label(std::string_view text);

// Standard base64 (with '=' padding) of bytes: the report's and the attention view's binary data.
std::string base64(const std::vector<uint8_t>& bytes);

// `messages` through the model's chat template (no generation prompt): the ids, and in `roles`
// each token's message role. Throws mhsa::Error beginning with `who` for a model without a chat
// template or more than max_tokens tokens (`limit` says what bounds them), or the template's error.
std::vector<int32_t> conversation_ids(const Tokenizer& tok, const std::vector<ChatMessage>& messages, int64_t max_tokens,
                                      std::string_view limit, std::string_view who, std::vector<std::string>& roles);

}  // namespace mhsa::cli
