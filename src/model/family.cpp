// model/family.cpp — the registry of families (see model/family.h): one line per family file.
#include "model/family.h"

#include "core/check.h"

namespace mhsa::detail {

extern const FamilyInfo kGpt2Family, kLlamaFamily, kMistralFamily, kQwen2Family, kQwen3Family, kGemma2Family,
    kOlmo2Family, kPhi3Family;

namespace {
const FamilyInfo* const kRegistry[] = {&kGpt2Family,  &kLlamaFamily, &kMistralFamily, &kQwen2Family,
                                       &kQwen3Family, &kGemma2Family, &kOlmo2Family, &kPhi3Family};

template <class Match>
const FamilyInfo* find(Match match) {
  for (const FamilyInfo* f : kRegistry)
    if (match(*f)) return f;
  return nullptr;
}
}  // namespace

std::span<const FamilyInfo* const> families() { return kRegistry; }

const FamilyInfo& family_info(Family family) {
  const FamilyInfo* f = find([&](const FamilyInfo& i) { return i.family == family; });
  if (!f) fail("family_info", "family", "a registered family", std::to_string(static_cast<int>(family)));
  return *f;
}

const FamilyInfo* family_by_type(std::string_view model_type) {
  return find([&](const FamilyInfo& i) { return model_type == i.model_type; });
}

const FamilyInfo* family_by_architecture(std::string_view architecture) {
  return find([&](const FamilyInfo& i) { return architecture == i.architecture; });
}

const FamilyInfo* family_by_gguf_arch(std::string_view arch) {
  return find([&](const FamilyInfo& i) { return i.gguf_arch && arch == i.gguf_arch; });
}

std::string family_list() {
  std::string s;
  const size_t n = std::size(kRegistry);
  for (size_t i = 0; i < n; ++i)
    s += (i == 0 ? "\"" : i + 1 == n ? " or \"" : ", \"") + std::string(kRegistry[i]->model_type) + "\"";
  return s;
}

}  // namespace mhsa::detail
