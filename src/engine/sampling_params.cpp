#include "engine/sampling_params.h"

#include <fmt/format.h>
#include <cmath>

namespace tessera {

Status validate_sampling_params(const SamplingParams& p, int vocab, const SamplingLimits& lim) {
  auto bad = [](std::string m) { return Status(ErrorKind::kInvalidArgument, std::move(m)); };
  if (p.n < 1 || p.n > lim.max_n) return bad(fmt::format("n must be between 1 and {}, got {}", lim.max_n, p.n));
  if (!(p.temperature >= 0 && p.temperature <= 100)) return bad("temperature must be between 0 and 100");
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p must be in (0, 1]");
  if (p.top_k < -1 || p.top_k > vocab) return bad(fmt::format("top_k must be -1, 0 or at most {}", vocab));
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p must be in [0, 1]");
  if (!(p.repetition_penalty > 0 && p.repetition_penalty <= 10)) return bad("repetition_penalty must be in (0, 10]");
  if (!(std::fabs(p.presence_penalty) <= 2)) return bad("presence_penalty must be in [-2, 2]");
  if (!(std::fabs(p.frequency_penalty) <= 2)) return bad("frequency_penalty must be in [-2, 2]");
  if (p.max_tokens < 1) return bad(fmt::format("max_tokens must be at least 1, got {}", p.max_tokens));
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) return bad("min_tokens must be between 0 and max_tokens");
  if (p.logprobs > lim.max_logprobs)
    return bad(fmt::format("logprobs must be at most {}, got {}", lim.max_logprobs, p.logprobs));
  if (static_cast<int>(p.stop.size()) > lim.max_stop) return bad(fmt::format("at most {} stop strings", lim.max_stop));
  for (const auto& s : p.stop) {
    if (s.empty()) return bad("stop strings must not be empty");
    if (static_cast<int>(s.size()) > lim.max_stop_length)
      return bad(fmt::format("stop strings must be at most {} bytes", lim.max_stop_length));
  }
  if (static_cast<int>(p.logit_bias.size()) > lim.max_logit_bias)
    return bad(fmt::format("logit_bias may hold at most {} entries", lim.max_logit_bias));
  for (const auto& [tok, b] : p.logit_bias) {
    if (tok < 0 || tok >= vocab) return bad(fmt::format("logit_bias token {} is outside the vocabulary", tok));
    if (!(b >= -100 && b <= 100)) return bad("logit_bias values must be in [-100, 100]");
  }
  for (int32_t t : p.stop_token_ids)
    if (t < 0 || t >= vocab) return bad(fmt::format("stop_token_ids entry {} is outside the vocabulary", t));
  return Status::Ok();
}

}  // namespace tessera

#include <nlohmann/json.hpp>

namespace tessera {

namespace {
template <typename T>
bool read_number(const nlohmann::json& j, const char* key, T& out, std::string& err) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_number()) {
    err = fmt::format("'{}' must be a number", key);
    return false;
  }
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) {
      err = fmt::format("'{}' must be an integer", key);
      return false;
    }
    long long v = it->get<long long>();
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
      err = fmt::format("'{}' is out of range", key);
      return false;
    }
    out = static_cast<T>(v);
  } else {
    out = it->get<T>();
  }
  return true;
}
}  // namespace

Status sampling_params_from_json(const nlohmann::json& j, SamplingParams& p) {
  auto bad = [](std::string m) { return Status(ErrorKind::kInvalidArgument, std::move(m)); };
  if (!j.is_object()) return bad("the request must be a JSON object");
  std::string err;
  int64_t max_tokens = p.max_tokens;
  bool ok = read_number(j, "max_tokens", max_tokens, err) && read_number(j, "max_completion_tokens", max_tokens, err) &&
            read_number(j, "temperature", p.temperature, err) && read_number(j, "top_p", p.top_p, err) &&
            read_number(j, "top_k", p.top_k, err) && read_number(j, "min_p", p.min_p, err) &&
            read_number(j, "presence_penalty", p.presence_penalty, err) &&
            read_number(j, "frequency_penalty", p.frequency_penalty, err) &&
            read_number(j, "repetition_penalty", p.repetition_penalty, err) && read_number(j, "n", p.n, err) &&
            read_number(j, "min_tokens", p.min_tokens, err);
  if (!ok) return bad(err);
  if (max_tokens < 1 || max_tokens > (1 << 30)) return bad("'max_tokens' must be a positive integer");
  p.max_tokens = static_cast<int>(max_tokens);
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return bad("'seed' must be an integer");
    p.seed = static_cast<uint64_t>(it->get<int64_t>());
  }
  if (auto it = j.find("ignore_eos"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("'ignore_eos' must be a boolean");
    p.ignore_eos = it->get<bool>();
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    p.stop.clear();
    if (it->is_string())
      p.stop.push_back(it->get<std::string>());
    else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return bad("'stop' must be a string or a list of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else
      return bad("'stop' must be a string or a list of strings");
  }
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return bad("'stop_token_ids' must be a list of integers");
    p.stop_token_ids.clear();
    for (const auto& s : *it) {
      if (!s.is_number_integer()) return bad("'stop_token_ids' must be a list of integers");
      p.stop_token_ids.push_back(s.get<int32_t>());
    }
  }
  if (auto it = j.find("logprobs"); it != j.end() && !it->is_null()) {
    if (it->is_boolean()) {  // chat completions: logprobs bool + top_logprobs int
      p.logprobs = it->get<bool>() ? 0 : -1;
      if (p.logprobs == 0) {
        int top = 0;
        if (!read_number(j, "top_logprobs", top, err)) return bad(err);
        p.logprobs = top;
      }
    } else if (it->is_number_integer()) {  // completions: logprobs int
      p.logprobs = it->get<int>();
      if (p.logprobs < 0) return bad("'logprobs' must be non-negative");
    } else
      return bad("'logprobs' must be a boolean or an integer");
  }
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return bad("'logit_bias' must be an object mapping token ids to biases");
    p.logit_bias.clear();
    for (auto& [k, v] : it->items()) {
      char* end = nullptr;
      long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end || !v.is_number()) return bad("'logit_bias' must map token ids to numbers");
      p.logit_bias.emplace_back(static_cast<int32_t>(id), v.get<float>());
    }
  }
  return Status::Ok();
}

}  // namespace tessera
