#include "server/metrics.h"

#include <fmt/format.h>

#include "engine/async_engine.h"

namespace tessera::server {

namespace {

// One histogram's series from per-bucket counts (not cumulative; the last past the largest bound).
template <typename Bounds, typename Counts>
void format_histogram(std::string& out, const std::string& name, const std::string& labels, const Bounds& bounds,
                      const Counts& counts, double sum) {
  uint64_t cum = 0;
  size_t i = 0;
  for (const auto& bound : bounds) {
    cum += counts[i++];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, static_cast<double>(bound), cum);
  }
  cum += counts[i];
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cum);
  out += fmt::format("{}_count{{{}}} {}\n{}_sum{{{}}} {}\n", name, labels, cum, name, labels, sum);
}

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

void family(std::string& o, const std::string& name, const char* type, const char* help) {
  o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// vLLM's bucket bounds (vllm/v1/metrics/loggers.py).
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTokenLatencyBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                                  0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestLatencyBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                                    5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace

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
  format_histogram(out, name, labels, bounds_, counts_, sum_);
}

std::vector<double> one_two_five_buckets(int max) {
  std::vector<double> b;
  for (double scale = 1;; scale *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale > std::max(max, 1)) return b;
      b.push_back(m * scale);
    }
}

Metrics::Metrics(std::string model_name, int max_model_len)
    : labels_("model_name=\"" + escape_label(model_name) + "\""),
      ttft_(kTtftBuckets),
      tpot_(kTokenLatencyBuckets),
      itl_(kTokenLatencyBuckets),
      e2e_(kRequestLatencyBuckets),
      queue_(kRequestLatencyBuckets),
      prefill_(kRequestLatencyBuckets),
      decode_(kRequestLatencyBuckets),
      inference_(kRequestLatencyBuckets),
      prompt_tokens_(one_two_five_buckets(max_model_len > 0 ? max_model_len : 1 << 20)),
      generation_tokens_(one_two_five_buckets(max_model_len > 0 ? max_model_len : 1 << 20)),
      max_generation_tokens_(one_two_five_buckets(max_model_len > 0 ? max_model_len : 1 << 20)),
      max_tokens_(one_two_five_buckets(max_model_len > 0 ? max_model_len : 1 << 20)),
      n_({1, 2, 5, 10, 20}) {}

void Metrics::request_finished(const FinishedRequest& r) {
  for (int i = 0; i < 4; ++i)
    if (r.finish_reason == kReasons[i]) finished_[i]++;
  e2e_.observe(r.e2e);
  if (r.ttft > 0) ttft_.observe(r.ttft);
  if (r.generation_tokens > 1 && r.ttft > 0) tpot_.observe((r.e2e - r.ttft) / (r.generation_tokens - 1));
  if (r.queue >= 0) queue_.observe(r.queue);
  if (r.prefill >= 0) prefill_.observe(r.prefill);
  if (r.decode >= 0) decode_.observe(r.decode);
  if (r.inference >= 0) inference_.observe(r.inference);
  prompt_tokens_.observe(r.prompt_tokens);
  generation_tokens_.observe(r.generation_tokens);
  max_generation_tokens_.observe(r.max_generation_tokens);
  max_tokens_.observe(r.max_tokens);
  n_.observe(r.n);
}

void Metrics::render_engine(std::string& o, const AsyncEngineStats& s) const {
  struct Series {
    const char* name;
    const char* type;
    const char* help;
    double value;
  };
  const EngineStats& e = s.engine;
  const SpecDecodeStats& sd = e.spec;  // zero while speculative decoding is off
  auto n = [](uint64_t v) { return static_cast<double>(v); };
  const Series series[] = {
      {"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", n(e.num_running)},
      {"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
       n(e.num_waiting + s.num_pending)},
      {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", e.kv_cache_usage},
      {"vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage (kv_cache_usage_perc).",
       e.kv_cache_usage},
      // vLLM V0's series, still on its example dashboard: tessera never swaps (preempted requests are
      // recomputed) and keeps no KV cache in CPU memory, so both are 0.
      {"vllm:num_requests_swapped", "gauge", "Number of requests swapped to CPU (always 0: preemption recomputes).",
       0.0},
      {"vllm:cpu_cache_usage_perc", "gauge", "CPU KV-cache usage (always 0: there is no CPU KV cache).", 0.0},
      {"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", n(e.prompt_tokens)},
      {"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", n(e.generation_tokens)},
      {"vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
       n(e.prefix_cache_queries)},
      {"vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
       n(e.prefix_cache_hit_tokens)},
      {"vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.",
       n(e.num_preemptions)},
      {"vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", n(sd.num_drafts)},
      {"vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", n(sd.num_draft_tokens)},
      {"vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
       n(sd.num_accepted_tokens)},
      {"tessera:engine_alive", "gauge", "1 while the engine runs, 0 after a fatal error.", s.alive ? 1.0 : 0.0},
  };
  for (const Series& x : series) {
    family(o, x.name, x.type, x.help);
    o += fmt::format("{}{{{}}} {}\n", x.name, labels_, x.value);
  }
  family(o, "vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.");
  format_histogram(o, "vllm:iteration_tokens_total", labels_, kIterationTokensBuckets, e.iteration_tokens,
                   n(e.iteration_tokens_sum));
  if (e.num_speculative_tokens > 0) {
    family(o, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
    for (int i = 0; i < e.num_speculative_tokens; ++i)
      o += fmt::format("vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", labels_, i,
                       i < static_cast<int>(sd.accepted_per_pos.size()) ? sd.accepted_per_pos[i] : 0);
  }
}

void Metrics::render_requests(std::string& o) const {
  family(o, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (int i = 0; i < 4; ++i)
    o += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels_, kReasons[i],
                     finished_[i].load());
  const std::pair<const Histogram*, std::pair<const char*, const char*>> histograms[] = {
      {&ttft_, {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."}},
      {&tpot_, {"vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."}},
      {&itl_, {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."}},
      {&e2e_, {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."}},
      {&queue_, {"vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."}},
      {&prefill_, {"vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."}},
      {&decode_, {"vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."}},
      {&inference_, {"vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."}},
      {&prompt_tokens_, {"vllm:request_prompt_tokens", "Number of prefill tokens processed."}},
      {&generation_tokens_, {"vllm:request_generation_tokens", "Number of generation tokens processed."}},
      {&max_generation_tokens_,
       {"vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens."}},
      {&max_tokens_, {"vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter."}},
      {&n_, {"vllm:request_params_n", "Histogram of the n request parameter."}},
  };
  for (const auto& [h, names] : histograms) {
    family(o, names.first, "histogram", names.second);
    h->format(o, names.first, labels_);
  }
  family(o, "tessera:num_requests_aborted_total", "counter", "Requests aborted (client disconnect, drain timeout).");
  o += fmt::format("tessera:num_requests_aborted_total{{{}}} {}\n", labels_, finished_[2].load());
  family(o, "tessera:num_requests_rejected_total", "counter",
         "Requests refused before reaching the engine because of overload or drain.");
  o += fmt::format("tessera:num_requests_rejected_total{{{}}} {}\n", labels_, rejected_.load());
}

std::string Metrics::render(const AsyncEngineStats& s) const {
  std::string o;
  render_engine(o, s);
  render_requests(o);
  return o;
}

}  // namespace tessera::server
