#include "engine/cache_groups.h"

#include <algorithm>
#include <cstdint>

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

namespace {

// Splits each paged group of `groups` (make_cache_groups' order) into groups of one size (see
// engine_cache_groups); the state group stays last and whole.
std::vector<CacheGroup> split_uniform(const std::vector<CacheGroup>& groups) {
  size_t fewest = SIZE_MAX, most = 0;
  for (const CacheGroup& g : groups)
    if (g.spec.paged()) fewest = std::min(fewest, g.layers.size()), most = std::max(most, g.layers.size());
  const size_t size = static_cast<double>(most) < 1.25 * static_cast<double>(fewest) ? most : fewest;
  std::vector<CacheGroup> out;
  for (const CacheGroup& g : groups) {
    if (!g.spec.paged()) {
      out.push_back(g);
      continue;
    }
    for (size_t i = 0; i < g.layers.size(); i += size) {
      const auto first = g.layers.begin() + static_cast<ptrdiff_t>(i);
      out.push_back(
          {g.spec, std::vector<int>(first, first + static_cast<ptrdiff_t>(std::min(size, g.layers.size() - i)))});
    }
  }
  return out;
}

bool same_pages(const std::vector<LayerCacheSpec>& layers) {
  const LayerCacheSpec* first = nullptr;
  for (const LayerCacheSpec& l : layers) {
    if (l.kind != CacheKind::kPagedKv) continue;
    if (first && (l.num_kv_heads != first->num_kv_heads || l.head_dim != first->head_dim)) return false;
    if (!first) first = &l;
  }
  return true;
}

int count_paged(const std::vector<CacheGroup>& groups) {
  return static_cast<int>(
      std::count_if(groups.begin(), groups.end(), [](const CacheGroup& g) { return g.spec.paged(); }));
}

}  // namespace

std::vector<CacheGroup> engine_cache_groups(const std::vector<LayerCacheSpec>& layers, int block_size, bool whole_model,
                                            bool hybrid) {
  std::vector<CacheGroup> groups;
  if (whole_model) {
    groups = make_cache_groups(layers, block_size, true);
    if (count_paged(groups) > 1) {
      if (hybrid && same_pages(layers)) return split_uniform(groups);
      groups = make_cache_groups(layers, block_size, false);
    }
  } else {
    groups = make_cache_groups(layers, block_size, false);
  }
  // Layers that are all linear attention (a pipeline stage's own, or a whole model cut to them) still
  // get one layer-less paged group: the step carries its block table, which later stages' attention
  // layers read, and the engine's step layout expects a paged group before the state group.
  if (count_paged(groups) == 0)
    groups.insert(groups.begin(), CacheGroup{{CacheGroupKind::kFullAttention, block_size, 0}, {}});
  return groups;
}

std::vector<int> cache_layer_groups(const std::vector<CacheGroup>& groups, int num_layers) {
  if (count_paged(groups) <= 1) return {};
  std::vector<int> out(static_cast<size_t>(num_layers), -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].spec.paged()) continue;
    for (int l : groups[g].layers) {
      TESSERA_CHECK(l >= 0 && l < num_layers, "cache group {}: layer {} of {}", g, l, num_layers);
      out[static_cast<size_t>(l)] = static_cast<int>(g);
    }
  }
  return out;
}

std::vector<int> kv_tensor_of_layers(const std::vector<LayerCacheSpec>& layers, const std::vector<int>& layer_groups) {
  TESSERA_CHECK(layer_groups.empty() || layer_groups.size() == layers.size(),
                "cache layout: {} layers' groups for {} layers", layer_groups.size(), layers.size());
  std::vector<int> out(layers.size(), -1);
  std::vector<int> next;  // per group: the next tensor its next layer takes
  int count = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].kind != CacheKind::kPagedKv) continue;
    if (layer_groups.empty()) {
      out[i] = count++;
      continue;
    }
    const int g = layer_groups[i];
    TESSERA_CHECK(g >= 0, "cache layout: paged layer {} without a group", i);
    if (next.size() <= static_cast<size_t>(g)) next.resize(static_cast<size_t>(g) + 1, 0);
    out[i] = next[static_cast<size_t>(g)]++;
  }
  return out;
}

int num_paged_groups(const std::vector<int>& layer_groups) {
  int n = 1;
  for (int g : layer_groups) n = std::max(n, g + 1);
  return n;
}

int max_blocks_per_seq(const CacheGroupSpec& spec, int max_model_len, int max_num_batched_tokens) {
  const int bs = spec.block_size;
  const int all = (max_model_len + bs - 1) / bs;
  if (spec.kind != CacheGroupKind::kSlidingWindow) return spec.paged() ? all : 0;
  const int64_t span = std::min<int64_t>(int64_t{spec.sliding_window} - 1 + max_num_batched_tokens, max_model_len);
  return static_cast<int>(std::min<int64_t>((span + bs - 1) / bs + 1, all));
}

int max_blocks_per_seq(const std::vector<CacheGroup>& groups, int max_model_len, int max_num_batched_tokens) {
  int n = 0;
  for (const CacheGroup& g : groups) n += max_blocks_per_seq(g.spec, max_model_len, max_num_batched_tokens);
  return n;
}

KvCapacity kv_capacity(const std::vector<CacheGroup>& groups, int num_blocks, int max_model_len,
                       int max_num_batched_tokens) {
  KvCapacity c;
  const int paged = std::max(1, count_paged(groups));
  const int bs = groups.empty() ? 1 : groups.front().spec.block_size;
  c.tokens = static_cast<int64_t>(num_blocks / paged) * bs;
  const bool windowed = std::any_of(groups.begin(), groups.end(),
                                    [](const CacheGroup& g) { return g.spec.kind == CacheGroupKind::kSlidingWindow; });
  const int per_seq = max_blocks_per_seq(groups, max_model_len, max_num_batched_tokens);
  if (!windowed || per_seq <= 0)
    c.max_concurrency = max_model_len > 0 ? static_cast<double>(c.tokens) / max_model_len : 0;
  else
    c.max_concurrency = static_cast<double>(num_blocks) / per_seq;
  return c;
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
    if (g.layers.empty())
      out += " (no layers of this rank: only the step's block table)";
    else
      out += fmt::format(" (layer{} {})", g.layers.size() == 1 ? "" : "s", ranges(g.layers));
  }
  return out;
}

}  // namespace tessera
