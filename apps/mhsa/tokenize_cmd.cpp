// apps/mhsa/tokenize_cmd.cpp — placeholder.
#include "commands.h"
namespace mhsa::cli { void add_tokenize_command(CLI::App&) {} }
