#include "cli/flag_parsing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <regex>

namespace tessera::cli {

namespace {

// Edit distance (insertions, deletions, substitutions, and swaps of neighbours: "modle" for "model").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// CLI11's wording of a parse error in argparse's: "argument --port: invalid value 'abc'" and the like.
std::string argparse_message(const CLI::App& app, const CLI::ParseError& e) {
  const std::string what = e.what();
  std::smatch m;
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    std::string out = "unrecognized arguments:";
    for (const std::string& extra : app.remaining()) out += " " + extra;
    for (const std::string& extra : app.remaining()) {
      if (extra.size() < 2 || extra[0] != '-') continue;
      const std::string close = closest_flag(app, extra.substr(0, extra.find('=')));
      if (!close.empty()) return out + fmt::format(" (did you mean {}?)", close);
    }
    return out;
  }
  static const std::regex conversion("Could not convert: (\\S+) = (.*)");
  if (std::regex_match(what, m, conversion))
    return fmt::format("argument {}: invalid value: '{}'", m[1].str(), m[2].str());
  static const std::regex not_allowed("The value (.*) is not an allowed value for (\\S+)");
  if (std::regex_match(what, m, not_allowed))
    return fmt::format("argument {}: invalid value: '{}'", m[2].str(), m[1].str());
  static const std::regex missing("(\\S+): \\d+ required .* missing");
  if (std::regex_match(what, m, missing)) return fmt::format("argument {}: expected one argument", m[1].str());
  static const std::regex scoped("(-{1,2}[A-Za-z0-9][-A-Za-z0-9]*): (.*)");
  if (std::regex_match(what, m, scoped)) return fmt::format("argument {}: {}", m[1].str(), m[2].str());
  static const std::regex required("(\\S+) is required");
  if (std::regex_match(what, m, required)) return fmt::format("the following arguments are required: {}", m[1].str());
  return what;
}

}  // namespace

void use_vllm_conventions(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

std::vector<std::string> vllm_spellings(int argc, char** argv) {
  static const std::pair<const char*, const char*> kShort[] = {
      {"-tp", "--tensor-parallel-size"}, {"-pp", "--pipeline-parallel-size"}, {"-dp", "--data-parallel-size"}};
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.size() > 2 && a.starts_with("--")) {
      const size_t eq = std::min(a.find('='), a.size());
      std::replace(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(eq), '_', '-');
    } else if (i > 0) {
      for (const auto& [alias, flag] : kShort)
        if (a == alias || a.starts_with(std::string(alias) + "=")) a = flag + a.substr(std::strlen(alias));
    }
    out.push_back(std::move(a));
  }
  return out;
}

int parse_flags(CLI::App& app, const std::vector<std::string>& given) {
  std::vector<char*> argv;
  for (const std::string& a : given) argv.push_back(const_cast<char*>(a.c_str()));
  return parse_flags(app, static_cast<int>(argv.size()), argv.data());
}

int parse_flags(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args = vllm_spellings(argc, argv);
  // CLI11 takes them in reverse, without the program name.
  std::vector<std::string> rev(args.rbegin(), args.rend() - 1);
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", argparse_message(app, e).c_str());
    return 2;
  }
  return -1;
}

std::string closest_flag(const CLI::App& app, const std::string& name) {
  std::string bare = name;
  while (!bare.empty() && bare.front() == '-') bare.erase(0, 1);
  if (bare.size() < 2) return {};
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const CLI::Option* opt : app.get_options()) {
    std::vector<std::string> names = opt->get_lnames();
    for (const std::string& f : opt->get_fnames()) names.push_back(f);
    for (const std::string& candidate : names) {
      const size_t d = edit_distance(bare, candidate);
      if (d < best_distance) {
        best_distance = d;
        best = "--" + candidate;
      }
    }
  }
  if (best_distance > 0 && best_distance * 3 <= std::max<size_t>(bare.size(), 3)) return best;
  // argparse's abbreviation: the one flag whose name goes on from this one (--kv-cache-memory).
  std::string longer;
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& candidate : opt->get_lnames())
      if (candidate.starts_with(bare + "-")) {
        if (!longer.empty()) return {};
        longer = "--" + candidate;
      }
  return longer;
}

int64_t parse_human_int(const std::string& text, const std::string& flag) {
  auto bad = [&](const std::string& why) -> FlagError {
    return FlagError(fmt::format("argument {}: invalid value '{}': {}", flag, text, why));
  };
  static const std::regex form("(\\d+(?:\\.\\d+)?)([kKmMgGtT]?)");
  std::smatch m;
  if (!std::regex_match(text, m, form))
    throw bad("expected a whole number, optionally with a suffix (32768, 32k = 32000, 32K = 32768)");
  const std::string number = m[1].str();
  const char suffix = m[2].length() ? m[2].str()[0] : '\0';
  const int power = suffix == 0 ? 0 : std::string("kmgt").find(static_cast<char>(std::tolower(suffix))) + 1;
  const bool binary = suffix != 0 && std::isupper(static_cast<unsigned char>(suffix));
  if (number.find('.') != std::string::npos && (suffix == 0 || binary))
    throw bad(suffix == 0 ? "not a whole number"
                          : fmt::format("decimals are not allowed with binary suffixes like {}; did you mean {}{}?",
                                        suffix, number, static_cast<char>(std::tolower(suffix))));
  const long double value = std::stold(number) * std::pow(binary ? 1024.0L : 1000.0L, power);
  if (value > static_cast<long double>(std::numeric_limits<int64_t>::max())) throw bad("too large");
  return static_cast<int64_t>(value);
}

}  // namespace tessera::cli
