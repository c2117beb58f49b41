// The architecture table and the records made from it (cuda_arch.h). No CUDA calls here:
// cuda_facts.cpp reads the device's facts, cuda_arch_read.cpp makes the record.
#include "backend/cuda/cuda_arch.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>

#include "core/error.h"

namespace tessera {

namespace {

constexpr size_t kNoCap = std::numeric_limits<size_t>::max();

// Rows without wgmma: the bf16 MoE prefill on mma.sync. sm_120 / sm_121 (RTX 50xx, RTX PRO
// Blackwell, DGX Spark GB10) have 99 KiB of shared memory per block and 1,536 threads per SM, and
// cuBLASLt's 128x128 block-scaled FP8 GEMM is documented for sm_90 only, so FP8 linears take our
// mma.sync e4m3 kernel there. Their other option defaults are the sm_90 row's: nothing measured
// on those parts says otherwise yet.
void tune_without_wgmma(CudaOptions& o) { o.moe_prefill_wgmma = false; }

// sm_120 / sm_121 keep the sm_90 row's FP8 one-token expert GEMV at 10 blocks an SM (`kFine10`),
// although ptxas gives each thread 48 registers there and spills 32-36 bytes
// (scripts/ptxas_report.sh): with `kFineWide` (8 blocks an SM, no spill) cuda_ops_test's
// Fp8MoeSharedExpertAtOneToken failed under the sm_120 profile in two runs of two on an H100
// (docs/performance.md, 2026-12-07), and passed with `kFine10`. A spill costs speed; that failure
// is a wrong result until it is understood.
void tune_blackwell_desktop(CudaOptions& o) { tune_without_wgmma(o); }

// The rows. kOther keeps the device's own limits and only the paths every sm_80+ GPU has.
const std::vector<CudaArchRow> kTable = {
    {CudaArchFamily::kSm90, "sm90", 9, 0, 232448, 2048, true, true, true, true, nullptr},
    {CudaArchFamily::kSm100, "sm100", 10, 0, 232448, 2048, false, false, true, true, tune_without_wgmma},
    {CudaArchFamily::kSm120, "sm120", 12, 0, 101376, 1536, false, false, true, true, tune_blackwell_desktop},
    {CudaArchFamily::kSm121, "sm121", 12, 1, 101376, 1536, false, false, true, true, tune_blackwell_desktop},
    {CudaArchFamily::kOther, "other", 0, 0, kNoCap, std::numeric_limits<int>::max(), false, false, false, false,
     tune_without_wgmma},
};

// mma.sync e4m3 and griddepcontrol exist from these compute capabilities on.
bool has_fp8_mma(int major, int minor) { return major > 8 || (major == 8 && minor >= 9); }
bool has_pdl(int major) { return major >= 9; }

CudaArch from_row(const CudaDeviceFacts& f, const CudaArchRow& row, const CudaArchRow& own) {
  CudaArch a;
  a.name = f.name;
  a.major = f.major;
  a.minor = f.minor;
  a.family = row.family;
  a.sms = f.sms;
  a.smem_per_block_optin = std::min(f.smem_per_block_optin, row.smem_per_block_cap);
  a.smem_per_sm = f.smem_per_sm;
  a.max_threads_per_sm = std::min(f.max_threads_per_sm, row.max_threads_per_sm_cap);
  a.total_memory = f.total_memory;
  a.integrated = f.integrated;
  // A capability needs both the row (the choice) and the device's own row (the hardware).
  a.wgmma = row.wgmma && own.wgmma;
  a.cublaslt_block_fp8 = row.cublaslt_block_fp8 && own.cublaslt_block_fp8;
  a.fp8_mma = (row.family == CudaArchFamily::kOther || row.fp8_mma) && has_fp8_mma(f.major, f.minor);
  a.pdl = (row.family == CudaArchFamily::kOther || row.pdl) && has_pdl(f.major);
  return a;
}

}  // namespace

const char* cuda_arch_family_name(CudaArchFamily f) {
  switch (f) {
    case CudaArchFamily::kSm90:
      return "sm_90";
    case CudaArchFamily::kSm100:
      return "sm_100";
    case CudaArchFamily::kSm120:
      return "sm_120";
    case CudaArchFamily::kSm121:
      return "sm_121";
    case CudaArchFamily::kOther:
      return "other";
  }
  return "?";
}

CudaArchFamily cuda_arch_family(int major, int minor) {
  if (major == 9 && minor == 0) return CudaArchFamily::kSm90;
  if (major == 10) return CudaArchFamily::kSm100;
  if (major == 12 && minor == 0) return CudaArchFamily::kSm120;
  if (major == 12 && minor == 1) return CudaArchFamily::kSm121;
  return CudaArchFamily::kOther;
}

const std::vector<CudaArchRow>& cuda_arch_table() { return kTable; }

const CudaArchRow& cuda_arch_row(CudaArchFamily f) {
  for (const CudaArchRow& r : kTable)
    if (r.family == f) return r;
  return kTable.back();
}

CudaArch make_cuda_arch(const CudaDeviceFacts& facts) {
  const CudaArchRow& own = cuda_arch_row(cuda_arch_family(facts.major, facts.minor));
  return from_row(facts, own, own);
}

CudaArch profile_cuda_arch(const CudaDeviceFacts& facts, std::string_view profile) {
  if (profile.empty() || profile == "native") return make_cuda_arch(facts);
  const auto row = std::find_if(kTable.begin(), kTable.end(), [&](const CudaArchRow& r) {
    return r.family != CudaArchFamily::kOther && profile == r.profile_name;
  });
  if (row == kTable.end()) {
    std::string known = "native";
    for (const CudaArchRow& r : kTable)
      if (r.family != CudaArchFamily::kOther) known += std::string(", ") + r.profile_name;
    fail(ErrorKind::kInvalidArgument, "TESSERA_CUDA_OPTIONS: arch={} names no architecture profile; use one of: {}",
         profile, known);
  }
  const CudaArchRow& own = cuda_arch_row(cuda_arch_family(facts.major, facts.minor));
  CudaArch a = from_row(facts, *row, own);
  a.profile = row->profile_name;
  a.name = fmt::format("{} as {}", facts.name, cuda_arch_family_name(row->family));
  return a;
}

CudaOptions tuned_cuda_options(const CudaArch& arch) {
  CudaOptions o;
  const CudaArchRow& row = cuda_arch_row(arch.family);
  if (row.tune) row.tune(o);
  return o;
}

std::string describe_cuda_arch(const CudaArch& a) {
  std::string caps;
  auto add = [&](bool on, const char* what) {
    if (on) caps += std::string(caps.empty() ? "" : ", ") + what;
  };
  add(a.wgmma, "wgmma");
  add(a.cublaslt_block_fp8, "cuBLASLt block FP8");
  add(a.fp8_mma, "FP8 mma.sync");
  add(a.pdl, "PDL");
  add(a.integrated, "integrated (unified memory)");
  return fmt::format("{}: compute capability {}.{}, {} row, {} SMs, {} KiB shared memory a block, {} threads an SM{}{}",
                     a.name, a.major, a.minor, cuda_arch_family_name(a.family), a.sms, a.smem_per_block_optin / 1024,
                     a.max_threads_per_sm, caps.empty() ? "" : "; ", caps);
}

namespace {

// One entry of a CUDA_ARCHITECTURES list: "90a-real" -> {90, 'a', cubin}, "120-virtual" -> PTX,
// "90a" / "120" -> both.
struct ArchEntry {
  int sm = 0;
  bool specific = false;  // the "a" suffix: runs on exactly that compute capability
  bool cubin = false, ptx = false;
};

bool parse_entry(std::string_view e, ArchEntry* out) {
  ArchEntry a;
  const char* p = e.data();
  const auto [end, ec] = std::from_chars(p, p + e.size(), a.sm);
  if (ec != std::errc() || a.sm <= 0) return false;
  std::string_view rest = e.substr(static_cast<size_t>(end - p));
  if (!rest.empty() && (rest[0] == 'a' || rest[0] == 'f')) {
    a.specific = true;
    rest.remove_prefix(1);
  }
  a.cubin = rest.empty() || rest == "-real";
  a.ptx = rest.empty() || rest == "-virtual";
  if (!a.cubin && !a.ptx) return false;
  *out = a;
  return true;
}

std::vector<ArchEntry> parse_archs(std::string_view archs) {
  std::vector<ArchEntry> out;
  while (!archs.empty()) {
    const size_t sep = archs.find_first_of(";, ");
    const std::string_view e = archs.substr(0, sep);
    archs = sep == std::string_view::npos ? std::string_view() : archs.substr(sep + 1);
    ArchEntry a;
    if (!e.empty() && parse_entry(e, &a)) out.push_back(a);
  }
  return out;
}

std::string sm_name(const ArchEntry& a) { return fmt::format("{}", a.sm) + (a.specific ? "a" : ""); }

}  // namespace

CudaBinaryMatch cuda_binary_support(std::string_view archs, int major, int minor) {
  const int sm = major * 10 + minor;
  const std::vector<ArchEntry> entries = parse_archs(archs);
  // A cubin runs on its own compute capability ("a" code only there; plain code also on later
  // minor versions of the same major).
  for (const ArchEntry& a : entries)
    if (a.cubin && (a.sm == sm || (!a.specific && a.sm / 10 == major && a.sm % 10 <= minor)))
      return {CudaBinarySupport::kNative, "sm_" + sm_name(a) + " cubin", a.specific};
  // PTX compiles for its compute capability and any later one; the newest that fits is used.
  const ArchEntry* best = nullptr;
  for (const ArchEntry& a : entries)
    if (a.ptx && !a.specific && a.sm <= sm && (!best || a.sm > best->sm)) best = &a;
  if (best)
    return {CudaBinarySupport::kJit,
            fmt::format("compute_{} PTX, compiled by the driver at first start (a few minutes, then cached)", best->sm),
            false};
  return {CudaBinarySupport::kNone, "", false};
}

std::string_view cuda_built_architectures() {
#ifdef TESSERA_CUDA_ARCHITECTURES
  return TESSERA_CUDA_ARCHITECTURES;
#else
  return "";
#endif
}

std::string describe_cuda_architectures(std::string_view archs) {
  std::string cubins, ptx;
  for (const ArchEntry& a : parse_archs(archs)) {
    if (a.cubin) cubins += (cubins.empty() ? "sm_" : ", sm_") + sm_name(a);
    if (a.ptx) ptx += (ptx.empty() ? "compute_" : ", compute_") + sm_name(a);
  }
  if (cubins.empty() && ptx.empty()) return "no CUDA code";
  std::string s = cubins.empty() ? "" : cubins + " cubins";
  if (!ptx.empty()) s += (s.empty() ? "" : "; ") + ptx + " PTX";
  return s;
}

}  // namespace tessera
