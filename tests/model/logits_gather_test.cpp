// The TP lm_head's gather, counted at the communicator seam: two ranks in two threads of this
// process over a host communicator that counts what each rank hands to `gather`. A step whose
// rows need only their greedy pick (StepInputs::argmax_rows) sends each rank's (max, id) pair
// instead of its slice of the logits, and gives the same tokens as the whole rows of the same
// step; rows of one step may mix both kinds, the whole rows coming back bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "distributed/communicator.h"
#include "fixture_util.h"
#include "loader/checkpoint.h"
#include "model/registry.h"
#include "thread_comm.h"
#include "tiny_checkpoint.h"

namespace tessera {
namespace {

using testing::Rendezvous;
using testing::ThreadComm;

// Two sequences prefilled (17 and 4 tokens), the logits of six rows.
ModelInput step() {
  ModelInput in;
  for (int i = 0; i < 21; ++i) {
    in.token_ids.push_back((i * 37 + 11) % 200);
    in.positions.push_back(i < 17 ? i : i - 17);
    in.attention.slot_mapping.push_back(i < 17 ? i : 64 + i - 17);
  }
  in.attention.block_size = 16;
  in.attention.query_start_loc = {0, 17, 21};
  in.attention.seq_lens = {17, 4};
  in.attention.max_blocks_per_seq = 4;
  in.attention.block_tables = {0, 1, 2, 3, 4, 5, 6, 7};
  in.logits_indices = {3, 9, 15, 16, 18, 20};
  return in;
}

// The three ways one step's rows are asked for: all whole, all greedy, mixed.
const std::vector<std::vector<int32_t>> kRowSets = {{}, {0, 1, 2, 3, 4, 5}, {0, 2, 3}};

struct RankRun {
  std::vector<std::vector<float>> logits;  // rank 0: per row set, [n, V]
  std::vector<size_t> gathered;            // per row set: the bytes this rank sent to gather
};

void run_rank(const std::string& dir, int rank, int tp, Rendezvous& rv, RankRun& out) {
  auto be = make_backend({});
  ModelConfig cfg = load_model_config(dir);
  ThreadComm comm(rv, rank);
  ModelOptions mo;
  mo.parallel.tp_rank = rank;
  mo.parallel.tp_size = tp;
  mo.runtime.tp = tp > 1 ? &comm : nullptr;
  auto model = create_model(cfg, mo, *be);
  Checkpoint ckpt(cfg.model_dir);
  model->weights().load(ckpt, *be);
  KvCache cache = testing::alloc_test_cache(*be, model->cache_specs(), 8, DType::kF32, 1);
  EXPECT_EQ(model->shards_logits(), tp > 1);
  for (const auto& rows : kRowSets) {
    be->reset_scratch();
    const size_t before = rv.gathered[static_cast<size_t>(rank)];
    const Tensor logits = model->forward_argmax_rows(step(), cache, rows);  // (the same KV each time)
    out.gathered.push_back(rv.gathered[static_cast<size_t>(rank)] - before);
    if (!model->returns_logits()) continue;
    std::vector<float> v(static_cast<size_t>(logits.numel()));
    be->copy_to_host(v.data(), logits);
    be->synchronize();
    out.logits.push_back(std::move(v));
  }
}

// The greedy pick of a row: the first maximum (NaN rows have none here).
int32_t first_max(const std::vector<float>& logits, size_t row, size_t V) {
  const auto b = logits.begin() + static_cast<std::ptrdiff_t>(row * V);
  return static_cast<int32_t>(std::max_element(b, b + static_cast<std::ptrdiff_t>(V)) - b);
}

class LogitsGather : public ::testing::TestWithParam<std::string> {};

TEST_P(LogitsGather, GreedyRowsSendPairsAndPickTheWholeRowsToken) {
  const std::string name = GetParam();
  const std::string dir =
      testing::is_generated_model(name) ? testing::generated_model_dir(name) : testing::fixtures_dir() + "/" + name;
  const int tp = 2;
  Rendezvous rv(tp);
  std::vector<RankRun> runs(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        run_rank(dir, r, tp, rv, runs[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto& t : threads) t.join();
  ASSERT_EQ(runs[0].logits.size(), kRowSets.size());
  const ModelConfig cfg = load_model_config(dir);
  const size_t V = static_cast<size_t>(cfg.vocab_size), n = 6;
  const size_t Vr = (V + tp - 1) / tp;  // each rank's slice, the vocabulary padded to a multiple of TP
  for (int r = 0; r < tp; ++r) {
    const RankRun& run = runs[static_cast<size_t>(r)];
    // Whole rows: n slices of f32. Greedy rows: n (max, id) pairs. Mixed: 3 slices and 3 pairs.
    EXPECT_EQ(run.gathered[0], n * Vr * 4) << "rank " << r;
    EXPECT_EQ(run.gathered[1], n * 8) << "rank " << r;
    EXPECT_EQ(run.gathered[2], 3 * Vr * 4 + 3 * 8) << "rank " << r;
  }
  std::printf("%s, TP 2, %zu rows: %zu bytes a rank gathered whole, %zu greedy, %zu mixed\n", name.c_str(), n,
              runs[1].gathered[0], runs[1].gathered[1], runs[1].gathered[2]);
  const std::vector<float>& whole = runs[0].logits[0];
  ASSERT_EQ(whole.size(), n * V);
  for (size_t set = 1; set < kRowSets.size(); ++set) {
    const std::vector<float>& got = runs[0].logits[set];
    ASSERT_EQ(got.size(), n * V);
    const auto& picks = kRowSets[set];
    for (size_t i = 0; i < n; ++i) {
      const bool greedy = std::find(picks.begin(), picks.end(), static_cast<int32_t>(i)) != picks.end();
      if (greedy) {
        // A stand-in row: the whole row's greedy pick and its value, -inf elsewhere.
        const int32_t want = first_max(whole, i, V);
        EXPECT_EQ(first_max(got, i, V), want) << "set " << set << " row " << i;
        EXPECT_EQ(got[i * V + static_cast<size_t>(want)], whole[i * V + static_cast<size_t>(want)]);
        EXPECT_EQ(std::count_if(got.begin() + static_cast<std::ptrdiff_t>(i * V),
                                got.begin() + static_cast<std::ptrdiff_t>((i + 1) * V),
                                [](float x) { return x > -std::numeric_limits<float>::infinity(); }),
                  1);
      } else {
        EXPECT_EQ(std::memcmp(got.data() + i * V, whole.data() + i * V, V * 4), 0) << "set " << set << " row " << i;
      }
    }
  }
}

// Vocabulary 256 (two slices of 128), and 777 (two of 389, the last one padding the rank must
// never pick).
INSTANTIATE_TEST_SUITE_P(Models, LogitsGather, ::testing::Values("llama_gqa2", "gen:vocab777"), [](const auto& i) {
  std::string m = i.param;
  return testing::is_generated_model(m) ? "gen_" + m.substr(4) : m;
});

}  // namespace
}  // namespace tessera
