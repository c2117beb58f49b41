// Damaged checkpoints through the real binary: `tessera generate --model DIR
// --prompt-ids 1,2,3 --max-tokens 4` must exit non-zero (never by a signal), print
// exactly one "error:" line naming the file and the tensor, and no sanitizer report.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <functional>
#include <sstream>

#include "fault_util.h"

extern char** environ;

namespace tessera {
namespace {

using testing::copy_fixture;
using testing::StFile;
using testing::TempDir;
namespace fs = std::filesystem;

struct RunResult {
  bool signaled = false;
  int signal = 0;
  int exit_code = -1;
  std::string out, err;
};

RunResult run_generate(const fs::path& model_dir, const fs::path& scratch, const std::vector<std::string>& extra = {}) {
  const fs::path out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  std::vector<std::string> args = {TESSERA_BIN,    "generate", "--model",      model_dir.string(),
                                   "--prompt-ids", "1,2,3",    "--max-tokens", "4"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, TESSERA_BIN, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  RunResult r;
  if (rc != 0) {
    ADD_FAILURE() << "cannot run " << TESSERA_BIN << ": " << std::strerror(rc);
    return r;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.signaled = WIFSIGNALED(status);
  r.signal = r.signaled ? WTERMSIG(status) : 0;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = testing::read_file(out);
  r.err = testing::read_file(err);
  return r;
}

std::vector<std::string> error_lines(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("error:", 0) == 0) v.push_back(line);
  return v;
}

// A fault: how to damage a copy of a fixture, and what the one error line must name.
struct Fault {
  std::string name;
  std::string fixture;
  // Damages `dir` (the copy); returns the strings the error line must contain.
  std::function<std::vector<std::string>(const fs::path& dir, const fs::path& tmp)> damage;
};

void PrintTo(const Fault& f, std::ostream* os) { *os << f.name << " (" << f.fixture << ")"; }

std::string q(const std::string& tensor) { return "'" + tensor + "'"; }

// Rewrites dir/model.safetensors after `edit` changed its header or data.
std::vector<std::string> edit_st(const fs::path& dir, const std::function<std::string(StFile&)>& edit,
                                 int64_t header_len = -1) {
  const fs::path p = dir / "model.safetensors";
  StFile st = StFile::read(p);
  std::string tensor = edit(st);
  st.write(p, header_len);
  std::vector<std::string> names = {p.string()};
  if (!tensor.empty()) names.push_back(q(tensor));
  return names;
}

std::string last_tensor(const StFile& st) {
  std::string last;
  for (const auto& n : st.tensor_names())
    if (last.empty() || st.end(n) > st.end(last)) last = n;
  return last;
}

const char* kSingle = "llama_gqa2";
const char* kSharded = "qwen3_mqa_untied_sharded";

std::vector<Fault> faults() {
  const std::string qp = "model.layers.0.self_attn.q_proj.weight";
  return {
      {"MissingDirectory", kSingle,
       [](const fs::path& dir, const fs::path&) {
         fs::remove_all(dir);
         return std::vector<std::string>{dir.string()};
       }},
      {"MissingConfig", kSingle,
       [](const fs::path& dir, const fs::path&) {
         fs::remove(dir / "config.json");
         return std::vector<std::string>{(dir / "config.json").string()};
       }},
      {"MissingWeights", kSingle,
       [](const fs::path& dir, const fs::path&) {
         fs::remove(dir / "model.safetensors");
         return std::vector<std::string>{dir.string()};
       }},
      {"ShorterThanLengthField", kSingle,
       [](const fs::path& dir, const fs::path&) {
         testing::write_file(dir / "model.safetensors", "\x10\x00\x00");
         return std::vector<std::string>{(dir / "model.safetensors").string()};
       }},
      {"TruncatedInHeader", kSingle,
       [](const fs::path& dir, const fs::path&) {
         std::string b = testing::read_file(dir / "model.safetensors");
         testing::write_file(dir / "model.safetensors", b.substr(0, 100));
         return std::vector<std::string>{(dir / "model.safetensors").string()};
       }},
      {"TruncatedInData", kSingle,
       [](const fs::path& dir, const fs::path&) {
         return edit_st(dir, [](StFile& st) {
           std::string t = last_tensor(st);
           st.data.resize((st.begin(t) + st.end(t)) / 2);
           return t;
         });
       }},
      {"HeaderLengthLargerThanFile", kSingle,
       [](const fs::path& dir, const fs::path&) {
         return edit_st(
             dir, [](StFile&) { return std::string(); }, 1 << 30);
       }},
      {"HeaderNotJson", kSingle,
       [](const fs::path& dir, const fs::path&) {
         const fs::path p = dir / "model.safetensors";
         std::string b = testing::read_file(p);
         uint64_t n = 0;
         std::memcpy(&n, b.data(), 8);
         for (uint64_t i = 8; i < 8 + n; ++i) b[i] = (i % 17 == 0) ? '\n' : '#';  // same length, not JSON
         testing::write_file(p, b);
         return std::vector<std::string>{p.string()};
       }},
      {"OffsetsPastTheEnd", kSingle,
       [qp](const fs::path& dir, const fs::path&) {
         return edit_st(dir, [qp](StFile& st) {
           uint64_t len = st.end(qp) - st.begin(qp);
           st.header[qp]["data_offsets"] = {st.data.size(), st.data.size() + len};
           return qp;
         });
       }},
      {"OffsetsInverted", kSingle,
       [qp](const fs::path& dir, const fs::path&) {
         return edit_st(dir, [qp](StFile& st) {
           st.header[qp]["data_offsets"] = {st.end(qp), st.begin(qp)};
           return qp;
         });
       }},
      {"OffsetsOverlap", kSingle,
       [](const fs::path& dir, const fs::path&) {
         return edit_st(dir, [](StFile& st) {
           const std::string k = "model.layers.1.self_attn.k_proj.weight", v = "model.layers.1.self_attn.v_proj.weight";
           st.header[v]["data_offsets"] = st.header[k]["data_offsets"];
           return v;
         });
       }},
      {"SizeNotDtypeTimesShape", kSingle,
       [qp](const fs::path& dir, const fs::path&) {
         return edit_st(dir, [qp](StFile& st) {
           st.header[qp]["shape"] = {63, 64};
           return qp;
         });
       }},
      {"AbsurdShape", kSingle,
       [](const fs::path& dir, const fs::path&) {
         return edit_st(dir, [](StFile& st) {
           const std::string t = "model.norm.weight";
           st.header[t]["shape"] = {1ull << 31, 1ull << 31};
           st.header[t]["dtype"] = "F32";  // 2^62 elements * 4 bytes wraps to 0
           st.header[t]["data_offsets"] = {st.begin(t), st.begin(t)};
           return t;
         });
       }},
      {"UnsupportedDtype", kSingle,
       [](const fs::path& dir, const fs::path&) {
         auto names = edit_st(dir, [](StFile& st) {
           const std::string t = "model.layers.1.mlp.down_proj.weight";
           st.header[t]["dtype"] = "F64";
           return t;
         });
         names.push_back("F64");
         return names;
       }},
      {"MissingTensor", kSingle,
       [](const fs::path& dir, const fs::path&) {
         return edit_st(dir, [](StFile& st) {
           const std::string t = "model.layers.1.post_attention_layernorm.weight";
           st.remove(t);
           return t;
         });
       }},
      {"WrongShapeSameBytes", kSingle,
       [](const fs::path& dir, const fs::path&) {
         return edit_st(dir, [](StFile& st) {
           const std::string t = "model.layers.1.mlp.up_proj.weight";  // [128, 64] -> [64, 128]
           st.header[t]["shape"] = {64, 128};
           return t;
         });
       }},
      {"UnsupportedArchitecture", kSingle,
       [](const fs::path& dir, const fs::path&) {
         auto cfg = testing::read_json(dir / "config.json");
         cfg["architectures"] = {"MambaForCausalLM"};
         testing::write_json(dir / "config.json", cfg);
         return std::vector<std::string>{(dir / "config.json").string(), "MambaForCausalLM"};
       }},
      {"MissingShard", kSharded,
       [](const fs::path& dir, const fs::path&) {
         auto idx = testing::read_json(dir / "model.safetensors.index.json");
         const std::string shard = "model-00004-of-00008.safetensors";
         std::string tensor;
         for (const auto& [t, f] : idx["weight_map"].items())
           if (f == shard && tensor.empty()) tensor = t;
         fs::remove(dir / shard);
         return std::vector<std::string>{(dir / shard).string(), q(tensor)};
       }},
      {"ShardOutsideTheDirectory", kSharded,
       [](const fs::path& dir, const fs::path& tmp) {
         fs::copy_file(dir / "model-00002-of-00008.safetensors", tmp / "stolen.safetensors");
         auto idx = testing::read_json(dir / "model.safetensors.index.json");
         const std::string t = "model.norm.weight";
         idx["weight_map"][t] = "../stolen.safetensors";
         testing::write_json(dir / "model.safetensors.index.json", idx);
         return std::vector<std::string>{(dir / "model.safetensors.index.json").string(), q(t)};
       }},
  };
}

class CliFaults : public ::testing::TestWithParam<Fault> {};

TEST_P(CliFaults, OneErrorLineNamingFileAndTensor) {
  const Fault& f = GetParam();
  TempDir tmp;
  fs::path dir = copy_fixture(f.fixture, tmp.path());
  std::vector<std::string> names = f.damage(dir, tmp.path());
  RunResult r = run_generate(dir, tmp.path());
  SCOPED_TRACE("stderr:\n" + r.err);
  ASSERT_FALSE(r.signaled) << "killed by signal " << r.signal;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.find("Sanitizer"), std::string::npos);
  EXPECT_EQ(r.err.find("runtime error:"), std::string::npos);
  auto lines = error_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << "want exactly one 'error:' line";
  EXPECT_EQ(lines[0].find("error: internal"), std::string::npos) << "a user error, not an internal one";
  for (const auto& n : names) EXPECT_NE(lines[0].find(n), std::string::npos) << "'" << n << "' not named";
  EXPECT_TRUE(r.out.empty()) << "no generated output: " << r.out;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, CliFaults, ::testing::ValuesIn(faults()),
                         [](const auto& info) { return info.param.name; });

// The control: the same copy, undamaged, generates. Without it the tests above
// could pass because the command fails for some unrelated reason.
TEST(CliFaultsControl, IntactCopiesGenerate) {
  for (const char* fixture : {kSingle, kSharded}) {
    SCOPED_TRACE(fixture);
    TempDir tmp;
    fs::path dir = copy_fixture(fixture, tmp.path());
    RunResult r = run_generate(dir, tmp.path());
    ASSERT_FALSE(r.signaled) << r.err;
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(error_lines(r.err).empty()) << r.err;
    EXPECT_FALSE(r.out.empty());
  }
}

// A checkpoint with one NaN tensor (its final norm): it loads, and the request fails naming the step
// and --check-weights instead of sampling token 0; with --check-weights the command refuses it at load,
// one error line naming the tensor.
TEST(CliCheckWeights, NanTensorFailsTheRequestAndCheckWeightsRefusesIt) {
  TempDir tmp;
  fs::path dir = copy_fixture(kSingle, tmp.path());
  StFile st = StFile::read(dir / "model.safetensors");
  const std::string t = "model.norm.weight";
  ASSERT_EQ(st.header.at(t).at("dtype"), "BF16");
  for (uint64_t i = st.begin(t); i + 1 < st.end(t); i += 2) st.data.replace(i, 2, "\xc0\x7f");  // bf16 quiet NaN
  st.write(dir / "model.safetensors");

  RunResult r = run_generate(dir, tmp.path(), {"--json"});
  ASSERT_FALSE(r.signaled) << r.err;
  EXPECT_NE(r.out.find("\"finish_reason\":\"error: step 1: the logits"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--check-weights"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"token_ids\":[]"), std::string::npos) << r.out;

  r = run_generate(dir, tmp.path(), {"--check-weights"});
  ASSERT_FALSE(r.signaled) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto lines = error_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_NE(lines[0].find("--check-weights found NaN or Inf in 1 of"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(t), std::string::npos) << lines[0];

  r = run_generate(copy_fixture(kSharded, tmp.path()), tmp.path(), {"--check-weights"});
  EXPECT_EQ(r.exit_code, 0) << r.err;  // intact weights pass the check
  EXPECT_NE(r.err.find("--check-weights: none of the"), std::string::npos) << r.err;
}

// --quantization fp8 (vLLM's flag) stores a bf16 checkpoint's projections as FP8 blocks while
// loading and says so; another method is refused naming the one that exists.
TEST(CliQuantization, Fp8QuantisesWhileLoadingAndOthersAreRefused) {
  TempDir tmp;
  fs::path dir = copy_fixture(kSingle, tmp.path());
  RunResult r = run_generate(dir, tmp.path(), {"--quantization", "fp8"});
  ASSERT_FALSE(r.signaled) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("FP8 (e4m3)"), std::string::npos) << r.err;
  EXPECT_FALSE(r.out.empty());
  r = run_generate(dir, tmp.path(), {"-q", "awq"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("fp8"), std::string::npos) << r.err;
}

// --speculative-config (vLLM's JSON): ngram runs, says so and generates what plain decoding does;
// a method, field or JSON it does not take is refused before loading, naming it.
TEST(CliSpeculativeConfig, NgramRunsAndBadConfigsAreRefused) {
  TempDir tmp;
  fs::path dir = copy_fixture(kSingle, tmp.path());
  RunResult plain = run_generate(dir, tmp.path(), {"--temperature", "0"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  RunResult r = run_generate(dir, tmp.path(),
                             {"--temperature", "0", "--speculative-config",
                              R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2})"});
  ASSERT_FALSE(r.signaled) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.err.find("Speculative decoding: ngram (num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=2)"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, plain.out);
  for (const auto& [cfg, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"method": "eagle", "num_speculative_tokens": 3})", "'eagle'"},
           {R"({"method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1})",
            "draft_tensor_parallel_size"},
           {R"({"method": "ngram")", "not valid JSON"},
           {R"({"method": "ngram"})", "num_speculative_tokens"},
           // A Llama checkpoint has no multi-token-prediction layer: refused at load, pointing at ngram.
           {R"({"method": "mtp", "num_speculative_tokens": 2})", "multi-token-prediction layer"}}) {
    RunResult bad = run_generate(dir, tmp.path(), {"--speculative-config", cfg});
    EXPECT_NE(bad.exit_code, 0) << cfg;
    EXPECT_NE(bad.err.find(says), std::string::npos) << cfg << ": " << bad.err;
  }
}

// --speculative-config method mtp on a hybrid checkpoint with an MTP layer: it runs, the startup
// log names the method and k, and the tokens are plain greedy decoding's; with the checkpoint's
// mtp.* tensors removed it fails at load naming the missing tensor and the way out (ngram).
TEST(CliSpeculativeConfig, MtpRunsAndACheckpointWithoutItsTensorsIsRefused) {
  TempDir tmp;
  fs::path dir = copy_fixture("qwen3_next_tiny", tmp.path());
  RunResult plain = run_generate(dir, tmp.path(), {"--temperature", "0"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  RunResult r = run_generate(
      dir, tmp.path(),
      {"--temperature", "0", "--speculative-config", R"({"method": "qwen3_next_mtp", "num_speculative_tokens": 2})"});
  ASSERT_FALSE(r.signaled) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("Speculative decoding: mtp (num_speculative_tokens=2"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, plain.out);
  // The same checkpoint with its mtp.* tensors renamed (xtp.*: the header keeps its length).
  const fs::path st = dir / "model.safetensors";
  std::string bytes = testing::read_file(st);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  for (size_t at = bytes.find("\"mtp.", 8); at != std::string::npos && at < 8 + n; at = bytes.find("\"mtp.", at))
    bytes[at + 1] = 'x';
  testing::write_file(st, bytes);
  const fs::path& bare = dir;
  RunResult bad =
      run_generate(bare, tmp.path(), {"--speculative-config", R"({"method": "mtp", "num_speculative_tokens": 2})"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("mtp.fc.weight"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tessera
