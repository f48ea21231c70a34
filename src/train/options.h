// train/options.h — the training options as a checkpoint stores them (JSON in
// train_state.safetensors' metadata) and the range check they and AdamW's options share. Not
// public: mhsa/train.h declares the options themselves.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "mhsa/train.h"

namespace mhsa::detail {

// Throws mhsa::Error "<fn>: <arg>: expected a finite number >= lo (or in [lo, hi]), got <x>"
// unless x is finite and in range (an open end where the flag says so).
void check_range(std::string_view fn, std::string_view arg, double x, double lo, double hi, bool open_lo = false,
                 bool open_hi = false);

nlohmann::json options_json(const TrainOptions& o);
// Throws nlohmann::json::exception for a missing key or a value of the wrong type (the caller
// names the file); the values are then checked by TrainOptions::validate.
TrainOptions options_from_json(const nlohmann::json& j);

}  // namespace mhsa::detail
