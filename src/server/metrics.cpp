#include "server/metrics.h"

#include <fmt/format.h>

#include "engine/async_engine.h"

namespace tessera::server {

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::format(std::string& out, const std::string& name, const std::string& labels) const {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cum);
  out += fmt::format("{}_count{{{}}} {}\n{}_sum{{{}}} {}\n", name, labels, count_, name, labels, sum_);
}

namespace {
std::string escape_label(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}
const char* kReasons[4] = {"stop", "length", "abort", "error"};
}  // namespace

// vLLM's bucket boundaries.
Metrics::Metrics(std::string model_name)
    : labels_("model_name=\"" + escape_label(model_name) + "\""),
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      tpot_(
          {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void Metrics::request_finished(const std::string& reason, double e2e, double ttft, int completion_tokens) {
  for (int i = 0; i < 4; ++i)
    if (reason == kReasons[i]) finished_[i]++;
  e2e_.observe(e2e);
  if (ttft > 0) ttft_.observe(ttft);
  if (completion_tokens > 1 && ttft > 0) tpot_.observe((e2e - ttft) / (completion_tokens - 1));
}

std::string Metrics::render(const AsyncEngineStats& s) const {
  std::string o;
  auto gauge = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP tessera:{} {}\n# TYPE tessera:{} gauge\ntessera:{}{{{}}} {}\n", name, help, name, name,
                     labels_, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP tessera:{} {}\n# TYPE tessera:{} counter\ntessera:{}{{{}}} {}\n", name, help, name, name,
                     labels_, v);
  };
  gauge("num_requests_running", "Number of requests in model execution batches.",
        static_cast<double>(s.engine.num_running));
  gauge("num_requests_waiting", "Number of requests waiting to be processed.",
        static_cast<double>(s.engine.num_waiting + s.num_pending));
  gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.engine.kv_cache_usage);
  gauge("engine_alive", "1 while the engine runs, 0 after a fatal error.", s.alive ? 1 : 0);
  counter("prompt_tokens_total", "Number of prefill tokens processed.", static_cast<double>(s.engine.prompt_tokens));
  counter("generation_tokens_total", "Number of generation tokens processed.",
          static_cast<double>(s.engine.generation_tokens));
  counter("prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache.",
          static_cast<double>(s.engine.prefix_cache_hit_tokens));
  counter("num_preemptions_total", "Cumulative number of preemptions from the engine.",
          static_cast<double>(s.engine.num_preemptions));
  if (s.engine.num_speculative_tokens > 0) {  // vLLM's spec_decode_* counters
    const SpecDecodeStats& sd = s.engine.spec;
    counter("spec_decode_num_drafts_total", "Number of spec decoding drafts (sequences with drafts verified).",
            static_cast<double>(sd.num_drafts));
    counter("spec_decode_num_draft_tokens_total", "Number of draft tokens.", static_cast<double>(sd.num_draft_tokens));
    counter("spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
            static_cast<double>(sd.num_accepted_tokens));
    o += "# HELP tessera:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.\n"
         "# TYPE tessera:spec_decode_num_accepted_tokens_per_pos_total counter\n";
    for (int i = 0; i < s.engine.num_speculative_tokens; ++i)
      o += fmt::format("tessera:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", labels_, i,
                       i < static_cast<int>(sd.accepted_per_pos.size()) ? sd.accepted_per_pos[i] : 0);
  }
  o += "# HELP tessera:request_success_total Count of successfully processed requests.\n"
       "# TYPE tessera:request_success_total counter\n";
  for (int i = 0; i < 4; ++i)
    o += fmt::format("tessera:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels_, kReasons[i],
                     finished_[i].load());
  counter("num_requests_aborted_total", "Requests aborted (client disconnect, drain timeout).",
          static_cast<double>(finished_[2].load()));
  counter("num_requests_rejected_total", "Requests refused before reaching the engine because of overload or drain.",
          static_cast<double>(rejected_.load()));
  o += "# HELP tessera:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
       "# TYPE tessera:time_to_first_token_seconds histogram\n";
  ttft_.format(o, "tessera:time_to_first_token_seconds", labels_);
  o += "# HELP tessera:time_per_output_token_seconds Histogram of time per output token in seconds.\n"
       "# TYPE tessera:time_per_output_token_seconds histogram\n";
  tpot_.format(o, "tessera:time_per_output_token_seconds", labels_);
  o += "# HELP tessera:e2e_request_latency_seconds Histogram of end to end request latency in seconds.\n"
       "# TYPE tessera:e2e_request_latency_seconds histogram\n";
  e2e_.format(o, "tessera:e2e_request_latency_seconds", labels_);
  return o;
}

}  // namespace tessera::server
