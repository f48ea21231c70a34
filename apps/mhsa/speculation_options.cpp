// apps/mhsa/speculation_options.cpp — see speculation_options.h.
#include "speculation_options.h"

#include "options.h"

namespace mhsa::cli {

void add_speculation_options(CLI::App* cmd, SpeculationArgs& a) {
  cmd->add_option("--draft,--draft-max", a.draft,
                  "speculative decoding: tokens guessed ahead and checked in one forward (0: off; default " +
                      std::to_string(kDefaultDraft) + " when greedy, 0 with --temperature" +
                      "; at most 7 are checked at once). Greedy output is unchanged bit for bit, sampled output "
                      "keeps its distribution")
      ->check(integer_in(0, 64));
  cmd->add_option("--model-draft,--draft-model", a.model_draft,
                  "a draft model with the same vocabulary (a path or a name) to guess with, instead of prompt "
                  "lookup (the text's own repeats)");
  cmd->add_option("--lookup-ngram", a.ngram, "prompt lookup: the longest run of tokens looked up (1 to 64)")
      ->default_val(4)
      ->check(integer_in(1, 64));
  cmd->add_flag("--draft-fixed", a.fixed,
                "check --draft guesses every step (default: only as many as pay, from the guesses kept so far and "
                "the measured cost of checking them)");
}

void apply_speculation(const SpeculationArgs& a, const std::string& dtype, GenerationOptions& o,
                       std::unique_ptr<LoadedModel>& draft) {
  SpeculationOptions& s = o.speculation;
  // By default only greedy decoding speculates: its tokens are plain decoding's bit for bit. A
  // sampled answer keeps its distribution but draws its random numbers differently, so the same
  // --seed would give another text than mhsa serve or an earlier run; --draft asks for it.
  s.draft_tokens = a.draft >= 0 ? a.draft : o.temperature <= 0.0f ? kDefaultDraft : 0;
  s.ngram_min = 1;
  s.ngram_max = a.ngram;
  s.adaptive = !a.fixed;
  if (!a.model_draft.empty() && s.draft_tokens > 0) {
    draft = std::make_unique<LoadedModel>(
        load_model(resolve_model(a.model_draft, "--model-draft"), dtype, "f32", "--model-draft"));
    s.draft_model = &draft->model;
  }
}

}  // namespace mhsa::cli
