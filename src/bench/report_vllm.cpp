#include "bench/report_vllm.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <numeric>

#include "bench/stats.h"
#include "core/error.h"

namespace tessera::bench {

namespace {

using ojson = nlohmann::ordered_json;

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, comma - at);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.push_back(item);
    at = comma + 1;
  }
  return out;
}

struct Sample {
  std::vector<double> values_ms;
  double mean() const {
    return values_ms.empty() ? 0 : std::accumulate(values_ms.begin(), values_ms.end(), 0.0) / values_ms.size();
  }
  double std_dev() const {  // numpy.std: the population standard deviation
    if (values_ms.empty()) return 0;
    const double m = mean();
    double sq = 0;
    for (double v : values_ms) sq += (v - m) * (v - m);
    return std::sqrt(sq / values_ms.size());
  }
  double percentile(double q) const {
    std::vector<double> sorted = values_ms;
    std::sort(sorted.begin(), sorted.end());
    return percentile_of_sorted(sorted, q);
  }
};

// "99" for 99.0, "99.9" for 99.9: vLLM's p{word}_{metric}_ms keys.
std::string percentile_word(double p) {
  return static_cast<double>(static_cast<int>(p)) == p ? std::to_string(static_cast<int>(p)) : fmt::format("{}", p);
}

// The records in request order (the workload's), as vLLM lists them.
std::vector<const RequestRecord*> in_request_order(const LevelResult& result) {
  std::vector<const RequestRecord*> out;
  for (const RequestRecord& r : result.records) out.push_back(&r);
  std::stable_sort(out.begin(), out.end(),
                   [](const RequestRecord* a, const RequestRecord* b) { return a->start_s < b->start_s; });
  return out;
}

// vLLM's peak: the most output tokens that arrived in one whole second of the run (each chunk of a request
// carries its share of the request's tokens).
double peak_output_tokens_per_second(const std::vector<const RequestRecord*>& records) {
  std::map<long long, double> per_second;
  for (const RequestRecord* r : records) {
    if (!r->success || r->ttft_s < 0) continue;
    const size_t chunks = r->itl_s.size() + 1;
    const double share = static_cast<double>(r->completion_tokens) / static_cast<double>(chunks);
    double t = r->start_s + r->ttft_s;
    per_second[static_cast<long long>(std::floor(t))] += share;
    for (double gap : r->itl_s) {
      t += gap;
      per_second[static_cast<long long>(std::floor(t))] += share;
    }
  }
  double peak = 0;
  for (const auto& [second, tokens] : per_second) peak = std::max(peak, tokens);
  return peak;
}

void add_detail_lists(ojson& j, const std::vector<const RequestRecord*>& records) {
  ojson input_lens = ojson::array(), output_lens = ojson::array(), ttfts = ojson::array(), itls = ojson::array(),
        latencies = ojson::array(), start_times = ojson::array(), texts = ojson::array(), errors = ojson::array();
  for (const RequestRecord* r : records) {
    input_lens.push_back(r->prompt_tokens);
    output_lens.push_back(r->success ? r->completion_tokens : 0);
    ttfts.push_back(r->ttft_s >= 0 ? r->ttft_s : 0.0);
    itls.push_back(r->itl_s);
    latencies.push_back(r->latency_s);
    start_times.push_back(r->start_s);
    texts.push_back(r->output_text);
    errors.push_back(r->success ? std::string() : r->failure_kind + ": " + r->failure_message);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["latencies"] = std::move(latencies);
  j["start_times"] = std::move(start_times);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
}

// datetime.isoformat() of a local wall-clock time: 2026-01-02T03:04:05.123456 (no fraction when it is 0).
std::string iso_local(std::chrono::system_clock::time_point at) {
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(at.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm tm{};
  localtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  const long long fraction = micros % 1000000;
  return fraction ? fmt::format("{}.{:06d}", text, fraction) : std::string(text);
}

}  // namespace

ojson rps_change_events(const LevelResult& result) {
  const ArrivalProcess& arrivals = result.config.arrivals;
  ojson events = ojson::array();
  if (arrivals.ramp == RampUp::kNone) return events;
  int last = arrivals.ramp_start_rps;
  events.push_back({{"rps", last}, {"timestamp", iso_local(result.wall_started_at)}});
  const size_t n = result.release_times.size();
  for (size_t i = 0; i < n; ++i) {
    const int rate = static_cast<int>(rate_at(arrivals, i, n));
    if (rate <= last) continue;
    const auto due = result.wall_started_at + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                  std::chrono::duration<double>(result.release_times[i]));
    for (int r = last + 1; r <= rate; ++r) events.push_back({{"rps", r}, {"timestamp", iso_local(due)}});
    last = rate;
  }
  return events;
}

std::string python_float(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::vector<std::string> parse_percentile_metrics(const std::string& text) {
  std::vector<std::string> out = split_commas(text);
  for (const std::string& m : out)
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el")
      fail(ErrorKind::kInvalidArgument, "--percentile-metrics: '{}' is not one of ttft, tpot, itl, e2el", m);
  return out;
}

std::vector<double> parse_metric_percentiles(const std::string& text) {
  std::vector<double> out;
  for (const std::string& item : split_commas(text)) {
    size_t used = 0;
    double p = -1;
    try {
      p = std::stod(item, &used);
    } catch (const std::exception&) {
    }
    if (used != item.size() || !(p > 0 && p <= 100))
      fail(ErrorKind::kInvalidArgument, "--metric-percentiles: '{}' is not a percentile in (0, 100]", item);
    out.push_back(p);
  }
  return out;
}

ojson vllm_result_json(const LevelResult& result, const LevelMetrics& m, const VllmResultSettings& s) {
  const std::vector<const RequestRecord*> records = in_request_order(result);
  ojson j;
  j["date"] = s.date;
  j["endpoint_type"] = s.backend;
  j["backend"] = s.backend;
  j["label"] = s.label.empty() ? ojson(nullptr) : ojson(s.label);
  j["model_id"] = s.model_id;
  j["tokenizer_id"] = s.tokenizer_id;
  j["num_prompts"] = s.num_prompts;
  for (const std::string& item : s.metadata) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) fail(ErrorKind::kInvalidArgument, "--metadata '{}': expected KEY=VALUE", item);
    j[item.substr(0, eq)] = item.substr(eq + 1);
  }
  j["request_rate"] = std::isinf(s.request_rate) ? ojson("inf") : ojson(s.request_rate);
  j["burstiness"] = s.burstiness;
  j["max_concurrency"] = s.max_concurrency ? ojson(*s.max_concurrency) : ojson(nullptr);
  if (s.arrivals.ramp != RampUp::kNone) {
    j["ramp_up_strategy"] = ramp_up_name(s.arrivals.ramp);
    j["ramp_up_start_rps"] = s.arrivals.ramp_start_rps;
    j["ramp_up_end_rps"] = s.arrivals.ramp_end_rps;
  }
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.prompt_tokens;
  j["total_output_tokens"] = m.completion_tokens;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = s.goodput ? ojson(m.goodput) : ojson(nullptr);
  j["output_throughput"] = m.completion_token_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  add_detail_lists(j, records);
  j["max_output_tokens_per_s"] = peak_output_tokens_per_second(records);
  j["max_concurrent_requests"] = m.max_in_flight;
  j["rtfx"] = 0.0;  // vLLM's speech-recognition figure; 0 for text
  if (result.config.arrivals.ramp != RampUp::kNone) j["rps_change_events"] = rps_change_events(result);
  Sample ttft, tpot, itl, e2el;
  for (const RequestRecord* r : records) {
    if (!r->success) continue;
    if (r->ttft_s >= 0) ttft.values_ms.push_back(r->ttft_s * 1000);
    if (r->completion_tokens > 1 && r->ttft_s >= 0)
      tpot.values_ms.push_back((r->latency_s - r->ttft_s) * 1000 / (r->completion_tokens - 1));
    for (double gap : r->itl_s) itl.values_ms.push_back(gap * 1000);
    e2el.values_ms.push_back(r->latency_s * 1000);
  }
  const std::pair<const char*, const Sample*> samples[] = {
      {"ttft", &ttft}, {"tpot", &tpot}, {"itl", &itl}, {"e2el", &e2el}};
  for (const auto& [name, sample] : samples) {
    if (std::find(s.metrics.begin(), s.metrics.end(), name) == s.metrics.end()) continue;
    j[fmt::format("mean_{}_ms", name)] = sample->mean();
    j[fmt::format("median_{}_ms", name)] = sample->percentile(50);
    j[fmt::format("std_{}_ms", name)] = sample->std_dev();
    for (double p : s.percentiles) j[fmt::format("p{}_{}_ms", percentile_word(p), name)] = sample->percentile(p);
  }
  if (!s.detailed)
    for (const char* key : {"input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"})
      j.erase(key);
  return j;
}

std::string vllm_result_block(const ojson& j, const VllmResultSettings& s) {
  auto row = [](const std::string& name, const std::string& value) {
    return fmt::format("{:<40} {:<10}\n", name, value);
  };
  auto num = [](const ojson& v) { return fmt::format("{:.2f}", v.get<double>()); };
  std::string o = fmt::format("{:=^50}\n", " Serving Benchmark Result ");
  o += row("Successful requests:", std::to_string(j["completed"].get<size_t>()));
  o += row("Failed requests:", std::to_string(j["failed"].get<size_t>()));
  if (s.max_concurrency) o += row("Maximum request concurrency:", std::to_string(*s.max_concurrency));
  if (!std::isinf(s.request_rate)) o += row("Request rate configured (RPS):", fmt::format("{:.2f}", s.request_rate));
  o += row("Benchmark duration (s):", num(j["duration"]));
  o += row("Total input tokens:", std::to_string(j["total_input_tokens"].get<long long>()));
  o += row("Total generated tokens:", std::to_string(j["total_output_tokens"].get<long long>()));
  o += row("Request throughput (req/s):", num(j["request_throughput"]));
  if (s.goodput) o += row("Request goodput (req/s):", num(j["request_goodput"]));
  o += row("Output token throughput (tok/s):", num(j["output_throughput"]));
  o += row("Peak output token throughput (tok/s):", num(j["max_output_tokens_per_s"]));
  o += row("Peak concurrent requests:", fmt::format("{:.2f}", j["max_concurrent_requests"].get<double>()));
  o += row("Total token throughput (tok/s):", num(j["total_token_throughput"]));
  const std::tuple<const char*, const char*, const char*> metrics[] = {
      {"ttft", "TTFT", "Time to First Token"},
      {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
      {"itl", "ITL", "Inter-token Latency"},
      {"e2el", "E2EL", "End-to-end Latency"}};
  for (const auto& [key, name, header] : metrics) {
    if (!j.contains(fmt::format("mean_{}_ms", key))) continue;
    o += fmt::format("{:-^50}\n", header);
    o += row(fmt::format("Mean {} (ms):", name), num(j[fmt::format("mean_{}_ms", key)]));
    o += row(fmt::format("Median {} (ms):", name), num(j[fmt::format("median_{}_ms", key)]));
    for (double p : s.percentiles)
      o += row(fmt::format("P{} {} (ms):", percentile_word(p), name),
               num(j[fmt::format("p{}_{}_ms", percentile_word(p), key)]));
  }
  o += std::string(50, '=') + "\n";
  return o;
}

std::string vllm_result_filename(const VllmResultSettings& s) {
  std::string base = s.model_id;
  if (const size_t slash = base.find_last_of('/'); slash != std::string::npos) base = base.substr(slash + 1);
  const std::string rate = s.arrivals.ramp == RampUp::kNone
                               ? python_float(s.request_rate) + "qps"
                               : fmt::format("ramp-up-{}-{}qps-{}qps", ramp_up_name(s.arrivals.ramp),
                                             s.arrivals.ramp_start_rps, s.arrivals.ramp_end_rps);
  return fmt::format("{}-{}{}-{}-{}.json", s.label.empty() ? s.backend : s.label, rate,
                     s.max_concurrency ? fmt::format("-concurrency{}", *s.max_concurrency) : "", base, s.date);
}

}  // namespace tessera::bench
