// apps/mhsa/explain_cmd.cpp — placeholder.
#include "commands.h"
namespace mhsa::cli { void add_explain_command(CLI::App&) {} }
