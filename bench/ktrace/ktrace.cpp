// Kernel tracer for machines without Nsight Systems: a CUDA injection library. With
//   CUDA_INJECTION64_PATH=/path/libtessera_ktrace.so TESSERA_KTRACE=/tmp/k.csv <any CUDA program>
// the driver loads it at cuInit and calls InitializeInjection(); it records every kernel
// the program runs (each node of a CUDA graph on its own) through the CUPTI activity API
// and writes one CSV line per kernel at exit:
//   start_ns,end_ns,graph_id,grid,block,regs,local_bytes_per_thread,name
// bench/ktrace/ktrace_report.py turns that into a per-kernel summary and one decode step.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

FILE* g_out = nullptr;
std::mutex g_mu;
constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

std::string demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  for (char& c : s)
    if (c == ',' || c == '\n') c = ';';
  return s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (g_out)
      std::fprintf(g_out, "%llu,%llu,%u,%d,%d,%u,%u,%s\n", static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->graphId, k->gridX * k->gridY * k->gridZ,
                   k->blockX * k->blockY * k->blockZ, k->registersPerThread, k->localMemoryPerThread,
                   demangle(k->name).c_str());
  }
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  const char* path = std::getenv("TESSERA_KTRACE");
  g_out = std::fopen(path && *path ? path : "ktrace.csv", "w");
  if (!g_out) return 0;
  std::fprintf(g_out, "start_ns,end_ns,graph_id,grid,block,regs,local_bytes,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "ktrace: CUPTI activity tracing could not be enabled\n");
    return 0;
  }
  std::atexit(finish);
  return 1;
}
