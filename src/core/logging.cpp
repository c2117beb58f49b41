#include "core/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace tessera {

namespace {
// %L prints the level as vLLM does: DEBUG, INFO, WARNING, ERROR, CRITICAL.
class VllmLevelFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", ""};
    const char* name = kNames[static_cast<int>(msg.level)];
    dest.append(name, name + std::char_traits<char>::length(name));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<VllmLevelFlag>(); }
};
}  // namespace

void init_logging(const char* level) {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("tessera");
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<VllmLevelFlag>('*').set_pattern("%^%*%$ %m-%d %H:%M:%S [%s:%#] %v");
    logger->set_formatter(std::move(formatter));
    spdlog::set_default_logger(logger);
  });
  const char* lv = level ? level : std::getenv("TESSERA_LOG_LEVEL");
  spdlog::set_level(lv ? spdlog::level::from_str(lv) : spdlog::level::info);
  spdlog::flush_on(spdlog::level::info);
}

}  // namespace tessera
