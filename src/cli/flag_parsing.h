// Command-line conventions of vLLM (Python's argparse with vLLM's FlexibleArgumentParser) for every verb's
// CLI11 app: `--max_model_len` is `--max-model-len`, `-tp` / `-pp` / `-dp` are the parallel sizes, a
// repeated flag takes its last value, sizes such as `32k` are numbers, and every mistake on the command
// line is one `error: ...` line (with the closest flag when a name is misspelt) and exit code 2.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::cli {

// A command-line mistake: main() prints "error: MESSAGE" and exits 2, as argparse does.
class FlagError : public Error {
 public:
  explicit FlagError(std::string message) : Error(ErrorKind::kInvalidArgument, std::move(message)) {}
};

// Call on a new app before adding its options: a repeated option takes its last value (argparse) instead
// of failing; options holding several values (--served-model-name) still collect every one.
void use_vllm_conventions(CLI::App& app);

// argv with vLLM's spellings rewritten to the flags' own: underscores in a `--` flag's name become dashes
// (`--max_model_len=1k` -> `--max-model-len=1k`), `-tp` / `-pp` / `-dp` (also `-tp=2`) become
// `--tensor-parallel-size` / `--pipeline-parallel-size` / `--data-parallel-size`. argv[0] is kept.
std::vector<std::string> vllm_spellings(int argc, char** argv);

// Parses argv (after vllm_spellings). Returns -1 when the flags parsed, else the exit code: 0 after
// printing --help, 2 after printing one "error: ..." line for a parse error (an unknown flag of an app
// without allow_extras names the closest flag).
int parse_flags(CLI::App& app, int argc, char** argv);
// The same for argv as strings (args[0] the program), e.g. after expand_config_file.
int parse_flags(CLI::App& app, const std::vector<std::string>& args);

// The app's flag closest to `name` (a typo: at most a third of its letters off), else the one flag whose
// name goes on from `name` (argparse's abbreviation: --kv-cache-memory for --kv-cache-memory-bytes), or "".
std::string closest_flag(const CLI::App& app, const std::string& name);

// vLLM's human_readable_int: "32768", or a number with a suffix: k / m / g / t are powers of 1000
// ("25.6k" = 25600), K / M / G / T powers of 1024 and whole numbers only ("32K" = 32768). Throws
// FlagError naming `flag` for anything else.
int64_t parse_human_int(const std::string& text, const std::string& flag);

// Runs `checks` (flag validation after parsing: engine_config, the verb's own checks) with their
// invalid-argument and unsupported errors turned into FlagErrors (exit code 2).
template <typename F>
void as_flag_errors(F&& checks) {
  try {
    checks();
  } catch (const FlagError&) {
    throw;
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInvalidArgument || e.kind() == ErrorKind::kUnsupported) throw FlagError(e.what());
    throw;
  }
}

}  // namespace tessera::cli
