// vLLM serve flags beyond tessera's own: the ones refused (each with what to do instead), and vLLM's
// `--config FILE` (a YAML file of flags, which the command line overrides).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tessera::cli {

// What to do instead of a vLLM serve flag tessera refuses, or nullptr when `flag` is not one of them.
const char* refused_vllm_flag_advice(const std::string& flag);
// Every refused flag (docs/server.md lists them; a test checks both agree).
std::vector<std::string> refused_vllm_flags();

// vLLM's --config FILE: the YAML file's settings become flags placed before the command line's, so that
// a flag given on the command line wins (argparse's last value). `args` is argv (args[0] the program);
// returns it unchanged when there is no --config. Keys are flag names without the dashes (underscores
// allowed); true is the bare flag, false the flag's --no- form (or nothing, for flags off by default), a
// list repeats the values after the flag, an object becomes its JSON text. Throws FlagError naming the
// file and line for anything else. `app` tells which flags have a --no- form.
std::vector<std::string> expand_config_file(std::vector<std::string> args, const CLI::App& app);

// Parses the YAML subset --config reads (top-level `key: value` lines, `- item` lists, inline [a, b] lists,
// quoted strings, # comments, inline {...} objects kept as JSON) into flags. Exposed for tests.
std::vector<std::string> config_file_flags(const std::string& yaml_text, const std::string& path, const CLI::App& app);

}  // namespace tessera::cli
