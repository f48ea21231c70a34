// mhsa/mhsa.h — the whole public C++ API in one include.
#pragma once

#include "mhsa/attention.h"
#include "mhsa/chat.h"
#include "mhsa/chat_template.h"
#include "mhsa/error.h"
#include "mhsa/explain.h"
#include "mhsa/gpt2.h"
#include "mhsa/kv_cache.h"
#include "mhsa/kv_pool.h"
#include "mhsa/mha.h"
#include "mhsa/model.h"
#include "mhsa/model_config.h"
#include "mhsa/positional.h"
#include "mhsa/safetensors.h"
#include "mhsa/tensor.h"
#include "mhsa/tokenizer.h"
#include "mhsa/train.h"
