// text/tokenizer.cpp — placeholder, being written.
#include "mhsa/tokenizer.h"

#include "core/check.h"

namespace mhsa {
struct Tokenizer::Impl {};
Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;
Tokenizer Tokenizer::load(const std::filesystem::path&, const std::filesystem::path&) { throw Error("Tokenizer::load: not built yet"); }
Tokenizer Tokenizer::load_dir(const std::filesystem::path&) { throw Error("Tokenizer::load_dir: not built yet"); }
std::vector<int32_t> Tokenizer::encode(std::string_view, bool) const { return {}; }
std::string Tokenizer::decode(std::span<const int32_t>) const { return {}; }
std::string_view Tokenizer::token_bytes(int32_t) const { return {}; }
std::optional<int32_t> Tokenizer::token_id(std::string_view) const { return {}; }
int32_t Tokenizer::vocab_size() const { return 0; }
int32_t Tokenizer::eos_id() const { return 0; }
}  // namespace mhsa
