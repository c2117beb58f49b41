// The engine flags as `tessera serve` and `tessera generate` parse them (vLLM's spellings and
// human-readable sizes), down to the EngineConfig the engine gets.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/engine_flags.h"
#include "cli/flag_parsing.h"
#include "cli/vllm_flags.h"

namespace tessera::cli {
namespace {

constexpr size_t GiB = size_t{1} << 30, MiB = size_t{1} << 20;

// The flags' values after parsing `args` (the program name is added).
EngineFlags parsed(std::vector<std::string> args) {
  CLI::App app;
  use_vllm_conventions(app);
  EngineFlags f;
  add_engine_flags(app, f);
  args.insert(args.begin(), "tessera");
  EXPECT_EQ(parse_flags(app, args), -1) << args.back();
  return f;
}

TEST(KvCacheMemoryBytes, ReachesTheEngineConfig) {
  EXPECT_EQ(engine_config(parsed({})).kv_cache_memory_bytes, 0u);  // not given: planned from utilization
  EXPECT_EQ(engine_config(parsed({"--kv-cache-memory-bytes", "4G"})).kv_cache_memory_bytes, 4 * GiB);
  EXPECT_EQ(engine_config(parsed({"--kv-cache-memory-bytes=1073741824"})).kv_cache_memory_bytes, GiB);
  // vLLM's underscore spelling; a repeated flag's last value wins.
  EXPECT_EQ(
      engine_config(parsed({"--kv_cache_memory_bytes", "1G", "--kv-cache-memory-bytes", "512M"})).kv_cache_memory_bytes,
      512 * MiB);
}

TEST(KvCacheMemoryBytes, SizesAsVllmReadsThem) {
  EXPECT_EQ(parse_kv_cache_memory_bytes("8589934592"), 8 * GiB);
  EXPECT_EQ(parse_kv_cache_memory_bytes("8G"), 8 * GiB);      // upper case: powers of 1024
  EXPECT_EQ(parse_kv_cache_memory_bytes("8GiB"), 8 * GiB);    // the IEC spelling of the same
  EXPECT_EQ(parse_kv_cache_memory_bytes("8g"), 8000000000u);  // lower case: powers of 1000
  EXPECT_EQ(parse_kv_cache_memory_bytes("1.5g"), 1500000000u);
  EXPECT_EQ(parse_kv_cache_memory_bytes("512MiB"), 512 * MiB);
  EXPECT_EQ(parse_kv_cache_memory_bytes("64K"), 64u * 1024);
  EXPECT_EQ(parse_kv_cache_memory_bytes("1T"), 1024 * GiB);
}

TEST(KvCacheMemoryBytes, MistakesNameTheFlag) {
  auto message = [](const std::string& v) -> std::string {
    try {
      parse_kv_cache_memory_bytes(v);
    } catch (const FlagError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("0").find("argument --kv-cache-memory-bytes: must be a positive number of bytes"),
            std::string::npos);
  EXPECT_NE(message("4GB").find("argument --kv-cache-memory-bytes: invalid value '4GB'"), std::string::npos)
      << message("4GB");
  EXPECT_NE(message("1.5G").find("decimals are not allowed with binary suffixes like G; did you mean 1.5g?"),
            std::string::npos);
  EXPECT_NE(message("1.5GiB").find("did you mean 1.5g?"), std::string::npos);
  EXPECT_NE(message("lots").find("invalid value 'lots'"), std::string::npos);
  EXPECT_NE(message("4giB").find("invalid value '4giB'"), std::string::npos);
  // Through the parser: the error propagates (main prints it as "error: ..." with exit code 2).
  CLI::App app;
  EngineFlags f;
  add_engine_flags(app, f);
  EXPECT_THROW(parse_flags(app, {"tessera", "--kv-cache-memory-bytes", "-1"}), FlagError);
}

TEST(KvCacheMemoryBytes, IsNoLongerARefusedVllmFlag) {
  EXPECT_EQ(refused_vllm_flag_advice("--kv-cache-memory"), nullptr);
  EXPECT_EQ(refused_vllm_flag_advice("--kv-cache-memory-bytes"), nullptr);
  EXPECT_NE(refused_vllm_flag_advice("--cpu-offload-gb"), nullptr);
}

TEST(KvCacheMemoryBytes, TheShorterSpellingIsPointedToIt) {
  CLI::App app;
  EngineFlags f;
  add_engine_flags(app, f);
  EXPECT_EQ(closest_flag(app, "--kv-cache-memory"), "--kv-cache-memory-bytes");
  EXPECT_EQ(closest_flag(app, "--kv-cache-memory-byte"), "--kv-cache-memory-bytes");
  // A start shared by several flags names none of them.
  EXPECT_EQ(closest_flag(app, "--enable"), "");
}

TEST(KvCacheMemoryBytes, HelpExplainsItAndTheRace) {
  CLI::App app;
  EngineFlags f;
  add_engine_flags(app, f);
  const std::string help = app.help();
  EXPECT_NE(help.find("--kv-cache-memory-bytes"), std::string::npos);
  EXPECT_NE(help.find("the utilization is then not used"), std::string::npos);
  EXPECT_NE(help.find("avoids that race"), std::string::npos);
  EXPECT_NE(help.find("two servers on one GPU take e.g. 0.45 each"), std::string::npos);
}

}  // namespace
}  // namespace tessera::cli
