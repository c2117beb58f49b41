#include "engine/cache_groups.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace tessera {

const char* cache_group_kind_name(CacheGroupKind kind) {
  switch (kind) {
    case CacheGroupKind::kFullAttention:
      return "full attention";
    case CacheGroupKind::kSlidingWindow:
      return "sliding window";
    case CacheGroupKind::kStateSlot:
      return "state slots";
  }
  return "";
}

std::vector<CacheGroup> make_cache_groups(const std::vector<LayerCacheSpec>& layers, int block_size,
                                          bool window_groups) {
  std::vector<CacheGroup> paged;
  CacheGroup state{{CacheGroupKind::kStateSlot, block_size, 0}, {}};
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCacheSpec& l = layers[i];
    if (l.kind == CacheKind::kStateSlot) {
      state.layers.push_back(static_cast<int>(i));
      continue;
    }
    if (l.sliding_window < 0) fail(ErrorKind::kInvalidArgument, "layer {}: sliding window {} < 0", i, l.sliding_window);
    CacheGroupSpec spec{CacheGroupKind::kFullAttention, block_size, 0};
    if (l.sliding_window > 0 && window_groups) spec = {CacheGroupKind::kSlidingWindow, block_size, l.sliding_window};
    auto g = std::find_if(paged.begin(), paged.end(), [&](const CacheGroup& c) { return c.spec == spec; });
    if (g == paged.end()) g = paged.insert(paged.end(), CacheGroup{spec, {}});
    g->layers.push_back(static_cast<int>(i));
  }
  if (!state.layers.empty()) paged.push_back(std::move(state));
  return paged;
}

std::vector<CacheGroup> engine_cache_groups(const std::vector<LayerCacheSpec>& layers, int block_size,
                                            bool whole_model) {
  if (whole_model) {
    auto groups = make_cache_groups(layers, block_size, true);
    if (std::count_if(groups.begin(), groups.end(), [](const CacheGroup& g) { return g.spec.paged(); }) <= 1)
      return groups;
  }
  auto groups = make_cache_groups(layers, block_size, false);
  // A pipeline stage whose own layers are all linear attention still keeps the block tables that the
  // later stages' attention layers read (the step carries one for every stage).
  if (!whole_model && std::none_of(groups.begin(), groups.end(), [](const CacheGroup& g) { return g.spec.paged(); }))
    groups.insert(groups.begin(), CacheGroup{{CacheGroupKind::kFullAttention, block_size, 0}, {}});
  return groups;
}

int max_blocks_per_seq(const CacheGroupSpec& spec, int max_model_len, int max_num_batched_tokens) {
  const int bs = spec.block_size;
  const int all = (max_model_len + bs - 1) / bs;
  if (spec.kind != CacheGroupKind::kSlidingWindow) return spec.paged() ? all : 0;
  const int64_t span = std::min<int64_t>(int64_t{spec.sliding_window} - 1 + max_num_batched_tokens, max_model_len);
  return static_cast<int>(std::min<int64_t>((span + bs - 1) / bs + 1, all));
}

namespace {

// "0-3, 5": the sorted indices as ranges.
std::string ranges(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ", ", v[i]);
    if (j > i) out += fmt::format("-{}", v[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string describe_cache_groups(const std::vector<CacheGroup>& groups) {
  std::string out;
  for (const CacheGroup& g : groups) {
    if (!out.empty()) out += ", ";
    out += cache_group_kind_name(g.spec.kind);
    if (g.spec.kind == CacheGroupKind::kSlidingWindow) out += fmt::format(" {}", g.spec.sliding_window);
    out += fmt::format(" (layer{} {})", g.layers.size() == 1 ? "" : "s", ranges(g.layers));
  }
  return out;
}

}  // namespace tessera
