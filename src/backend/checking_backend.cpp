#include "backend/checking_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"

namespace tessera {

namespace {

bool is_float(DType t) { return t != DType::kI32 && t != DType::kI64 && t != DType::kU8; }
bool is_fp8(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }

std::vector<float> host_f32(const Tensor& h) {
  std::vector<float> v(static_cast<size_t>(h.numel()));
  if (h.dtype() == DType::kI32) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(h.data<int32_t>()[i]);
  } else {
    convert_host(h.raw(), h.dtype(), v.data(), DType::kF32, v.size());
  }
  return v;
}

std::string index_str(const Shape& s, int64_t flat) {
  if (flat < 0) return "-";
  std::vector<int64_t> idx(static_cast<size_t>(s.ndim()));
  for (int d = s.ndim() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = s[d] > 0 ? flat % s[d] : 0;
    flat = s[d] > 0 ? flat / s[d] : 0;
  }
  std::string out = "[";
  for (size_t i = 0; i < idx.size(); ++i) out += (i ? ", " : "") + std::to_string(idx[i]);
  return out + "]";
}

uint64_t hash_bytes(const void* p, size_t n) {
  return std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(p), n));
}

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

std::string OpMismatch::str() const {
  std::string s = "step " + std::to_string(step) + " op #" + std::to_string(op_index) + " " + op + " (layer " +
                  (layer < 0 ? std::string("-") : std::to_string(layer)) + ")";
  if (!context.empty()) s += " [" + context + "]";
  s += ": " + output + " rel err " + fmt_g(rel) + " > tol " + fmt_g(tol) + " (max abs " + fmt_g(max_abs) +
       ", reference max |x| " + fmt_g(scale) + "); worst at " + worst_at + " got " + fmt_g(got) + " want " +
       fmt_g(want) + "; " + std::to_string(bad) + "/" + std::to_string(numel) + " elements over tol, first at " +
       first_bad_at + "\n    operands: " + shapes;
  if (!note.empty()) s += "\n    note: " + note;
  return s;
}

// One checked op: host copies of the primary's operands (taken before the primary runs, so
// in-place ops compare against the reference applied to the same starting values), the
// reference run on them, then the comparison of each output.
class CheckingBackend::Op {
 public:
  Op(CheckingBackend& cb, const char* name) : cb_(cb), name_(name) {
    if (name_ == "add_rms_norm") ++cb_.mixers_in_step_;
    // Decoder layer i is normed in by add_rms_norm number 2i (layer 0: rms_norm) and out by
    // 2i+1; the final norm is number 2L, so the lm_head reports layer L.
    layer_ = cb_.mixers_in_step_ / 2;
    index_ = cb_.op_in_step_++;
    ++cb_.ops_checked_;
    cb_.stats_[name_].calls++;
  }
  ~Op() { cb_.reference_.reset_scratch(); }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // A host f32 copy of a float tensor (block-scaled FP8 dequantised), integers as they are.
  // Aliases (the same bytes passed twice, e.g. an in-place output) map to one host tensor.
  Tensor in(const Tensor& t) { return mirror(t, true, true); }
  // An output's host copy (its contents before the op: ops that write only some rows), not
  // verified as an input (its old bytes are dead).
  Tensor out(const Tensor& t) { return mirror(t, true, false); }
  Tensor out_keep(const Tensor& t) { return mirror(t, false, false); }
  // A host copy in t's own dtype (KV caches, linear-attention states).
  Tensor keep(const Tensor& t) { return mirror(t, false, true); }
  const Tensor* opt(const Tensor* t, Tensor& holder) {
    if (!t) return nullptr;
    holder = in(*t);
    return &holder;
  }
  void operand(const std::string& name, const Tensor& t) {
    shapes_ += (shapes_.empty() ? "" : ", ") + name + " " + t.str();
  }
  void operand(const std::string& text) { shapes_ += (shapes_.empty() ? "" : ", ") + text; }

  RopeTable rope(const RopeTable& t) {
    RopeTable r = t;
    r.cos_sin = in(t.cos_sin);
    return r;
  }

  AttentionMetadata attn(const AttentionMetadata& m) {
    AttentionMetadata r = m.sizes();
    const int64_t S = m.num_seqs;
    // The table's width as the device tensor has it (what the CUDA kernels index by).
    const int64_t W = m.block_tables.defined() && S > 0 ? m.block_tables.numel() / S : m.max_blocks_per_seq;
    r.max_blocks_per_seq = static_cast<int>(W);
    if (W != m.max_blocks_per_seq)
      operand("block table width " + std::to_string(W) + " (the field says " + std::to_string(m.max_blocks_per_seq) +
              ")");
    index(m.query_start_loc, m.host_query_start_loc, S + 1, "query_start_loc", r.query_start_loc,
          r.host_query_start_loc);
    index(m.seq_lens, m.host_seq_lens, S, "seq_lens", r.seq_lens, r.host_seq_lens);
    index(m.block_tables, W == m.max_blocks_per_seq ? m.host_block_tables : std::vector<int32_t>{}, S * W,
          "block_tables", r.block_tables, r.host_block_tables);
    r.block_tables = r.block_tables.view({S, W});
    index(m.slot_mapping, m.host_slot_mapping, m.num_tokens, "slot_mapping", r.slot_mapping, r.host_slot_mapping);
    std::string lens;
    for (size_t s = 0; s < r.host_seq_lens.size() && s < 8; ++s)
      lens += (s ? "," : "") + std::to_string(r.host_seq_lens[s]);
    if (r.host_seq_lens.size() > 8) lens += ",...";
    operand("attention meta {seqs " + std::to_string(S) + ", tokens " + std::to_string(m.num_tokens) +
            ", max_query_len " + std::to_string(m.max_query_len) + ", max_seq_len " + std::to_string(m.max_seq_len) +
            ", seq_lens " + lens + ", block_size " + std::to_string(m.block_size) + "}");
    return r;
  }

  LinearAttnMetadata lin(const LinearAttnMetadata& m) {
    LinearAttnMetadata r;
    r.num_seqs = m.num_seqs;
    r.num_tokens = m.num_tokens;
    r.max_query_len = m.max_query_len;
    const int64_t S = m.num_seqs;
    index(m.query_start_loc, m.host_query_start_loc, S + 1, "query_start_loc", r.query_start_loc,
          r.host_query_start_loc);
    index(m.state_slots, m.host_state_slots, S, "state_slots", r.state_slots, r.host_state_slots);
    index(m.has_initial_state, m.host_has_initial_state, S, "has_initial_state", r.has_initial_state,
          r.host_has_initial_state);
    if (m.token_state_slots.defined() || !m.host_token_state_slots.empty()) {
      index(m.token_state_slots, m.host_token_state_slots, m.num_tokens, "token_state_slots", r.token_state_slots,
            r.host_token_state_slots);
      operand("token_state_slots");
    }
    std::string init, qsl;
    for (size_t s = 0; s < r.host_has_initial_state.size() && s < 8; ++s)
      init += (s ? "," : "") + std::to_string(r.host_has_initial_state[s]);
    for (size_t s = 0; s < r.host_query_start_loc.size() && s < 9; ++s)
      qsl += (s ? "," : "") + std::to_string(r.host_query_start_loc[s]);
    operand("linear meta {seqs " + std::to_string(S) + ", tokens " + std::to_string(m.num_tokens) + ", max_query_len " +
            std::to_string(m.max_query_len) + ", query_start_loc " + qsl + ", has_initial_state " + init + "}");
    return r;
  }

  // Compares the primary's `p` (after the op) with the reference's host `r`.
  void check(const std::string& output, const Tensor& p, const Tensor& r, double tol = -1) {
    if (tol < 0)
      tol = is_fp8(p.dtype()) ? std::max(cb_.options_.rel_tol, cb_.options_.fp8_rel_tol) : cb_.options_.rel_tol;
    const Tensor got_raw = download(p);
    cb_.note_written(p.raw(), p.nbytes(), hash_bytes(got_raw.raw(), got_raw.nbytes()), written_by(output));
    const std::vector<float> got = host_f32(got_raw), want = host_f32(r);
    TESSERA_CHECK(got.size() == want.size(), "checking backend: {} {} has {} values, the reference {}", name_, output,
                  got.size(), want.size());
    double scale = 0, max_abs = 0;
    int64_t worst = -1;
    for (float w : want)
      if (std::isfinite(w)) scale = std::max(scale, static_cast<double>(std::fabs(w)));
    const double floor = std::max(scale, 1e-6);
    int64_t bad = 0, first_bad = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      double e = std::fabs(static_cast<double>(got[i]) - want[i]);
      if (!std::isfinite(got[i]) && std::isfinite(want[i])) e = std::numeric_limits<double>::infinity();
      if (std::isnan(e)) e = 0;  // both non-finite alike
      if (e > max_abs || worst < 0) {
        max_abs = std::max(max_abs, e);
        worst = static_cast<int64_t>(i);
      }
      if (e > tol * floor) {
        ++bad;
        if (first_bad < 0) first_bad = static_cast<int64_t>(i);
      }
    }
    const double rel = max_abs / floor;
    note_worst(rel, output);
    if (bad == 0) return;
    OpMismatch m = base(output);
    m.max_abs = max_abs;
    m.scale = scale;
    m.rel = rel;
    m.tol = tol;
    m.bad = bad;
    m.numel = static_cast<int64_t>(got.size());
    m.worst_at = index_str(p.shape(), worst);
    m.got = worst >= 0 ? got[static_cast<size_t>(worst)] : 0;
    m.want = worst >= 0 ? want[static_cast<size_t>(worst)] : 0;
    m.first_bad_at = index_str(p.shape(), first_bad);
    cb_.record(std::move(m));
  }

  // The top-k choice: ids compared position by position. Equal router logits are ties, which
  // the contract breaks towards the lower expert id: a primary that breaks them otherwise is
  // recorded; a choice between experts whose probabilities differ only by float rounding
  // (1e-6 relative) is reported in the summary but not recorded.
  void check_topk(const Tensor& p_ids, const Tensor& r_ids, const Tensor& logits_host, int k) {
    const std::vector<float> logits = host_f32(logits_host);
    const Tensor pid_h = download(p_ids);
    cb_.note_written(p_ids.raw(), p_ids.nbytes(), hash_bytes(pid_h.raw(), pid_h.nbytes()), written_by("topk_ids"));
    const int32_t* pid = pid_h.data<int32_t>();
    const int32_t* rid = r_ids.data<int32_t>();
    const int64_t T = p_ids.dim(0), E = logits_host.dim(1);
    for (int64_t t = 0; t < T && k < E; ++t) {
      std::vector<float> row(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      std::nth_element(row.begin(), row.begin() + k, row.end(), std::greater<float>());
      const float kth_plus_1 = row[static_cast<size_t>(k)];
      const float kth = *std::min_element(row.begin(), row.begin() + k);
      const double gap = static_cast<double>(kth) - kth_plus_1;
      if (cb_.min_topk_gap_.gap < 0 || gap < cb_.min_topk_gap_.gap) cb_.min_topk_gap_ = {gap, layer_};
    }
    int64_t bad_rows = 0, tie_rows = 0, near_rows = 0, first_bad = -1;
    std::string detail;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = &logits[static_cast<size_t>(t * E)];
      bool bad = false, tie = false, near = false;
      for (int j = 0; j < k; ++j) {
        const int32_t a = pid[t * k + j], b = rid[t * k + j];
        if (a == b) continue;
        if (a < 0 || a >= E) {
          bad = true;
          continue;
        }
        const float la = row[a], lb = row[b];
        if (la == lb) {
          tie = true;
        } else if (std::fabs(la - lb) <= 1e-6f * std::max(std::fabs(la), std::fabs(lb)) + 1e-7f) {
          near = true;
        } else {
          bad = true;
        }
        if ((bad || tie) && detail.size() < 300)
          detail += "token " + std::to_string(t) + " slot " + std::to_string(j) + ": primary expert " +
                    std::to_string(a) + " (logit " + fmt_g(la) + "), reference " + std::to_string(b) + " (logit " +
                    fmt_g(lb) + "); ";
      }
      bad_rows += bad;
      tie_rows += tie && !bad;
      near_rows += near && !bad && !tie;
      if ((bad || tie) && first_bad < 0) first_bad = t;
    }
    if (near_rows > 0) cb_.stats_[name_].worst_where += " (" + std::to_string(near_rows) + " near-tie rows)";
    if (bad_rows == 0 && tie_rows == 0) return;
    OpMismatch m = base("topk_ids");
    m.rel = m.max_abs = bad_rows > 0 ? 1.0 : 0.0;
    m.scale = 1;
    m.bad = bad_rows + tie_rows;
    m.numel = T;
    m.worst_at = m.first_bad_at = "[" + std::to_string(first_bad) + "]";
    m.note = std::to_string(bad_rows) + " rows choose other experts, " + std::to_string(tie_rows) +
             " rows break exact ties otherwise than the lower expert id first; " + detail;
    note_worst(m.rel, "topk_ids");
    cb_.record(std::move(m));
  }

 private:
  std::string written_by(const std::string& output) const {
    return "op #" + std::to_string(index_) + " " + name_ + " (" + output + ") of step " + std::to_string(cb_.step_) +
           (cb_.context_.empty() ? "" : " [" + cb_.context_ + "]");
  }

  // Whether t's bytes are what the last tracked write left there; records the op if not.
  void verify_unchanged(const Tensor& t, const Tensor& host_raw) {
    const auto it = cb_.written_.find(reinterpret_cast<uintptr_t>(t.raw()));
    if (it == cb_.written_.end() || it->second.bytes != t.nbytes()) return;
    const uint64_t h = hash_bytes(host_raw.raw(), host_raw.nbytes());
    if (h == it->second.hash) return;
    OpMismatch m = base("clobbered input");
    m.rel = m.max_abs = std::numeric_limits<double>::infinity();
    m.numel = t.numel();
    m.note = "the input " + t.str() + " changed since " + it->second.by +
             " wrote it, and no op, upload or copy wrote it since: something overwrote it behind the ops' backs "
             "(scratch handed out twice, an out-of-bounds write, another sequence's state slot)";
    it->second.hash = h;  // reported once
    cb_.record(std::move(m));
  }

  OpMismatch base(const std::string& output) const {
    OpMismatch m;
    m.step = cb_.step_;
    m.op_index = index_;
    m.layer = layer_;
    m.context = cb_.context_;
    m.op = name_;
    m.output = output;
    m.shapes = shapes_;
    return m;
  }

  void note_worst(double rel, const std::string& output) {
    Stat& s = cb_.stats_[name_];
    if (rel > s.worst_rel || s.worst_where.empty()) {
      s.worst_rel = std::max(s.worst_rel, rel);
      if (rel >= s.worst_rel)
        s.worst_where = output + " at step " + std::to_string(cb_.step_) + " op #" + std::to_string(index_) +
                        " layer " + std::to_string(layer_) + (cb_.context_.empty() ? "" : " [" + cb_.context_ + "]");
    }
  }

  Tensor download(const Tensor& t) {
    Tensor h = host_empty(t.shape(), t.dtype());
    if (t.nbytes() > 0) cb_.primary_.copy_to_host(h.raw(), t);
    return h;
  }

  Tensor mirror(const Tensor& t, bool to_f32, bool verify) {
    const auto key = std::make_tuple(t.raw(), t.nbytes(), to_f32);
    for (const auto& [k, h] : memo_)
      if (k == key) return h.numel() == t.numel() ? h.view(t.shape()) : h;
    Tensor h = download(t);
    if (verify) verify_unchanged(t, h);
    if (to_f32 && t.block_scaled()) {
      Tensor scale = download(*t.block_scale());
      h = dequantize_block_scaled_host(h.with_block_scale(scale));
    } else if (to_f32 && is_float(t.dtype()) && t.dtype() != DType::kF32) {
      Tensor f = host_empty(t.shape(), DType::kF32);
      convert_host(h.raw(), h.dtype(), f.raw(), DType::kF32, static_cast<size_t>(h.numel()));
      h = f;
    }
    memo_.emplace_back(key, h);
    return h;
  }

  // An index tensor of the metadata: the device tensor's values (what the primary reads),
  // trimmed to n; a host copy that disagrees with them is recorded.
  void index(const Tensor& dev, const std::vector<int32_t>& host, int64_t n, const char* what, Tensor& out_t,
             std::vector<int32_t>& out_v) {
    if (dev.defined()) {
      Tensor h = download(dev);
      const int64_t have = std::min<int64_t>(n, h.numel());
      out_v.assign(h.data<int32_t>(), h.data<int32_t>() + have);
      const size_t cmp = std::min(out_v.size(), host.size());
      if (!host.empty() && !std::equal(out_v.begin(), out_v.begin() + static_cast<long>(cmp), host.begin())) {
        OpMismatch m = base(std::string("metadata.") + what);
        m.rel = m.max_abs = 1;
        m.note = std::string("the device ") + what + " differs from the host copy the CPU kernels read";
        cb_.record(std::move(m));
      }
    } else {
      out_v.assign(host.begin(), host.begin() + std::min<int64_t>(n, static_cast<int64_t>(host.size())));
    }
    out_t = host_empty({static_cast<int64_t>(out_v.size())}, DType::kI32);
    if (!out_v.empty()) std::memcpy(out_t.raw(), out_v.data(), out_v.size() * sizeof(int32_t));
  }

  CheckingBackend& cb_;
  std::string name_;
  std::string shapes_;
  int layer_ = 0;
  int64_t index_ = 0;
  std::vector<std::pair<std::tuple<const void*, size_t, bool>, Tensor>> memo_;
};

CheckingBackend::CheckingBackend(Backend& primary, Backend& reference, CheckOptions options)
    : ForwardingBackend(primary), primary_(primary), reference_(reference), options_(options) {
  TESSERA_CHECK(reference.device().type == DeviceType::kCPU && reference.compute_dtype() == DType::kF32,
                "the checking backend's reference must be the CPU backend, got {}", reference.name());
}

void CheckingBackend::reset_scratch() {
  primary_.reset_scratch();
  reference_.reset_scratch();
  ++step_;
  op_in_step_ = 0;
  mixers_in_step_ = 0;
}

void CheckingBackend::note_written(const void* p, size_t n, uint64_t hash, std::string by) {
  forget(p, n);
  if (n > 0) written_[reinterpret_cast<uintptr_t>(p)] = Written{n, hash, std::move(by)};
}

void CheckingBackend::forget(const void* p, size_t n) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + n;
  for (auto it = written_.begin(); it != written_.end() && it->first < e;)
    it = it->first + it->second.bytes > b ? written_.erase(it) : std::next(it);
}

void CheckingBackend::copy_from_host(const Tensor& dst, const void* src) {
  primary_.copy_from_host(dst, src);
  note_written(dst.raw(), dst.nbytes(), hash_bytes(src, dst.nbytes()), "an upload (copy_from_host) of " + dst.str());
}

void CheckingBackend::copy(const Tensor& dst, const Tensor& src) {
  primary_.copy(dst, src);
  forget(dst.raw(), dst.nbytes());
}

void CheckingBackend::fill_random(const Tensor& dst, uint64_t seed, float low, float high) {
  primary_.fill_random(dst, seed, low, high);
  forget(dst.raw(), dst.nbytes());
}

void CheckingBackend::fill(const Tensor& dst, float value) {
  primary_.fill(dst, value);
  forget(dst.raw(), dst.nbytes());
}

void CheckingBackend::sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) {
  primary_.sample(logits, rows, out);
  forget(out.raw(), out.nbytes());
}

void CheckingBackend::apply_token_mask(const Tensor& logits, const Tensor& mask, const Tensor& rows) {
  primary_.apply_token_mask(logits, mask, rows);
  forget(logits.raw(), logits.nbytes());
}

void CheckingBackend::record(OpMismatch m) {
  stats_[m.op].mismatches++;
  if (options_.log && static_cast<int>(mismatches_.size()) < options_.max_printed) {
    std::fprintf(options_.log, "[check] MISMATCH #%zu %s\n", mismatches_.size() + 1, m.str().c_str());
    std::fflush(options_.log);
  }
  mismatches_.push_back(std::move(m));
}

std::string CheckingBackend::summary() const {
  std::string s = "[check] " + std::to_string(ops_checked_) + " ops checked, " + std::to_string(mismatches_.size()) +
                  " mismatches (tol " + fmt_g(options_.rel_tol) + " of each output's max |reference|)\n";
  for (const auto& [op, st] : stats_) {
    char line[160];
    std::snprintf(line, sizeof line, "[check]   %-18s calls %7lld  mismatches %6lld  worst rel err %-10.4g ",
                  op.c_str(), static_cast<long long>(st.calls), static_cast<long long>(st.mismatches), st.worst_rel);
    s += line + st.worst_where + "\n";
  }
  if (!mismatches_.empty()) s += "[check] first mismatch: " + mismatches_.front().str() + "\n";
  return s;
}

void CheckingBackend::print_summary() const {
  if (!options_.log) return;
  std::fputs(summary().c_str(), options_.log);
  std::fflush(options_.log);
}

void CheckingBackend::clear() {
  written_.clear();
  mismatches_.clear();
  stats_.clear();
  ops_checked_ = 0;
}

// ---------------------------------------------------------------- ops

void CheckingBackend::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  Op op(*this, "embedding");
  op.operand("ids", ids), op.operand("table", table), op.operand("out", out);
  Tensor r_ids = op.in(ids), r_table = op.in(table), r_out = op.out(out);
  primary_.embedding(ids, table, out);
  reference_.embedding(r_ids, r_table, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  Op op(*this, "rms_norm");
  op.operand("x", x), op.operand("w", w), op.operand("out", out);
  Tensor r_x = op.in(x), r_w = op.in(w), r_out = op.out(out);
  primary_.rms_norm(x, w, eps, out);
  reference_.rms_norm(r_x, r_w, eps, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) {
  Op op(*this, "add_rms_norm");
  op.operand("x", x), op.operand("residual", residual), op.operand("w", w);
  Tensor r_x = op.in(x), r_res = op.in(residual), r_w = op.in(w);
  primary_.add_rms_norm(x, residual, w, eps);
  reference_.add_rms_norm(r_x, r_res, r_w, eps);
  op.check("x (normed)", x, r_x);
  op.check("residual", residual, r_res);
}

void CheckingBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) {
  Op op(*this, "linear");
  op.operand("x", x), op.operand("w", w), op.operand("out", out);
  if (bias) op.operand("bias", *bias);
  Tensor r_x = op.in(x), r_w = op.in(w), r_out = op.out(out), r_bias;
  const Tensor* rb = op.opt(bias, r_bias);
  primary_.linear(x, w, bias, out);
  reference_.linear(r_x, r_w, rb, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::silu_mul(const Tensor& gate_up, const Tensor& out) {
  Op op(*this, "silu_mul");
  op.operand("gate_up", gate_up), op.operand("out", out);
  Tensor r_gu = op.in(gate_up), r_out = op.out(out);
  primary_.silu_mul(gate_up, out);
  reference_.silu_mul(r_gu, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  Op op(*this, "add");
  op.operand("a", a), op.operand("b", b), op.operand("out", out);
  Tensor r_a = op.in(a), r_b = op.in(b), r_out = op.out(out);
  primary_.add(a, b, out);
  reference_.add(r_a, r_b, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) {
  Op op(*this, "rope");
  op.operand("q", q), op.operand("k", k), op.operand("positions", positions);
  op.operand("rotary_dim " + std::to_string(table.rotary_dim) + (table.neox_style ? " neox" : " interleaved"));
  Tensor r_q = op.in(q), r_k = op.in(k), r_pos = op.in(positions);
  RopeTable r_table = op.rope(table);
  primary_.rope(q, k, positions, table);
  reference_.rope(r_q, r_k, r_pos, r_table);
  op.check("q", q, r_q);
  op.check("k", k, r_k);
}

void CheckingBackend::write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                               const AttentionMetadata& meta, float k_scale, float v_scale) {
  Op op(*this, "write_kv");
  op.operand("k", k), op.operand("v", v), op.operand("k_cache", k_cache);
  Tensor r_k = op.in(k), r_v = op.in(v), r_kc = op.keep(k_cache), r_vc = op.keep(v_cache);
  AttentionMetadata r_meta = op.attn(meta);
  primary_.write_kv(k, v, k_cache, v_cache, meta, k_scale, v_scale);
  reference_.write_kv(r_k, r_v, r_kc, r_vc, r_meta, k_scale, v_scale);
  op.check("k_cache", k_cache, r_kc);
  op.check("v_cache", v_cache, r_vc);
}

void CheckingBackend::qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                   const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                                   const Tensor& v_cache, const AttentionMetadata& meta, float k_scale, float v_scale,
                                   const Tensor& q_out) {
  Op op(*this, "qkv_prologue");
  op.operand("qkv", qkv), op.operand("k_cache", k_cache), op.operand("q_out", q_out);
  op.operand(std::string("qk_norm ") + (q_norm ? "yes" : "no") + ", rotary_dim " + std::to_string(table.rotary_dim));
  Tensor r_qkv = op.in(qkv), r_qn, r_kn, r_pos = op.in(positions), r_kc = op.keep(k_cache), r_vc = op.keep(v_cache),
         r_q = op.out(q_out);
  const Tensor *qn = op.opt(q_norm, r_qn), *kn = op.opt(k_norm, r_kn);
  RopeTable r_table = op.rope(table);
  AttentionMetadata r_meta = op.attn(meta);
  primary_.qkv_prologue(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale, q_out);
  reference_.qkv_prologue(r_qkv, qn, kn, eps, r_pos, r_table, r_kc, r_vc, r_meta, k_scale, v_scale, r_q);
  op.check("q_out", q_out, r_q);
  op.check("k_cache", k_cache, r_kc);
  op.check("v_cache", v_cache, r_vc);
}

void CheckingBackend::paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                      const AttentionMetadata& meta, float scale, float k_scale, float v_scale,
                                      int sliding_window, const Tensor& out) {
  Op op(*this, "paged_attention");
  op.operand("q", q), op.operand("k_cache", k_cache), op.operand("out", out);
  if (sliding_window > 0) op.operand("sliding_window " + std::to_string(sliding_window));
  Tensor r_q = op.in(q), r_kc = op.keep(k_cache), r_vc = op.keep(v_cache), r_out = op.out(out);
  AttentionMetadata r_meta = op.attn(meta);
  primary_.paged_attention(q, k_cache, v_cache, meta, scale, k_scale, v_scale, sliding_window, out);
  reference_.paged_attention(r_q, r_kc, r_vc, r_meta, scale, k_scale, v_scale, sliding_window, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                    const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                                    const Tensor& v_cache, const AttentionMetadata& meta, float scale, float k_scale,
                                    float v_scale, int sliding_window, const Tensor& out) {
  Op op(*this, "qkv_attention");
  op.operand("qkv", qkv), op.operand("k_cache", k_cache), op.operand("out", out);
  if (sliding_window > 0) op.operand("sliding_window " + std::to_string(sliding_window));
  op.operand(std::string("qk_norm ") + (q_norm ? "yes" : "no") + ", rotary_dim " + std::to_string(table.rotary_dim));
  Tensor r_qkv = op.in(qkv), r_qn, r_kn, r_pos = op.in(positions), r_kc = op.keep(k_cache), r_vc = op.keep(v_cache),
         r_out = op.out(out);
  const Tensor *qn = op.opt(q_norm, r_qn), *kn = op.opt(k_norm, r_kn);
  RopeTable r_table = op.rope(table);
  AttentionMetadata r_meta = op.attn(meta);
  // The primary's own qkv_attention (CUDA fuses prologue and decode attention); the
  // reference's is the two-op composition.
  primary_.qkv_attention(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, scale, k_scale, v_scale,
                         sliding_window, out);
  reference_.qkv_attention(r_qkv, qn, kn, eps, r_pos, r_table, r_kc, r_vc, r_meta, scale, k_scale, v_scale,
                           sliding_window, r_out);
  op.check("out", out, r_out);
  op.check("k_cache", k_cache, r_kc);
  op.check("v_cache", v_cache, r_vc);
}

void CheckingBackend::moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                               const Tensor& topk_weights) {
  Op op(*this, "moe_topk");
  op.operand("router_logits", router_logits), op.operand("k " + std::to_string(k));
  op.operand(renormalize ? "renormalize" : "no renormalize");
  Tensor r_logits = op.in(router_logits), r_ids = op.out(topk_ids), r_w = op.out(topk_weights);
  primary_.moe_topk(router_logits, k, renormalize, topk_ids, topk_weights);
  reference_.moe_topk(r_logits, k, renormalize, r_ids, r_w);
  op.check_topk(topk_ids, r_ids, r_logits, k);
  // Both in f32 from the same logits: only rounding may differ.
  op.check("topk_weights", topk_weights, r_w, 1e-3);
}

void CheckingBackend::moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                                  const Tensor& topk_weights, int expert_begin, const Tensor& out) {
  Op op(*this, "moe_experts");
  op.operand("x", x), op.operand("gate_up", gate_up), op.operand("down", down), op.operand("topk_ids", topk_ids);
  op.operand("expert_begin " + std::to_string(expert_begin));
  Tensor r_x = op.in(x), r_gu = op.in(gate_up), r_down = op.in(down), r_ids = op.in(topk_ids),
         r_w = op.in(topk_weights), r_out = op.out(out);
  primary_.moe_experts(x, gate_up, down, topk_ids, topk_weights, expert_begin, out);
  reference_.moe_experts(r_x, r_gu, r_down, r_ids, r_w, expert_begin, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) {
  Op op(*this, "sigmoid_mul");
  op.operand("x", x), op.operand("gate", gate), op.operand("out", out);
  Tensor r_x = op.in(x), r_gate = op.in(gate), r_out = op.out(out);
  primary_.sigmoid_mul(x, gate, out);
  reference_.sigmoid_mul(r_x, r_gate, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                                    const LinearAttnMetadata& meta, const Tensor& out) {
  Op op(*this, "causal_conv1d");
  op.operand("x", x), op.operand("x_col " + std::to_string(x_col)), op.operand("weight", weight);
  op.operand("conv_state", conv_state), op.operand("out", out);
  Tensor r_x = op.in(x), r_w = op.in(weight), r_state = op.keep(conv_state), r_out = op.out(out);
  LinearAttnMetadata r_meta = op.lin(meta);
  primary_.causal_conv1d(x, x_col, weight, conv_state, meta, out);
  reference_.causal_conv1d(r_x, x_col, r_w, r_state, r_meta, r_out);
  op.check("out", out, r_out);
  op.check("conv_state", conv_state, r_state);
}

void CheckingBackend::gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log,
                                       const Tensor& dt_bias, const Tensor& state, const LinearAttnMetadata& meta,
                                       const Tensor& out) {
  Op op(*this, "gated_delta_rule");
  op.operand("qkv", qkv), op.operand("ba", ba), op.operand("ba_col " + std::to_string(ba_col));
  op.operand("state", state), op.operand("out", out);
  Tensor r_qkv = op.in(qkv), r_ba = op.in(ba), r_alog = op.in(A_log), r_dt = op.in(dt_bias), r_state = op.keep(state),
         r_out = op.out(out);
  LinearAttnMetadata r_meta = op.lin(meta);
  primary_.gated_delta_rule(qkv, ba, ba_col, A_log, dt_bias, state, meta, out);
  reference_.gated_delta_rule(r_qkv, r_ba, ba_col, r_alog, r_dt, r_state, r_meta, r_out);
  op.check("out", out, r_out);
  op.check("state", state, r_state);
}

void CheckingBackend::gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                                     const Tensor& out) {
  Op op(*this, "gated_rms_norm");
  op.operand("x", x), op.operand("z", z), op.operand("z_col " + std::to_string(z_col)), op.operand("out", out);
  Tensor r_x = op.in(x), r_z = op.in(z), r_w = op.in(w), r_out = op.out(out);
  primary_.gated_rms_norm(x, z, z_col, w, eps, out);
  reference_.gated_rms_norm(r_x, r_z, z_col, r_w, eps, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) {
  Op op(*this, "gather_rows");
  op.operand("x", x), op.operand("indices", indices), op.operand("out", out);
  Tensor r_x = op.in(x), r_idx = op.in(indices), r_out = op.out(out);
  primary_.gather_rows(x, indices, out);
  reference_.gather_rows(r_x, r_idx, r_out);
  op.check("out", out, r_out);
}

void CheckingBackend::cast(const Tensor& src, const Tensor& dst) {
  Op op(*this, "cast");
  op.operand("src", src), op.operand("dst", dst);
  Tensor r_src = op.in(src), r_dst = op.out_keep(dst);
  primary_.cast(src, dst);
  reference_.cast(r_src, r_dst);
  op.check("dst", dst, r_dst);
}

void CheckingBackend::embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) {
  Op op(*this, "embedding_slice");
  op.operand("ids", ids), op.operand("table", table), op.operand("begin " + std::to_string(begin));
  Tensor r_ids = op.in(ids), r_table = op.in(table), r_out = op.out(out);
  primary_.embedding_slice(ids, table, begin, out);
  reference_.embedding_slice(r_ids, r_table, begin, r_out);
  op.check("out", out, r_out);
}

}  // namespace tessera
