// Paged attention on the Qwen3-8B head layout (32 q heads, 8 kv heads, head_dim
// 128, block size 16). Decode: KV bytes read per second against the copy
// bandwidth of the same run, bf16 and fp8-e4m3 caches. Prefill: TFLOP/s of one
// long prompt (causal), with and without a cached prefix. Each configuration is
// first checked against the CPU backend on a small case.
// Then the fused decode step by query heads per block (heads_per_block_sweep) and by when the
// merge kernel launches, eagerly and in a graph (merge_sweep).
//   attention_bench [--quick] [--heads | --merge: only that sweep]
#include <cstring>
#include <memory>
#include <numeric>
#include <string>

#include "backend/attention_metadata.h"
#include "bench_util.h"

using namespace tessera;
using namespace tessera::bench;

namespace {

constexpr int kHq = 32, kHk = 8, kD = 128, kBs = 16;

struct Seqs {
  std::vector<int> cached, fresh;
};

// Contiguous blocks per sequence starting at `first_block` (shuffled within the
// sequence would not change the cost: every block is a 4 KB run per head).
AttentionLayout layout_for(const Seqs& s, int first_block, int* blocks_used) {
  AttentionLayout l;
  l.block_size = kBs;
  int max_blocks = 0;
  for (size_t i = 0; i < s.cached.size(); ++i)
    max_blocks = std::max(max_blocks, (s.cached[i] + s.fresh[i] + kBs - 1) / kBs);
  l.max_blocks_per_seq = max_blocks;
  l.query_start_loc = {0};
  int next = first_block;
  for (size_t i = 0; i < s.cached.size(); ++i) {
    int ctx = s.cached[i] + s.fresh[i], nb = (ctx + kBs - 1) / kBs;
    std::vector<int32_t> bt(max_blocks, 0);
    for (int b = 0; b < nb; ++b) bt[b] = next++;
    l.block_tables.insert(l.block_tables.end(), bt.begin(), bt.end());
    for (int j = s.cached[i]; j < ctx; ++j) l.slot_mapping.push_back(bt[j / kBs] * kBs + j % kBs);
    l.query_start_loc.push_back(l.query_start_loc.back() + s.fresh[i]);
    l.seq_lens.push_back(ctx);
  }
  *blocks_used = next - first_block;
  return l;
}

// The metadata of `layers` layers whose caches are consecutive runs of `nb` blocks each.
std::vector<AttentionMetadata> layer_metas(Backend& be, const Seqs& s, int nb, int layers) {
  std::vector<AttentionMetadata> metas;
  for (int l = 0; l < layers; ++l) {
    int used = 0;
    metas.push_back(upload_attention_metadata(be, layout_for(s, l * nb, &used)));
  }
  return metas;
}

int blocks_for(const Seqs& s) {
  int n = 0;
  for (size_t i = 0; i < s.cached.size(); ++i) n += (s.cached[i] + s.fresh[i] + kBs - 1) / kBs;
  return n;
}

double check(Backend& gpu, Backend& cpu, const Seqs& s, DType cache_dt) {
  int nb = blocks_for(s) + 1, used = 0;
  AttentionLayout l = layout_for(s, 1, &used);
  int T = l.query_start_loc.back();
  float ks = cache_dt == DType::kF8E4M3 ? 0.01f : 1.0f, vs = cache_dt == DType::kF8E4M3 ? 0.005f : 1.0f;
  Shape cs{nb, kBs, kHk, kD};
  Tensor gk = gpu.alloc(cs, cache_dt), gv = gpu.alloc(cs, cache_dt);
  gpu.fill_random(gk, 1, -1.0f / ks, 1.0f / ks);
  gpu.fill_random(gv, 2, -1.0f / vs, 1.0f / vs);
  Tensor ck = cpu.alloc(cs, cache_dt), cv = cpu.alloc(cs, cache_dt);
  gpu.copy_to_host(ck.raw(), gk);
  gpu.copy_to_host(cv.raw(), gv);
  auto q = random_bf16_values(int64_t{T} * kHq * kD, 5);
  Tensor gq = upload(gpu, q, {T, kHq, kD}, DType::kBF16), cq = cpu.alloc({T, kHq, kD}, DType::kF32);
  std::memcpy(cq.raw(), q.data(), q.size() * 4);
  Tensor out = gpu.alloc({T, kHq, kD}, DType::kBF16), ref = cpu.alloc({T, kHq, kD}, DType::kF32);
  gpu.fill(out, NAN);
  float scale = 1.0f / std::sqrt(float(kD));
  gpu.paged_attention(gq, gk, gv, upload_attention_metadata(gpu, l), scale, ks, vs, 0, out);
  cpu.paged_attention(cq, ck, cv, upload_attention_metadata(cpu, l), scale, ks, vs, 0, ref);
  std::vector<float> r(ref.numel());
  std::memcpy(r.data(), ref.raw(), r.size() * 4);
  double e = rel_err(download(gpu, out), r);
  gpu.reset_scratch();
  cpu.reset_scratch();
  return e;
}

// One column of a fused decode sweep: a backend, the metadata's max_seq_len (0: the step's own, as an eager
// step has; else what a captured graph's says, which sizes the split count) and whether the layers are
// replayed from a CUDA graph.
struct DecodeColumn {
  std::string label;
  std::unique_ptr<Backend> backend;
  int max_seq_len = 0;
  bool graph = false;
};

// The fused decode step (q/k norm, RoPE and the KV write inside the attention kernel, the op
// decode steps take) on the MoE models' head layouts, for each column: microseconds per layer over
// 48 layers of distinct caches (as a decode step walks them, past the L2), one query token per sequence.
void decode_sweep(const char* title, std::vector<DecodeColumn>& columns, bool quick) {
  struct Layout {
    const char* name;
    int Hq, Hk, D, rd;
  };
  const Layout layouts[] = {
      {"Qwen3-30B-A3B", 32, 4, 128, 128}, {"Qwen3.5-35B-A3B", 16, 2, 256, 64}, {"Qwen3-8B", 32, 8, 128, 128}};
  std::vector<int> batches = {1, 2, 4, 8, 16, 32, 64};
  std::vector<int> ctxs = {640, 4096};
  if (quick) batches = {1, 8, 32};
  constexpr int kMaxPos = 8192;
  std::printf("\nfused decode attention, us per layer (up to 48 layers of distinct caches), %s\n", title);
  std::printf("%-16s %6s %6s", "layout", "batch", "ctx");
  for (const DecodeColumn& c : columns) std::printf(" %12s", c.label.c_str());
  std::printf("\n");
  for (const Layout& lay : layouts) {
    std::vector<float> table(static_cast<size_t>(kMaxPos) * lay.rd);
    for (int p = 0; p < kMaxPos; ++p)
      for (int i = 0; i < lay.rd / 2; ++i) {
        const double f = p * std::pow(1e6, -2.0 * i / lay.rd);
        table[static_cast<size_t>(p) * lay.rd + i] = static_cast<float>(std::cos(f));
        table[static_cast<size_t>(p) * lay.rd + lay.rd / 2 + i] = static_cast<float>(std::sin(f));
      }
    for (int ctx : ctxs)
      for (int batch : batches) {
        std::printf("%-16s %6d %6d", lay.name, batch, ctx);
        for (DecodeColumn& col : columns) {
          Backend* gpu = col.backend.get();
          Seqs s{std::vector<int>(batch, ctx - 1), std::vector<int>(batch, 1)};
          const int nb = blocks_for(s);
          // Layers enough to pass the L2, at most 1 GiB of cache.
          const int64_t layer_bytes = int64_t{nb} * kBs * lay.Hk * lay.D * 2 * 2;
          const int layers = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 30) / layer_bytes, 4, 48));
          Shape cs{int64_t{nb} * layers, kBs, lay.Hk, lay.D};
          Tensor kc = gpu->alloc(cs, DType::kBF16), vc = gpu->alloc(cs, DType::kBF16);
          gpu->fill_random(kc, 3, -2, 2);
          gpu->fill_random(vc, 4, -2, 2);
          std::vector<AttentionMetadata> metas = layer_metas(*gpu, s, nb, layers);
          if (col.max_seq_len > 0)
            for (AttentionMetadata& m : metas) m.max_seq_len = col.max_seq_len;
          Tensor qkv = gpu->alloc({batch, (lay.Hq + 2 * lay.Hk) * lay.D}, DType::kBF16);
          gpu->fill_random(qkv, 5, -2, 2);
          Tensor qn = gpu->alloc({lay.D}, DType::kBF16), kn = gpu->alloc({lay.D}, DType::kBF16);
          gpu->fill_random(qn, 6, 0.5f, 1.5f);
          gpu->fill_random(kn, 7, 0.5f, 1.5f);
          RopeTable rope{upload(*gpu, table, {kMaxPos, lay.rd}, DType::kF32), lay.rd, true};
          std::vector<int32_t> pos(static_cast<size_t>(batch), ctx - 1);
          Tensor positions = gpu->alloc({batch}, DType::kI32);
          gpu->copy_from_host(positions, pos.data());
          Tensor out = gpu->alloc({batch, lay.Hq, lay.D}, DType::kBF16);
          const float scale = 1.0f / std::sqrt(static_cast<float>(lay.D));
          auto all_layers = [&] {
            for (int l = 0; l < layers; ++l)
              gpu->qkv_attention(qkv, &qn, &kn, 1e-6f, positions, rope, kc, vc, metas[l], scale, 1.0f, 1.0f, 0, out);
          };
          double ms = 0;
          if (col.graph) {
            gpu->begin_capture();
            all_layers();
            std::unique_ptr<CapturedGraph> g = gpu->end_capture();
            ms = time_ms(
                *gpu, [&](int) { gpu->replay(*g); }, 3, quick ? 10 : 20);
          } else {
            ms = time_ms(
                *gpu,
                [&](int) {
                  size_t mark = gpu->scratch_mark();
                  all_layers();
                  gpu->scratch_rewind(mark);
                },
                3, quick ? 10 : 20);
          }
          std::printf(" %12.2f", ms * 1e3 / layers);
          gpu->reset_scratch();
        }
        std::printf("\n");
      }
  }
}

// The fused decode step by query heads per block (CudaOptions::decode_heads_per_block; 0 = the rule).
void heads_per_block_sweep(bool quick) {
  std::vector<DecodeColumn> columns;
  for (int heads : {0, 1, 2, 4, 8}) {
    CudaOptions o;
    o.decode_heads_per_block = heads;
    columns.push_back({heads == 0 ? "rule" : std::to_string(heads), make_cuda_backend(0, o)});
  }
  decode_sweep("by query heads per block (rule = the default)", columns, quick);
}

// The merge kernel launched early (at the attention's start, CudaOptions::decode_early_merge) or when the attention
// ends, launched one by one with the step's own split count and replayed from a graph whose metadata says
// max_model_len 8192 (the split count a captured decode step has).
void merge_sweep(bool quick) {
  std::vector<DecodeColumn> columns;
  for (bool graph : {false, true})
    for (bool early : {false, true}) {
      CudaOptions o;
      o.decode_early_merge = early;
      columns.push_back({std::string(early ? "early" : "late") + (graph ? ",graph" : ""), make_cuda_backend(0, o),
                         graph ? 8192 : 0, graph});
    }
  decode_sweep("merge kernel launched late or early; graph = replayed, metadata max_seq_len 8192", columns, quick);
}

}  // namespace

int run(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 1 && std::strcmp(argv[argc - 1], "--merge") == 0) {  // only the merge sweep
    merge_sweep(quick);
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[argc - 1], "--heads") == 0) {  // only the heads-per-block sweep
    heads_per_block_sweep(quick);
    return 0;
  }
  auto gpu = make_cuda_backend(0);
  auto cpu = make_backend({DeviceType::kCPU, 0, 0});
  std::printf("device: %s\n", gpu->name().c_str());
  bool ok = true;
  for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
    double e1 = check(*gpu, *cpu, {{0, 700, 33, 1500}, {1, 1, 1, 1}}, dt);
    double e2 = check(*gpu, *cpu, {{0, 300}, {200, 77}}, dt);
    std::printf("check %-8s decode rel_err %.2e, prefill rel_err %.2e %s\n", std::string(dtype_name(dt)).c_str(), e1,
                e2, e1 < 1e-2 && e2 < 1e-2 ? "OK" : "FAIL");
    ok = ok && e1 < 1e-2 && e2 < 1e-2;
  }
  if (!ok) return 1;

  double copy_gbs = copy_bandwidth_gbs(*gpu);
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy_gbs);
  const float scale = 1.0f / std::sqrt(float(kD));

  // ---- decode
  std::printf("%-6s %6s %7s %-8s %10s %9s %7s\n", "decode", "batch", "ctx", "cache", "time_us", "KV_GB/s", "%copy");
  struct DecodeCase {
    int batch, ctx;
  };
  std::vector<DecodeCase> dcases = {{1, 512}, {1, 4096}, {1, 32768}, {16, 1024}, {64, 1024}, {64, 4096}, {256, 1024}};
  if (quick) dcases = {{1, 4096}, {64, 1024}, {256, 1024}};
  for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
    for (auto c : dcases) {
      Seqs s{std::vector<int>(c.batch, c.ctx - 1), std::vector<int>(c.batch, 1)};
      int nb = blocks_for(s);
      int64_t kv_bytes = int64_t{nb} * kBs * kHk * kD * dtype_size(dt) * 2;
      // Several "layers" so that the working set is far past the L2.
      int layers = static_cast<int>(std::clamp<int64_t>((int64_t{512} << 20) / kv_bytes + 1, 1, 16));
      Shape cs{int64_t{nb} * layers, kBs, kHk, kD};
      Tensor kc = gpu->alloc(cs, dt), vc = gpu->alloc(cs, dt);
      gpu->fill_random(kc, 3, -20, 20);
      gpu->fill_random(vc, 4, -20, 20);
      const std::vector<AttentionMetadata> metas = layer_metas(*gpu, s, nb, layers);
      Tensor q = gpu->alloc({c.batch, kHq, kD}, DType::kBF16), out = gpu->alloc({c.batch, kHq, kD}, DType::kBF16);
      gpu->fill_random(q, 5, -1, 1);
      float ks = dt == DType::kF8E4M3 ? 0.05f : 1.0f;
      double ms = time_ms(
          *gpu,
          [&](int i) {
            size_t mark = gpu->scratch_mark();
            gpu->paged_attention(q, kc, vc, metas[i % layers], scale, ks, ks, 0, out);
            gpu->scratch_rewind(mark);
          },
          5, quick ? 20 : 50);
      // Bytes the op must read: each sequence's K and V rows for its context.
      double bytes = double(c.batch) * c.ctx * kHk * kD * dtype_size(dt) * 2;
      double gbs = bytes / (ms * 1e-3) / 1e9;
      std::printf("%-6s %6d %7d %-8s %10.1f %9.0f %6.0f%%\n", "", c.batch, c.ctx, std::string(dtype_name(dt)).c_str(),
                  ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
      gpu->reset_scratch();
    }
  }

  // ---- prefill
  std::printf("\n%-7s %8s %8s %-8s %10s %9s\n", "prefill", "cached", "new", "cache", "time_ms", "TFLOP/s");
  struct PrefillCase {
    int cached, fresh;
  };
  std::vector<PrefillCase> pcases = {{0, 512}, {0, 4096}, {4096, 4096}, {0, 16384}};
  if (quick) pcases = {{0, 4096}};
  for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
    for (auto c : pcases) {
      Seqs s{{c.cached}, {c.fresh}};
      int nb = blocks_for(s), used = 0;
      Shape cs{nb, kBs, kHk, kD};
      Tensor kc = gpu->alloc(cs, dt), vc = gpu->alloc(cs, dt);
      gpu->fill_random(kc, 3, -4, 4);
      gpu->fill_random(vc, 4, -4, 4);
      AttentionMetadata m = upload_attention_metadata(*gpu, layout_for(s, 0, &used));
      Tensor q = gpu->alloc({c.fresh, kHq, kD}, DType::kBF16), out = gpu->alloc({c.fresh, kHq, kD}, DType::kBF16);
      gpu->fill_random(q, 5, -1, 1);
      double ms = time_ms(
          *gpu, [&](int) { gpu->paged_attention(q, kc, vc, m, scale, 1.0f, 1.0f, 0, out); }, 3, quick ? 10 : 20);
      // Causal FLOPs: query i sees cached + i + 1 keys; 4 * D flops per (query, key, head).
      double pairs = 0;
      for (int i = 0; i < c.fresh; ++i) pairs += c.cached + i + 1;
      double tflops = 4.0 * kD * kHq * pairs / (ms * 1e-3) / 1e12;
      std::printf("%-7s %8d %8d %-8s %10.3f %9.1f\n", "", c.cached, c.fresh, std::string(dtype_name(dt)).c_str(), ms,
                  tflops);
      gpu->reset_scratch();
    }
  }
  heads_per_block_sweep(quick);
  merge_sweep(quick);
  return 0;
}

int main(int argc, char** argv) { return run_main(run, argc, argv); }
