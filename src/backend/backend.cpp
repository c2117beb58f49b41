#include "backend/backend.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/devices.h"
#include "backend/sampling.h"
#include "core/error.h"

namespace tessera {

void Backend::argmax(const Tensor& logits, const Tensor& out) {
  TESSERA_CHECK(logits.ndim() == 2, "argmax of {}", logits.str());
  sample(logits, std::vector<SamplingRow>(static_cast<size_t>(logits.dim(0))), out);
}

namespace {

std::vector<int32_t> host_i32(Backend& be, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) be.copy_to_host(v.data(), t);
  return v;
}

}  // namespace

void Backend::shard_argmax(const Tensor& logits, int64_t width, int64_t first, const Tensor& out) {
  TESSERA_CHECK(logits.ndim() == 2 && logits.dtype() == DType::kF32 && out.dtype() == DType::kI32 &&
                    out.numel() == 2 * logits.dim(0) && width >= 0 && width <= logits.dim(1) && first >= 0,
                "shard_argmax: logits {}, width {}, first {} -> {}", logits.str(), width, first, out.str());
  const int64_t n = logits.dim(0), Vs = logits.dim(1);
  if (n == 0) return;
  std::vector<float> row(static_cast<size_t>(Vs));
  std::vector<int32_t> pairs(static_cast<size_t>(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    copy_to_host(row.data(), logits.rows(i, i + 1));
    const ShardBest b = shard_best_host(row.data(), width, first);
    pairs[static_cast<size_t>(2 * i)] = std::bit_cast<int32_t>(b.value);
    pairs[static_cast<size_t>(2 * i + 1)] = b.id;
  }
  copy_from_host(out, pairs.data());
}

void Backend::merge_shard_argmax(const Tensor& pairs, const Tensor& rows, const Tensor& logits) {
  TESSERA_CHECK(pairs.ndim() == 3 && pairs.dtype() == DType::kI32 && pairs.dim(2) == 2 && logits.ndim() == 2 &&
                    logits.dtype() == DType::kF32 &&
                    (rows.defined() ? rows.dtype() == DType::kI32 && rows.numel() == pairs.dim(1)
                                    : pairs.dim(1) <= logits.dim(0)),
                "merge_shard_argmax: pairs {}, rows {}, logits {}", pairs.str(), rows.defined() ? rows.str() : "all",
                logits.str());
  const int64_t S = pairs.dim(0), m = pairs.dim(1), n = logits.dim(0), V = logits.dim(1);
  if (m == 0) return;
  const std::vector<int32_t> p = host_i32(*this, pairs);
  const std::vector<int32_t> row = rows.defined() ? host_i32(*this, rows) : std::vector<int32_t>();
  std::vector<ShardBest> shards(static_cast<size_t>(S));
  std::vector<float> out(static_cast<size_t>(V));
  for (int64_t k = 0; k < m; ++k) {
    const int64_t r = rows.defined() ? row[static_cast<size_t>(k)] : k;
    TESSERA_CHECK(r >= 0 && r < n, "merge_shard_argmax: row {} of {}", r, n);
    for (int64_t s = 0; s < S; ++s) {
      const size_t at = static_cast<size_t>((s * m + k) * 2);
      shards[static_cast<size_t>(s)] = {std::bit_cast<float>(p[at]), p[at + 1]};
    }
    const ShardBest b = merge_shard_best(shards.data(), S);
    std::fill(out.begin(), out.end(), -std::numeric_limits<float>::infinity());
    if (b.id == kNoToken)
      out[0] = std::numeric_limits<float>::quiet_NaN();
    else if (b.id >= 0 && b.id < V)
      out[static_cast<size_t>(b.id)] = b.value;
    copy_from_host(logits.rows(r, r + 1), out.data());
  }
}

void Backend::apply_token_mask(const Tensor& logits, const Tensor& mask, const Tensor& rows) {
  const int64_t m = rows.numel();
  TESSERA_CHECK(logits.ndim() == 2 && logits.dtype() == DType::kF32 && mask.ndim() == 2 &&
                    mask.dtype() == DType::kI32 && rows.dtype() == DType::kI32 && mask.dim(0) == m,
                "apply_token_mask: logits {}, mask {}, rows {}", logits.str(), mask.str(), rows.str());
  if (m == 0) return;
  const int64_t n = logits.dim(0), V = logits.dim(1), W = mask.dim(1);
  const std::vector<int32_t> bits = host_i32(*this, mask), row = host_i32(*this, rows);
  std::vector<float> host(static_cast<size_t>(V));  // one masked row at a time: the others never cross
  for (int64_t k = 0; k < m; ++k) {
    const int32_t r = row[static_cast<size_t>(k)];
    TESSERA_CHECK(r >= 0 && r < n, "apply_token_mask: row {} of {}", r, n);
    const Tensor lr = logits.rows(r, r + 1);
    copy_to_host(host.data(), lr);
    apply_token_mask_host(host.data(), V,
                          std::span(reinterpret_cast<const uint32_t*>(bits.data() + k * W), static_cast<size_t>(W)));
    copy_from_host(lr, host.data());
  }
}

void Backend::accept_drafts(const Tensor& sampled, const Tensor& tokens, int q, const Tensor& rows) {
  const int64_t S = rows.numel();
  TESSERA_CHECK(q >= 1 && sampled.dtype() == DType::kI32 && tokens.dtype() == DType::kI32 &&
                    rows.dtype() == DType::kI32 && sampled.numel() >= S * q && tokens.numel() >= S * q,
                "accept_drafts: sampled {}, tokens {}, rows {}, q {}", sampled.str(), tokens.str(), rows.str(), q);
  const std::vector<int32_t> got = host_i32(*this, sampled), drafts = host_i32(*this, tokens);
  std::vector<int32_t> out(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    const size_t r0 = static_cast<size_t>(s * q);
    int a = 0;
    while (a < q - 1 && got[r0 + static_cast<size_t>(a)] == drafts[r0 + static_cast<size_t>(a) + 1]) ++a;
    out[static_cast<size_t>(s)] = static_cast<int32_t>(r0) + a;
  }
  if (S > 0) copy_from_host(rows, out.data());
}

void Backend::draft_positions(const Tensor& rows, const Tensor& positions, const Tensor& slot_mapping,
                              const Tensor& block_tables, int q, int block_size, int ahead, const Tensor& out_positions,
                              const Tensor& out_slots, const Tensor& out_seq_lens) {
  const int64_t S = rows.numel();
  TESSERA_CHECK(q >= 1 && block_size > 0 && block_tables.ndim() == 2 && block_tables.dim(0) >= S &&
                    positions.numel() >= S * q && slot_mapping.numel() >= S * q && out_positions.numel() == S &&
                    out_slots.numel() == S && out_seq_lens.numel() == S,
                "draft_positions: rows {}, positions {}, slots {}, block tables {}, q {}", rows.str(), positions.str(),
                slot_mapping.str(), block_tables.str(), q);
  const std::vector<int32_t> row = host_i32(*this, rows), pos = host_i32(*this, positions),
                             slots = host_i32(*this, slot_mapping), table = host_i32(*this, block_tables);
  const int64_t W = block_tables.dim(1);
  std::vector<int32_t> p(static_cast<size_t>(S)), sl(static_cast<size_t>(S)), len(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    const size_t i = static_cast<size_t>(s);
    if (slots[static_cast<size_t>(s * q)] < 0) {
      p[i] = 0, sl[i] = -1, len[i] = 1;
      continue;
    }
    TESSERA_CHECK(row[i] >= s * q && row[i] < (s + 1) * q, "draft_positions: row {} of sequence {} (q {})", row[i], s,
                  q);
    const int32_t at = pos[static_cast<size_t>(row[i])] + ahead;
    const int64_t block = at / block_size;
    p[i] = at;
    sl[i] = block < W ? table[static_cast<size_t>(s * W + block)] * block_size + at % block_size : -1;
    len[i] = at + 1;
  }
  if (S == 0) return;
  copy_from_host(out_positions, p.data());
  copy_from_host(out_slots, sl.data());
  copy_from_host(out_seq_lens, len.data());
}

bool cuda_backend_available() { return cuda_device_count() > 0; }

#ifndef TESSERA_HAVE_CUDA
// A build without the CUDA backend: no devices, and a clear error for whoever asks for one.
int cuda_device_count() { return 0; }

std::unique_ptr<Backend> make_cuda_backend(int) {
  fail(ErrorKind::kUnsupported,
       "this tessera build has no CUDA backend; rebuild with -DTESSERA_CUDA=ON (cmake --preset cuda) or run with "
       "--device cpu");
}

void* cuda_backend_stream(Backend&) { return nullptr; }
#endif

std::unique_ptr<Backend> make_backend(const BackendOptions& opts) {
  if (opts.type == DeviceType::kCPU) return std::make_unique<CpuBackend>(opts.num_threads);
  return make_cuda_backend(opts.device_index);
}

}  // namespace tessera
