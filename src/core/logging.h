// vLLM-style log lines: "INFO 11-29 15:01:03 [loader.cpp:42] message".
#pragma once
#include <spdlog/spdlog.h>

namespace tessera {
// Sets the pattern and level once per process. `level` is "debug", "info", "warning", "error".
void init_logging(const char* level = nullptr);
}  // namespace tessera

#define TLOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define TLOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define TLOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define TLOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
