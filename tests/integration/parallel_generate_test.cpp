// `tessera generate --device cpu` with TP / PP rank processes against TP = PP = 1: the same
// greedy token ids (--json), and a worker killed mid-generation ends the head with a
// non-zero exit naming the rank, well within 30 s.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tiny_checkpoint.h"

namespace {

const std::string kBin = TESSERA_BIN;
std::string fixture(const std::string& name) {
  if (tessera::testing::is_generated_model(name)) return tessera::testing::generated_model_dir(name);
  return std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

struct RunResult {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string temp_path(const std::string& tag) {
  static int n = 0;
  return (std::filesystem::temp_directory_path() /
          ("tessera_pgen_" + std::to_string(getpid()) + "_" + tag + "_" + std::to_string(n++)))
      .string();
}

pid_t spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  std::vector<std::string> a{kBin};
  a.insert(a.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    FILE* o = std::freopen(out.c_str(), "w", stdout);
    FILE* e = std::freopen(err.c_str(), "w", stderr);
    (void)o, (void)e;
    execv(kBin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

RunResult run(const std::vector<std::string>& args) {
  std::string out = temp_path("out"), err = temp_path("err");
  pid_t pid = spawn(args, out, err);
  int status = 0;
  waitpid(pid, &status, 0);
  RunResult r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(out), slurp(err)};
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

std::vector<std::vector<int>> token_ids(const std::string& out) {
  std::vector<std::vector<int>> ids;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{')
      ids.push_back(nlohmann::json::parse(line)["token_ids"].get<std::vector<int>>());
  return ids;
}

std::vector<std::string> generate_args(const std::string& model, int tp, int pp, bool ep = false) {
  std::vector<std::string> a{"generate",
                             "--model",
                             fixture(model),
                             "--device",
                             "cpu",
                             "--json",
                             "--ignore-eos",
                             "--max-tokens",
                             "24",
                             "--prompt-ids",
                             "39,7,201,5,88",
                             "--prompt-ids",
                             "12,240,1,66,3,9,100,101,102,103,104,105,106,107,108,109,110",
                             "--prompt-ids",
                             "250",
                             "--tensor-parallel-size",
                             std::to_string(tp),
                             "--pipeline-parallel-size",
                             std::to_string(pp)};
  if (ep) a.push_back("--enable-expert-parallel");
  return a;
}

struct Case {
  std::string model;  // a fixture's name, or "gen:<key>" (tiny_checkpoint.h)
  int tp, pp;
  bool ep = false;
};

class ParallelGenerate : public ::testing::TestWithParam<Case> {};

TEST_P(ParallelGenerate, GreedyTokensMatchOneRank) {
  const Case c = GetParam();
  RunResult ref = run(generate_args(c.model, 1, 1));
  ASSERT_EQ(ref.code, 0) << ref.err;
  RunResult par = run(generate_args(c.model, c.tp, c.pp, c.ep));
  ASSERT_EQ(par.code, 0) << par.err;
  auto want = token_ids(ref.out), got = token_ids(par.out);
  ASSERT_EQ(want.size(), 3u) << ref.out;
  EXPECT_EQ(got, want) << par.out << "\n" << par.err;
  for (const auto& t : got) EXPECT_EQ(t.size(), 24u);
  // The generated MoE models have 8 experts: the flag reaches the model (the head's rank 0
  // logs its part; the workers run the head's command line).
  if (c.model.find("_moe") != std::string::npos && c.tp == 2) {
    const std::string want_line = c.ep ? "TP rank 0 holds experts [0, 4) of 8"
                                  : c.model.find("fp8") != std::string::npos
                                      ? "TP rank 0 holds intermediate rows [0, 128)"
                                      : "TP rank 0 holds intermediate rows [0, 16)";
    EXPECT_NE(par.err.find(want_line), std::string::npos) << par.err;
  }
}

// --logprobs N with --json: one entry per token; greedy takes the best-ranked token; the
// alternatives come best first (what scripts/device_parallel_check.sh reads for close calls).
TEST(GenerateLogprobs, JsonCarriesEachTokensLogprobAndAlternatives) {
  std::vector<std::string> args = generate_args("llama_gqa2", 1, 1);
  args.insert(args.end(), {"--logprobs", "2"});
  RunResult r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream in(r.out);
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line);
    const auto ids = j["token_ids"].get<std::vector<int>>();
    ASSERT_EQ(j["logprobs"].size(), ids.size());
    for (size_t k = 0; k < ids.size(); ++k) {
      const auto& lp = j["logprobs"][k];
      EXPECT_EQ(lp["token"].get<int>(), ids[k]);
      ASSERT_EQ(lp["top"].size(), 2u);
      EXPECT_EQ(lp["top"][0][0].get<int>(), ids[k]);
      EXPECT_GE(lp["top"][0][1].get<double>(), lp["top"][1][1].get<double>());
      EXPECT_LE(lp["logprob"].get<double>(), 0.0);
    }
    ++rows;
  }
  EXPECT_EQ(rows, 3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParallelGenerate,
                         ::testing::Values(Case{"llama_gqa2", 2, 1}, Case{"qwen2_gqa2_untied", 1, 2},
                                           Case{"qwen2_gqa2_untied", 2, 2}, Case{"qwen3_gqa4_hd32", 2, 2},
                                           // Vocabulary 777: TP 2 pads it to 778 (issue 19).
                                           Case{"gen:vocab777", 2, 2},
                                           // Mixture of experts: TP over each expert's intermediate dimension,
                                           // --enable-expert-parallel, and pipeline stages.
                                           Case{"gen:qwen3_moe", 2, 1}, Case{"gen:qwen3_moe", 2, 1, true},
                                           Case{"gen:qwen3_moe", 1, 2}, Case{"gen:qwen2_moe", 2, 2, true},
                                           // Hybrid models: state slots on every rank (TP splits the
                                           // linear-attention heads; PP stage 0 holds only linear layers).
                                           Case{"qwen3_next_tiny", 2, 1}, Case{"qwen3_next_tiny", 1, 2},
                                           Case{"qwen3_next_tiny", 2, 1, true}, Case{"qwen3_5_moe_text_tiny", 2, 2},
                                           // Block-scaled FP8 checkpoints: the fixture by layers (TP 2
                                           // would cut its scale blocks: refused below), a generated one
                                           // whose TP 2 shards are whole blocks, its experts split and whole.
                                           Case{"qwen3_dense_fp8", 1, 2}, Case{"qwen3_5_moe_text_fp8", 1, 2},
                                           Case{"gen:qwen3_moe_fp8", 2, 1}, Case{"gen:qwen3_moe_fp8", 2, 1, true},
                                           // Hybrid FP8 (the flagship's kind): TP 2 over Gated DeltaNet heads,
                                           // gated attention and experts, all in whole scale blocks.
                                           Case{"gen:qwen3_5_moe_fp8", 2, 1}),
                         [](const auto& i) {
                           std::string m = i.param.model;
                           if (tessera::testing::is_generated_model(m)) m = "gen_" + m.substr(4);
                           return m + "_tp" + std::to_string(i.param.tp) + "_pp" + std::to_string(i.param.pp) +
                                  (i.param.ep ? "_ep" : "");
                         });

// MTP speculative decoding across ranks (the seeds' --speculative-config on the demo model, which
// ships an MTP layer): TP 2 splits the layer as the others, PP 2 runs it on the last stage with its
// own copy of the embedding. The greedy tokens are those of one rank without speculation, and,
// drafting on at every batch (disable_by_batch_size 0: the automatic limit measures step times,
// which differ between runs), the drafts accepted, overall and per position, are one rank's.
std::vector<std::string> demo_mtp_args(int tp, int pp, const std::string& spec) {
  std::vector<std::string> a{"generate",
                             "--model",
                             std::string(TESSERA_SOURCE_DIR) + "/models/tessera-demo",
                             "--device",
                             "cpu",
                             "--json",
                             "--ignore-eos",
                             "--max-tokens",
                             "40",
                             "--prompt",
                             "The history of the city begins with a small village by the river.",
                             "--prompt",
                             "Once upon a time, there was a little girl who",
                             "--prompt-ids",
                             "39,7,201,5,88",
                             "--tensor-parallel-size",
                             std::to_string(tp),
                             "--pipeline-parallel-size",
                             std::to_string(pp)};
  if (!spec.empty()) a.insert(a.end(), {"--speculative-config", spec});
  return a;
}

// "Accepted: N tokens, Drafted: M tokens, Per-position acceptance rate: ..." of the run's
// SpecDecoding line (the counts, without the throughputs); empty when there is none.
std::string acceptance(const std::string& err) {
  const size_t line = err.find("SpecDecoding metrics:");
  if (line == std::string::npos) return "";
  const size_t from = err.find("Accepted: ", line), to = err.find(", Avg Draft", line);
  if (from == std::string::npos || to == std::string::npos || to < from) return "";
  return err.substr(from, to - from);
}

class ParallelMtp : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ParallelMtp, GreedyTokensAndAcceptanceMatchOneRank) {
  const auto [tp, pp] = GetParam();
  const std::string seeds = R"({"method":"mtp","num_speculative_tokens":2})";
  const std::string always = R"({"method":"mtp","num_speculative_tokens":2,"disable_by_batch_size":0})";
  RunResult plain = run(demo_mtp_args(1, 1, ""));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const auto want = token_ids(plain.out);
  ASSERT_EQ(want.size(), 3u) << plain.out;
  RunResult one = run(demo_mtp_args(1, 1, always));
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(token_ids(one.out), want) << one.err;
  const std::string want_acceptance = acceptance(one.err);
  ASSERT_NE(want_acceptance, "") << one.err;
  ASSERT_EQ(want_acceptance.find("Accepted: 0 tokens"), std::string::npos) << "no draft accepted: " << one.err;
  RunResult r = run(demo_mtp_args(tp, pp, always));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(token_ids(r.out), want) << r.err;
  EXPECT_EQ(acceptance(r.err), want_acceptance) << r.err;
  // The seeds' own line (drafting limited by the measured cost): the same tokens.
  RunResult s = run(demo_mtp_args(tp, pp, seeds));
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(token_ids(s.out), want) << s.err;
  EXPECT_NE(s.err.find("Speculative decoding: mtp (num_speculative_tokens=2"), std::string::npos) << s.err;
}

INSTANTIATE_TEST_SUITE_P(Demo, ParallelMtp, ::testing::Values(std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}),
                         [](const auto& i) {
                           return "tp" + std::to_string(i.param.first) + "_pp" + std::to_string(i.param.second);
                         });

// qwen3_dense_fp8 at TP 2 would give each rank 64 of k_proj's 128 rows, half a scale block:
// refused while loading, naming the flag and the sizes that work, within seconds.
TEST(ParallelGenerateRefusals, Fp8ShardsThatCutAScaleBlockNameTheFlag) {
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = run(generate_args("qwen3_dense_fp8", 2, 1));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("split over --tensor-parallel-size 2 is not a whole number of 128-wide scale blocks per rank; "
                       "tensor-parallel sizes that work for this layer: 1"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(token_ids(r.out).empty()) << r.out;
}

// The hybrid fixtures' Gated DeltaNet has 2 key heads (qwen3_5_moe_text_fp8's one): TP 4
// (TP 2) is refused before any rank starts, with or without expert parallelism.
TEST(ParallelGenerateRefusals, HybridTensorParallelBeyondTheKeyHeadsNamesTheFlag) {
  RunResult r = run(generate_args("qwen3_next_tiny", 4, 1, true));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--tensor-parallel-size 4; tensor-parallel sizes that work for this model: 1, 2"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("rank processes"), std::string::npos) << r.err;
  r = run(generate_args("qwen3_5_moe_text_fp8", 2, 1, true));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--tensor-parallel-size 2; tensor-parallel sizes that work for this model: 1 (use "
                       "--pipeline-parallel-size"),
            std::string::npos)
      << r.err;
}

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> kids;
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t k;
  while (f >> k) kids.push_back(k);
  return kids;
}

TEST(ParallelGenerateFaults, KilledWorkerEndsTheHeadNamingTheRank) {
  std::vector<std::string> args{"generate",
                                "--model",
                                fixture("llama_gqa2"),
                                "--device",
                                "cpu",
                                "--json",
                                "--ignore-eos",
                                "--max-tokens",
                                "480",
                                "--max-model-len",
                                "512",
                                "--tensor-parallel-size",
                                "2"};
  for (int i = 0; i < 16; ++i) {
    args.push_back("--prompt-ids");
    args.push_back(std::to_string(i + 1) + ",2,3,4,5,6,7,8");
  }
  std::string out = temp_path("out"), err = temp_path("err");
  pid_t head = spawn(args, out, err);
  // Wait until the ranks are up and the KV cache is planned (generation starts right after).
  auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> kids;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(40)) {
    if (slurp(err).find("KV cache size") != std::string::npos) {
      kids = children_of(head);
      if (!kids.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(kids.empty()) << "the head never started its ranks: " << slurp(err);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(kill(kids[0], SIGKILL), 0);
  auto killed = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(head, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - killed > std::chrono::seconds(30)) {
      kill(head, SIGKILL);
      waitpid(head, &status, 0);
      FAIL() << "the head did not exit within 30 s of a worker's death";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::string e = slurp(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "wait status " << status << "\n" << e;
  EXPECT_NE(e.find("error: "), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
  EXPECT_LT(secs, 30.0);
  std::printf("head exited %.2f s after its worker was killed\n", secs);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
}

}  // namespace
