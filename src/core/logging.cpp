#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace tessera {

void init_logging(const char* level) {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("tessera");
    spdlog::set_default_logger(logger);
    // Level names as vLLM prints them: INFO, WARNING, ERROR, DEBUG.
    spdlog::set_pattern("%^%l%$ %m-%d %H:%M:%S [%s:%#] %v");
  });
  const char* lv = level ? level : std::getenv("TESSERA_LOG_LEVEL");
  spdlog::set_level(lv ? spdlog::level::from_str(lv) : spdlog::level::info);
  spdlog::flush_on(spdlog::level::info);
}

}  // namespace tessera
