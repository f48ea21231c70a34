// text/normalize.h — Unicode normalisation (NFC, NFD, NFKC, NFKD) of UTF-8 text, for the
// normalizers of tokenizer.json. Tables generated from Unicode 16.0.0 (unicode_props.cpp).
// Invalid UTF-8 bytes are passed through unchanged. Not a Unicode library.
#pragma once

#include <string>
#include <string_view>

namespace mhsa::text {

enum class NormalForm { nfc, nfd, nfkc, nfkd };

std::string normalize(std::string_view text, NormalForm form);

}  // namespace mhsa::text
