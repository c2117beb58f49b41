// CudaBackend: the Backend interface on one CUDA device, as thin forwarding. The device
// (memory, transfers, graphs, checks: cuda_device.h) and the op families, each holding its ops'
// kernel choices (elementwise_ops.h, linear_ops.h, attention_ops.h, moe_ops.h,
// linear_attn_ops.h, sampling_ops.h), do the work; the architecture record (cuda_arch.h) and
// CudaOptions decide among kernels.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/attention_ops.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/elementwise_ops.h"
#include "backend/cuda/linear_attn_ops.h"
#include "backend/cuda/linear_ops.h"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/sampling_ops.h"
#include "backend/host_memory.h"
#include "core/logging.h"

namespace tessera {

namespace {

using namespace cuda;

class CudaBackend final : public Backend {
 public:
  CudaBackend(int index, CudaArch arch, const CudaOptions& options)
      : options_(options),
        dev_(index, std::move(arch), options_.initial_scratch_mib << 20),
        elementwise_(dev_),
        linear_(dev_, options_),
        attention_(dev_, options_),
        moe_(dev_, options_, *this),
        linear_attn_(dev_, options_),
        sampling_(dev_) {
    set_pdl_enabled(dev_.arch().pdl && options_.pdl);
  }

  Device device() const override { return dev_.device(); }
  std::string name() const override { return "cuda:" + std::to_string(dev_.index()) + " (" + dev_.arch().name + ")"; }
  DType compute_dtype() const override { return DType::kBF16; }
  cudaStream_t stream() const { return dev_.stream(); }
  const CudaArch& arch() const { return dev_.arch(); }

  // ---- memory, transfers, graphs: the device
  Tensor alloc(Shape shape, DType dtype) override { return dev_.alloc(shape, dtype); }
  Tensor scratch(Shape shape, DType dtype) override { return dev_.scratch(shape, dtype); }
  void reset_scratch() override { dev_.reset_scratch(); }
  size_t scratch_mark() override { return dev_.scratch_mark(); }
  void scratch_rewind(size_t mark) override { dev_.scratch_rewind(mark); }
  size_t scratch_in_use() const override { return dev_.scratch_in_use(); }
  size_t free_memory() const override { return dev_.free_memory(); }
  size_t total_memory() const override { return dev_.total_memory(); }
  bool unified_memory() const override { return dev_.arch().integrated; }
  size_t free_memory_at_start() const override { return dev_.free_memory_at_start(); }
  void copy_from_host(const Tensor& dst, const void* src) override { dev_.copy_from_host(dst, src); }
  void copy_to_host(void* dst, const Tensor& src) override { dev_.copy_to_host(dst, src); }
  void copy(const Tensor& dst, const Tensor& src) override { dev_.copy(dst, src); }
  void synchronize() override { dev_.synchronize(); }
  bool supports_graphs() const override { return true; }
  void begin_capture() override { dev_.begin_capture(); }
  std::unique_ptr<CapturedGraph> end_capture() override { return dev_.end_capture(); }
  void replay(const CapturedGraph& graph) override { dev_.replay(graph); }
  bool supports_token_state_slots() const override { return true; }

  // ---- elementwise
  void fill_random(const Tensor& dst, uint64_t seed, float low, float high) override {
    elementwise_.fill_random(dst, seed, low, high);
  }
  void fill(const Tensor& dst, float value) override { elementwise_.fill(dst, value); }
  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    elementwise_.embedding(ids, table, out);
  }
  void embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) override {
    elementwise_.embedding_slice(ids, table, begin, out);
  }
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override {
    elementwise_.gather_rows(x, indices, out);
  }
  void cast(const Tensor& src, const Tensor& dst) override { elementwise_.cast(src, dst); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
    elementwise_.rms_norm(x, w, eps, out);
  }
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) override {
    elementwise_.add_rms_norm(x, residual, w, eps);
  }
  void silu_mul(const Tensor& gate_up, const Tensor& out) override { elementwise_.silu_mul(gate_up, out); }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override { elementwise_.add(a, b, out); }
  void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override {
    elementwise_.sigmoid_mul(x, gate, out);
  }

  // ---- linear
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) override {
    linear_.linear(x, w, bias, out);
  }

  // ---- attention
  void rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) override {
    attention_.rope(q, k, positions, table);
  }
  void write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                const AttentionMetadata& meta, float k_scale, float v_scale) override {
    attention_.write_kv(k, v, k_cache, v_cache, meta, k_scale, v_scale);
  }
  void qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                    const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                    float k_scale, float v_scale, const Tensor& q_out) override {
    attention_.qkv_prologue(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale,
                            q_out);
  }
  void qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                     const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionMetadata& meta, float scale, float k_scale, float v_scale, int sliding_window,
                     const Tensor& out) override {
    attention_.qkv_attention(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, scale, k_scale,
                             v_scale, sliding_window, out);
  }
  void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                       float scale, float k_scale, float v_scale, int sliding_window, const Tensor& out) override {
    attention_.paged_attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale, sliding_window, out);
  }

  // ---- mixture of experts
  void moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                const Tensor& topk_weights) override {
    moe_.moe_topk(router_logits, k, renormalize, topk_ids, topk_weights);
  }
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                   const Tensor& topk_weights, int expert_begin, const Tensor& out) override {
    moe_.moe_experts(x, gate_up, down, topk_ids, topk_weights, expert_begin, out);
  }
  void moe_topk_experts(const Tensor& router_logits, int k, bool renormalize, const Tensor& x, const Tensor& gate_up,
                        const Tensor& down, const Tensor& topk_ids, const Tensor& topk_weights, int expert_begin,
                        const Tensor& out, const MoeSharedExpert* shared) override {
    moe_.moe_topk_experts(router_logits, k, renormalize, x, gate_up, down, topk_ids, topk_weights, expert_begin, out,
                          shared);
  }

  // ---- linear attention
  void causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                     const LinearAttnMetadata& meta, const Tensor& out) override {
    linear_attn_.causal_conv1d(x, x_col, weight, conv_state, meta, out);
  }
  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& meta, const Tensor& out) override {
    linear_attn_.gated_delta_rule(qkv, ba, ba_col, A_log, dt_bias, state, meta, out);
  }
  void gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                      const Tensor& out) override {
    linear_attn_.gated_rms_norm(x, z, z_col, w, eps, out);
  }

  // ---- sampling
  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) override {
    sampling_.sample(logits, rows, out);
  }
  void argmax(const Tensor& logits, const Tensor& out) override { sampling_.argmax(logits, out); }
  void shard_argmax(const Tensor& logits, int64_t width, int64_t first, const Tensor& out) override {
    sampling_.shard_argmax(logits, width, first, out);
  }
  void merge_shard_argmax(const Tensor& pairs, const Tensor& rows, const Tensor& logits) override {
    sampling_.merge_shard_argmax(pairs, rows, logits);
  }
  void apply_token_mask(const Tensor& logits, const Tensor& mask, const Tensor& rows) override {
    sampling_.apply_token_mask(logits, mask, rows);
  }
  void accept_drafts(const Tensor& sampled, const Tensor& tokens, int q, const Tensor& rows) override {
    sampling_.accept_drafts(sampled, tokens, q, rows);
  }
  void draft_positions(const Tensor& rows, const Tensor& positions, const Tensor& slot_mapping,
                       const Tensor& block_tables, int q, int block_size, int ahead, const Tensor& out_positions,
                       const Tensor& out_slots, const Tensor& out_seq_lens) override {
    sampling_.draft_positions(rows, positions, slot_mapping, block_tables, q, block_size, ahead, out_positions,
                              out_slots, out_seq_lens);
  }

 private:
  const CudaOptions options_;  // first: the families keep references to it and to dev_
  CudaDevice dev_;
  ElementwiseOps elementwise_;
  LinearOps linear_;
  AttentionOps attention_;
  MoeOps moe_;
  LinearAttnOps linear_attn_;
  SamplingOps sampling_;
};

// The record of device `index` under TESSERA_CUDA_OPTIONS' arch= profile, logged once a device.
CudaArch arch_for(int index, const std::string& env) {
  CudaArch arch = read_cuda_arch(index, cuda_options_profile(env));
  const CudaBinaryMatch match = cuda_binary_support(cuda_built_architectures(), arch.major, arch.minor);
  TLOG_INFO("CUDA device {}: {}; kernels: {}", index, describe_cuda_arch(arch), match.detail);
  if (arch.integrated) {
    const HostMemory m = read_host_memory();
    TLOG_INFO(
        "CUDA device {} shares the host's memory: {:.1f} GiB{}, {:.1f} GiB available (MemAvailable, reclaimable page "
        "cache counted); --gpu-memory-utilization is the share of the total tessera may fill, what others hold "
        "counted as used",
        index, m.total / 1073741824.0, m.cgroup_limited ? " (the cgroup's limit)" : "", m.available / 1073741824.0);
  }
  if (match.support == CudaBinarySupport::kJit)
    TLOG_WARN("CUDA device {} runs {}: this build has no cubin for compute capability {}.{}", index, match.detail,
              arch.major, arch.minor);
  return arch;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: report none
    return 0;
  }
  return n;
}

// The record under TESSERA_CUDA_OPTIONS' profile, `options` (the row's defaults when null), and
// TESSERA_CUDA_OPTIONS' items over them.
static std::unique_ptr<Backend> make_with(int device_index, const CudaOptions* options) {
  const std::string env = cuda_options_from_env();
  CudaArch arch = arch_for(device_index, env);
  CudaOptions o = options ? *options : tuned_cuda_options(arch);
  apply_cuda_options(env, o);
  return std::make_unique<CudaBackend>(device_index, std::move(arch), o);
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) { return make_with(device_index, nullptr); }

std::unique_ptr<Backend> make_cuda_backend(int device_index, const CudaOptions& options) {
  return make_with(device_index, &options);
}

void* cuda_backend_stream(Backend& backend) {
  auto* b = dynamic_cast<CudaBackend*>(&backend);
  return b ? static_cast<void*>(b->stream()) : nullptr;
}

const CudaArch* cuda_backend_arch(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  return b ? &b->arch() : nullptr;
}

}  // namespace tessera
