#include "distributed/custom_all_reduce_communicator.h"

#include <map>
#include <mutex>

#include "core/error.h"
#include "core/logging.h"
#include "distributed/node_locality.h"

namespace tessera::dist {

CustomAllReduceCommunicator::CustomAllReduceCommunicator(std::unique_ptr<Communicator> inner,
                                                         std::unique_ptr<InPlaceAllReduce> fast)
    : inner_(std::move(inner)), fast_(std::move(fast)) {
  if (!inner_ || !fast_) fail(ErrorKind::kInvalidArgument, "CustomAllReduceCommunicator needs both paths");
}

void CustomAllReduceCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  // Same tensor on every rank (SPMD), so every rank takes the same path.
  if (op == ReduceOp::kSum && t.defined() && t.device().type == DeviceType::kCUDA && inner_->stream_ordered() &&
      fast_->should_use(t.dtype(), t.nbytes())) {
    fast_->all_reduce(t.raw(), t.dtype(), t.numel());
    ++fast_calls_;
    return;
  }
  ++inner_calls_;
  inner_->all_reduce(t, op);
}

void CustomAllReduceCommunicator::raise_if_failed() const {
  if (auto f = fast_->failure()) fail(ErrorKind::kNetwork, "{} (group {})", *f, inner_->group().name);
  inner_->raise_if_failed();
}

AllGatherBytes store_all_gather(std::shared_ptr<KeyValueStore> store, const GroupInfo& group, std::string prefix,
                                std::chrono::milliseconds timeout, RankNamer namer) {
  if (!store) fail(ErrorKind::kInvalidArgument, "store_all_gather needs a store");
  if (!namer) namer = [](int r) { return fmt::format("rank {}", r); };
  auto calls = std::make_shared<int>(0);
  return [store, group, prefix, timeout, namer, calls](const std::vector<uint8_t>& mine) {
    std::string round = fmt::format("{}/{}", prefix, (*calls)++);
    store->set(fmt::format("{}/{}", round, group.rank), std::span<const uint8_t>(mine.data(), mine.size()));
    std::vector<std::vector<uint8_t>> all(static_cast<size_t>(group.size()));
    for (int r = 0; r < group.size(); ++r) {
      if (r == group.rank) {
        all[static_cast<size_t>(r)] = mine;
        continue;
      }
      all[static_cast<size_t>(r)] =
          store->wait_get(fmt::format("{}/{}", round, r), timeout,
                          fmt::format("{} (group {}) to publish {}", namer(group.world_ranks[static_cast<size_t>(r)]),
                                      group.name, round));
    }
    return all;
  };
}

#ifdef TESSERA_HAVE_CUSTOM_ALL_REDUCE

bool custom_all_reduce_built() { return true; }

std::unique_ptr<Communicator> with_custom_all_reduce(std::unique_ptr<Communicator> inner,
                                                     const CustomAllReduceConfig& config) {
  if (!inner) fail(ErrorKind::kInvalidArgument, "with_custom_all_reduce: no communicator");
  const GroupInfo& g = inner->group();
  if (config.disable) {
    if (g.rank == 0) TLOG_INFO("custom all-reduce disabled (--disable-custom-all-reduce) on group {}", g.name);
    return inner;
  }
  if (g.size() < 2 || !inner->stream_ordered()) return inner;  // the same on every rank
  if (auto why = custom_all_reduce_off_reason(g, config.ranks_per_node,
                                              config.nccl_p2p_disable ? config.nccl_p2p_disable->c_str() : nullptr)) {
    if (g.rank == 0) TLOG_INFO("custom all-reduce off on group {}: {}", g.name, *why);
    return inner;
  }
  if (!config.stream)
    fail(ErrorKind::kInvalidArgument, "with_custom_all_reduce: the inner communicator's stream is required");
  AllGatherBytes all_gather = config.all_gather;
  if (!all_gather) {
    if (!config.store) fail(ErrorKind::kInvalidArgument, "with_custom_all_reduce needs a store or an all_gather");
    // A prefix unique per creation: groups are created in the same order on every rank.
    static std::mutex mu;
    static std::map<std::string, int> created;
    int generation;
    {
      std::lock_guard lock(mu);
      generation = created[g.name]++;
    }
    all_gather =
        store_all_gather(config.store, g, fmt::format("car/{}/{}", g.name, generation), config.timeout, config.namer);
  }
  auto fast = make_device_all_reduce(g, config, all_gather);
  if (!fast) return inner;
  return std::make_unique<CustomAllReduceCommunicator>(std::move(inner), std::move(fast));
}

#else

bool custom_all_reduce_built() { return false; }

std::unique_ptr<Communicator> with_custom_all_reduce(std::unique_ptr<Communicator> inner,
                                                     const CustomAllReduceConfig&) {
  return inner;  // no CUDA in this build: nothing to accelerate
}

#endif

}  // namespace tessera::dist
