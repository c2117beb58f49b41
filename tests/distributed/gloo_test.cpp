// Gloo collectives among 2-4 rank processes (fork) on 127.0.0.1, bootstrapped through the
// head's store. Each child runs one rank and reports through its exit code and stderr.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "distributed/control_store.h"
#include "distributed/gloo_communicator.h"
#include "distributed/rendezvous_server.h"
#include "test_util.h"

namespace tessera::dist {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr const char* kToken = "gloo-test";

// What a rank body gets: its rank, the world size and a factory bound to the head's store.
struct RankContext {
  int rank;
  int world;
  std::shared_ptr<ControlStoreClient> store;
  std::unique_ptr<GlooCommunicatorFactory> factory;
};

// Forks `world` rank processes before any thread exists in this process's children, then
// runs the head's store here. Returns each rank's exit code (0 = passed).
std::vector<int> run_ranks(int world, const std::function<int(RankContext&)>& body,
                           milliseconds timeout = milliseconds(5000)) {
  uint16_t port = testing::free_port();
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        RankContext ctx{r, world, nullptr, nullptr};
        ctx.store =
            std::make_shared<ControlStoreClient>(HeadAddress{"127.0.0.1", port, kToken, ""}, r, milliseconds(5000));
        GlooOptions o;
        o.store = ctx.store;
        o.ip = "127.0.0.1";
        o.timeout = timeout;
        ctx.factory = std::make_unique<GlooCommunicatorFactory>(o);
        code = body(ctx);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 2;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  RendezvousServerOptions so;
  so.port = port;
  so.token = kToken;
  so.nnodes = 1;
  RendezvousServer server(so);
  std::vector<int> codes;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  return codes;
}

void expect_all_pass(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

GroupInfo world_group(const RankContext& c) { return ParallelLayout{c.world, 1}.world_group(c.rank); }

class GlooWorld : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorld, AllReduceF32AndBf16) {
  expect_all_pass(run_ranks(GetParam(), [](RankContext& c) {
    auto comm = c.factory->create(world_group(c));
    Tensor t = host_empty({1000}, DType::kF32);
    for (int i = 0; i < 1000; ++i) t.data<float>()[i] = static_cast<float>(c.rank + 1) * i;
    comm->all_reduce(t);
    float scale = c.world * (c.world + 1) / 2.0f;
    for (int i = 0; i < 1000; ++i) RANK_CHECK(t.data<float>()[i] == scale * i, "f32 element {}", i);

    Tensor b = host_empty({300}, DType::kBF16);
    for (int i = 0; i < 300; ++i) b.data<uint16_t>()[i] = f32_to_bf16(0.5f * (c.rank + 1));
    comm->all_reduce(b);
    for (int i = 0; i < 300; ++i) RANK_CHECK(bf16_to_f32(b.data<uint16_t>()[i]) == 0.5f * scale, "bf16 {}", i);

    Tensor ints = host_empty({4}, DType::kI32);
    try {
      comm->all_reduce(ints);
      RANK_CHECK(false, "i32 all_reduce accepted");
    } catch (const Error& e) {
      RANK_CHECK(e.kind() == ErrorKind::kUnsupported, "{}", e.what());
    }
    comm->barrier();  // still usable after an argument error
    return 0;
  }));
}

TEST_P(GlooWorld, AllGatherGatherBroadcast) {
  expect_all_pass(run_ranks(GetParam(), [](RankContext& c) {
    auto comm = c.factory->create(world_group(c));
    Tensor in = host_empty({3}, DType::kI32);
    for (int i = 0; i < 3; ++i) in.data<int32_t>()[i] = c.rank * 10 + i;
    Tensor out = host_empty({3 * c.world}, DType::kI32);
    comm->all_gather(in, out);
    for (int r = 0; r < c.world; ++r)
      for (int i = 0; i < 3; ++i) RANK_CHECK(out.data<int32_t>()[r * 3 + i] == r * 10 + i, "all_gather {} {}", r, i);

    int root = c.world - 1;
    Tensor gathered = c.rank == root ? host_empty({3 * c.world}, DType::kI32) : Tensor();
    comm->gather(in, gathered, root);
    if (c.rank == root)
      for (int r = 0; r < c.world; ++r) RANK_CHECK(gathered.data<int32_t>()[r * 3] == r * 10, "gather {}", r);

    Tensor b = host_empty({5}, DType::kF32);
    for (int i = 0; i < 5; ++i) b.data<float>()[i] = c.rank == 1 ? 7.0f + i : -1.0f;
    comm->broadcast(b, 1);
    for (int i = 0; i < 5; ++i) RANK_CHECK(b.data<float>()[i] == 7.0f + i, "broadcast {}", i);
    comm->barrier();
    return 0;
  }));
}

TEST_P(GlooWorld, SendRecvRing) {
  expect_all_pass(run_ranks(GetParam(), [](RankContext& c) {
    auto comm = c.factory->create(world_group(c));
    int next = (c.rank + 1) % c.world, prev = (c.rank + c.world - 1) % c.world;
    for (int round = 0; round < 3; ++round) {
      Tensor out = host_empty({64}, DType::kF32), in = host_empty({64}, DType::kF32);
      for (int i = 0; i < 64; ++i) out.data<float>()[i] = c.rank * 1000 + round * 100 + i;
      // Even ranks send first, odd ranks receive first: no deadlock in any ring size.
      if (c.rank % 2 == 0) {
        comm->send(out, next);
        comm->recv(in, prev);
      } else {
        comm->recv(in, prev);
        comm->send(out, next);
      }
      for (int i = 0; i < 64; ++i) RANK_CHECK(in.data<float>()[i] == prev * 1000 + round * 100 + i, "p2p {}", i);
    }
    return 0;
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooWorld, ::testing::Values(2, 3, 4));

TEST(GlooGroups, TensorTimesPipelineParallel) {
  // TP=2 x PP=2: all-reduce inside each stage, activations sent between stages.
  expect_all_pass(run_ranks(4, [](RankContext& c) {
    ParallelLayout layout{2, 2};
    ProcessGroups g = create_process_groups(*c.factory, layout, c.rank);
    RANK_CHECK(g.tp->size() == 2 && g.pp->size() == 2, "group sizes");
    RANK_CHECK(g.tp->group().name == "tp" + std::to_string(layout.pp_rank(c.rank)), "tp name");
    Tensor t = host_empty({8}, DType::kF32);
    for (int i = 0; i < 8; ++i) t.data<float>()[i] = static_cast<float>(c.rank);
    g.tp->all_reduce(t);
    float want = layout.pp_rank(c.rank) == 0 ? 0 + 1 : 2 + 3;
    RANK_CHECK(t.data<float>()[0] == want, "tp sum {} want {}", t.data<float>()[0], want);
    if (layout.pp_rank(c.rank) == 0) {
      g.pp->send(t, 1);
    } else {
      Tensor in = host_empty({8}, DType::kF32);
      g.pp->recv(in, 0);
      RANK_CHECK(in.data<float>()[7] == 1.0f, "stage 1 got {}", in.data<float>()[7]);
    }
    g.world->barrier();
    return 0;
  }));
}

TEST(GlooFaults, DeadPeerIsAnErrorNamingItNotAHang) {
  std::vector<int> codes = run_ranks(
      2,
      [](RankContext& c) {
        auto comm = c.factory->create(world_group(c));
        comm->barrier();  // both ends fully connected
        if (c.rank == 1) {
          // Gloo sends from a background loop: give rank 0's barrier its last message before dying.
          std::this_thread::sleep_for(milliseconds(300));
          _exit(0);  // then rank 1 crashes
        }
        Tensor t = host_empty({1 << 16}, DType::kF32);
        auto start = Clock::now();
        try {
          comm->all_reduce(t);
          RANK_CHECK(false, "all_reduce with a dead peer returned");
        } catch (const Error& e) {
          std::string what = e.what();
          RANK_CHECK(what.find("all_reduce on group world") != std::string::npos, "{}", what);
          RANK_CHECK(what.find("rank 1 is gone") != std::string::npos, "{}", what);
          RANK_CHECK(Clock::now() - start < std::chrono::seconds(4), "took too long: {}", what);
        }
        // Broken from now on, at once.
        try {
          comm->barrier();
          RANK_CHECK(false, "a broken communicator worked");
        } catch (const Error& e) {
          RANK_CHECK(std::string(e.what()).find("unusable after an earlier failure") != std::string::npos, "{}",
                     e.what());
        }
        return 0;
      },
      milliseconds(3000));
  expect_all_pass(codes);
}

TEST(GlooFaults, StuckPeerTimesOutWithinTheLimit) {
  std::vector<int> codes = run_ranks(
      2,
      [](RankContext& c) {
        auto comm = c.factory->create(world_group(c));
        if (c.rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(3));  // alive but never joins the collective
          return 0;
        }
        Tensor t = host_empty({16}, DType::kF32);
        auto start = Clock::now();
        try {
          comm->all_reduce(t);
          RANK_CHECK(false, "returned");
        } catch (const Error& e) {
          auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
          RANK_CHECK(ms >= 900 && ms < 4000, "timed out after {} ms: {}", ms, e.what());
          RANK_CHECK(std::string(e.what()).find("still connected to the head") != std::string::npos, "{}", e.what());
        }
        return 0;
      },
      milliseconds(1000));
  expect_all_pass(codes);
}

TEST(GlooFaults, MissingRankNamedAtBootstrap) {
  std::vector<int> codes = run_ranks(
      2,
      [](RankContext& c) {
        if (c.rank == 1) return 0;  // never creates its communicator
        auto start = Clock::now();
        try {
          c.factory->create(world_group(c));
          RANK_CHECK(false, "connected without rank 1");
        } catch (const Error& e) {
          RANK_CHECK(std::string(e.what()).find("rank 1 to join group world") != std::string::npos, "{}", e.what());
          RANK_CHECK(Clock::now() - start < std::chrono::seconds(3), "slow");
        }
        return 0;
      },
      milliseconds(800));
  expect_all_pass(codes);
}

}  // namespace
}  // namespace tessera::dist
