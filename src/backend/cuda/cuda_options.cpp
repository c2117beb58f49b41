// TESSERA_CUDA_OPTIONS: CudaOptions members by name, for whole-model A/B runs and for finding
// which kernel choice moves a model's numbers (e.g. chunked_gated_delta=0,fp8_w8a8_min_rows=1000000),
// and arch=<profile> to make a GPU take another architecture's row of the tuning table.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_options.h"
#include "core/error.h"

namespace tessera {

namespace {

using Setter = std::function<void(const std::string& what, std::string_view v)>;

int64_t as_int(const std::string& what, std::string_view v) {
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty())
    fail(ErrorKind::kInvalidArgument, "{}={} is not an integer", what, v);
  return n;
}

Setter flag(bool* out) {
  return [=](const std::string& what, std::string_view v) {
    const int64_t n = as_int(what, v);
    if (n != 0 && n != 1) fail(ErrorKind::kInvalidArgument, "{}={} must be 0 or 1", what, v);
    *out = n == 1;
  };
}

template <typename T>
Setter integer(T* out, int64_t min_value) {
  return [=](const std::string& what, std::string_view v) {
    const int64_t n = as_int(what, v);
    if (n < min_value) fail(ErrorKind::kInvalidArgument, "{}={} must be at least {}", what, v, min_value);
    *out = static_cast<T>(n);
  };
}

template <typename E, size_t N>
Setter variant(const E (&all)[N], const char* (*name)(E), E* out) {
  return [&all, name, out](const std::string& what, std::string_view v) {
    if (!pick_named(v, all, name, out))
      fail(ErrorKind::kInvalidArgument, "{}={} names no variant; use one of: {}", what, v, names_of(all, name));
  };
}

// The table of options by name; `o` null lists the names only.
std::vector<std::pair<const char*, Setter>> option_table(CudaOptions* o) {
  CudaOptions unused;
  CudaOptions& t = o ? *o : unused;
  return {
      {"moe_decode", variant(kAllCudaMoeDecode, cuda_moe_decode_name, &t.moe_decode)},
      {"moe_fp8_decode", variant(kAllCudaMoeFp8Decode, cuda_moe_fp8_decode_name, &t.moe_fp8_decode)},
      {"moe_one_token", variant(kAllCudaMoeOneToken, cuda_moe_one_token_name, &t.moe_one_token)},
      {"moe_fp8_one_token", variant(kAllCudaMoeFp8OneToken, cuda_moe_fp8_one_token_name, &t.moe_fp8_one_token)},
      {"moe_prefill_wgmma", flag(&t.moe_prefill_wgmma)},
      {"moe_one_token_shared", flag(&t.moe_one_token_shared)},
      {"moe_gemv", flag(&t.moe_gemv)},
      {"fused_decode_attention", flag(&t.fused_decode_attention)},
      {"decode_heads_per_block", integer(&t.decode_heads_per_block, 0)},
      {"decode_early_merge", flag(&t.decode_early_merge)},
      {"decode_attention_max_query", integer(&t.decode_attention_max_query, 1)},
      {"chunked_gated_delta", flag(&t.chunked_gated_delta)},
      {"fp8_gemm_dequant", flag(&t.fp8_gemm_dequant)},
      {"fp8_w8a8_min_rows", integer(&t.fp8_w8a8_min_rows, 0)},
      {"fp8_small_max_weights", integer(&t.fp8_small_max_weights, 0)},
      {"initial_scratch_mib", integer(&t.initial_scratch_mib, 16)},
      {"pdl", flag(&t.pdl)},
  };
}

// Calls visit(name, value) for each non-empty item of "name=value,...", failing on an item
// without '='.
template <typename F>
void for_each_item(std::string_view text, F&& visit) {
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      fail(ErrorKind::kInvalidArgument, "TESSERA_CUDA_OPTIONS: '{}' is not name=value", item);
    visit(item.substr(0, eq), item.substr(eq + 1));
  }
}

}  // namespace

void apply_cuda_options(std::string_view text, CudaOptions& o) {
  const auto table = option_table(&o);
  for_each_item(text, [&](std::string_view name, std::string_view value) {
    if (name == "arch") return;
    const auto f = std::find_if(table.begin(), table.end(), [&](const auto& e) { return name == e.first; });
    if (f == table.end()) {
      std::string known;
      for (const std::string& n : cuda_option_names()) known += (known.empty() ? "" : ", ") + n;
      fail(ErrorKind::kInvalidArgument, "TESSERA_CUDA_OPTIONS: unknown option '{}'; known: {}", name, known);
    }
    f->second("TESSERA_CUDA_OPTIONS: " + std::string(name), value);
  });
}

std::string cuda_options_profile(std::string_view text) {
  std::string profile;
  for_each_item(text, [&](std::string_view name, std::string_view value) {
    if (name == "arch") profile = std::string(value);
  });
  return profile;
}

std::vector<std::string> cuda_option_names() {
  std::vector<std::string> names = {"arch"};
  for (const auto& e : option_table(nullptr)) names.emplace_back(e.first);
  return names;
}

std::string cuda_options_from_env() {
  const char* e = std::getenv("TESSERA_CUDA_OPTIONS");
  return e ? std::string(e) : std::string();
}

}  // namespace tessera
