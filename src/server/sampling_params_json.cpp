#include "server/sampling_params_json.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <limits>

namespace tessera::server {

namespace {
// A JSON integer as int64, refusing (not wrapping) unsigned values above INT64_MAX.
bool json_int64(const nlohmann::json& v, int64_t& out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  out = v.get<int64_t>();
  return true;
}

template <typename T>
bool read_number(const nlohmann::json& j, const char* key, T& out, std::string& err) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_number()) {
    err = fmt::format("'{}' must be a number", key);
    return false;
  }
  if constexpr (std::is_integral_v<T>) {
    int64_t v = 0;
    if (!it->is_number_integer()) {
      err = fmt::format("'{}' must be an integer", key);
      return false;
    }
    if (!json_int64(*it, v) || v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
      err = fmt::format("'{}' must be an integer between {} and {}, got {}", key, std::numeric_limits<T>::min(),
                        std::numeric_limits<T>::max(), it->dump());
      return false;
    }
    out = static_cast<T>(v);
  } else {
    out = it->get<T>();
  }
  return true;
}

// Every sampling field of a request, in the order they are read. The numbers and booleans are read by this
// table (their type; ranges are the engine's); kOther fields by their own code below.
enum class FieldType { kFloat, kInt, kBool, kOther };
struct FieldRow {
  const char* name;
  FieldType type;
  float SamplingParams::*as_float = nullptr;
  int SamplingParams::*as_int = nullptr;
  bool SamplingParams::*as_bool = nullptr;
};
constexpr FieldRow kFields[] = {
    {"max_tokens", FieldType::kOther},
    {"max_completion_tokens", FieldType::kOther},
    {"temperature", FieldType::kFloat, &SamplingParams::temperature},
    {"top_p", FieldType::kFloat, &SamplingParams::top_p},
    {"top_k", FieldType::kInt, nullptr, &SamplingParams::top_k},
    {"min_p", FieldType::kFloat, &SamplingParams::min_p},
    {"presence_penalty", FieldType::kFloat, &SamplingParams::presence_penalty},
    {"frequency_penalty", FieldType::kFloat, &SamplingParams::frequency_penalty},
    {"repetition_penalty", FieldType::kFloat, &SamplingParams::repetition_penalty},
    {"n", FieldType::kInt, nullptr, &SamplingParams::n},
    {"min_tokens", FieldType::kInt, nullptr, &SamplingParams::min_tokens},
    {"seed", FieldType::kOther},
    {"ignore_eos", FieldType::kBool, nullptr, nullptr, &SamplingParams::ignore_eos},
    {"include_stop_str_in_output", FieldType::kBool, nullptr, nullptr, &SamplingParams::include_stop_str_in_output},
    {"skip_special_tokens", FieldType::kBool, nullptr, nullptr, &SamplingParams::skip_special_tokens},
    {"stop", FieldType::kOther},
    {"stop_token_ids", FieldType::kOther},
    {"logprobs", FieldType::kOther},
    {"top_logprobs", FieldType::kOther},
    {"prompt_logprobs", FieldType::kOther},
    {"logit_bias", FieldType::kOther},
    {"allowed_token_ids", FieldType::kOther},
};

// The table's numbers and booleans into `p`; false with `err` at the first of the wrong type.
bool read_typed_fields(const nlohmann::json& j, SamplingParams& p, std::string& err) {
  for (const FieldRow& f : kFields) {
    if (f.type == FieldType::kFloat && !read_number(j, f.name, p.*f.as_float, err)) return false;
    if (f.type == FieldType::kInt && !read_number(j, f.name, p.*f.as_int, err)) return false;
    if (f.type != FieldType::kBool) continue;
    auto it = j.find(f.name);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_boolean()) {
      err = fmt::format("'{}' must be a boolean", f.name);
      return false;
    }
    p.*f.as_bool = it->get<bool>();
  }
  return true;
}
}  // namespace

std::vector<std::string_view> sampling_field_names() {
  std::vector<std::string_view> names;
  for (const FieldRow& f : kFields) names.emplace_back(f.name);
  return names;
}

Status sampling_params_from_json(const nlohmann::json& j, SamplingParams& p) {
  auto bad = [](std::string m) { return Status(ErrorKind::kInvalidArgument, std::move(m)); };
  if (!j.is_object()) return bad("the request must be a JSON object");
  std::string err;
  int64_t max_tokens = p.max_tokens;
  if (!read_number(j, "max_tokens", max_tokens, err) || !read_number(j, "max_completion_tokens", max_tokens, err) ||
      !read_typed_fields(j, p, err))
    return bad(err);
  if (max_tokens < 0 || max_tokens > (1 << 30)) return bad("'max_tokens' must be a non-negative integer");
  p.max_tokens = static_cast<int>(max_tokens);
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    int64_t seed = 0;  // vLLM: a signed 64-bit integer
    if (!json_int64(*it, seed)) return bad("'seed' must be an integer between -2^63 and 2^63-1");
    p.seed = static_cast<uint64_t>(seed);
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
    if (it->size() > static_cast<size_t>(kMaxStopTokenIds))
      return bad(fmt::format("'stop_token_ids' may hold at most {} entries, got {}", kMaxStopTokenIds, it->size()));
    for (const auto& s : *it) {
      int64_t id = 0;
      if (!s.is_number_integer()) return bad("'stop_token_ids' must be a list of integers");
      if (!json_int64(s, id) || id < 0 || id > std::numeric_limits<int32_t>::max())
        return bad(fmt::format("'stop_token_ids' entry {} is not a token id", s.dump()));
      p.stop_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (auto it = j.find("allowed_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return bad("'allowed_token_ids' must be a list of token ids");
    if (it->empty()) return bad("'allowed_token_ids' must not be empty (leave it out to allow every token)");
    p.allowed_token_ids.clear();
    for (const auto& s : *it) {
      int64_t id = 0;
      if (!s.is_number_integer() || !json_int64(s, id) || id < 0 || id > std::numeric_limits<int32_t>::max())
        return bad(fmt::format("'allowed_token_ids' entry {} is not a token id", s.dump()));
      p.allowed_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  // top_logprobs (chat) is checked whether or not logprobs is given, as vLLM does.
  int top = -1;
  if (auto it = j.find("top_logprobs"); it != j.end() && !it->is_null()) {
    if (!read_number(j, "top_logprobs", top, err)) return bad(err);
    if (top < 0) return bad(fmt::format("'top_logprobs' must be a non-negative integer, got {}", top));
  }
  auto lp = j.find("logprobs");
  const bool lp_given = lp != j.end() && !lp->is_null();
  if (top > 0 && !(lp_given && lp->is_boolean() && lp->get<bool>()))
    return bad("'top_logprobs' needs 'logprobs': true");
  if (lp_given) {
    if (lp->is_boolean()) {  // chat completions: logprobs bool + top_logprobs int
      p.logprobs = lp->get<bool>() ? std::max(top, 0) : -1;
    } else if (lp->is_number_integer()) {  // completions: logprobs int
      int v = 0;
      if (!read_number(j, "logprobs", v, err)) return bad(err);
      if (v < 0) return bad(fmt::format("'logprobs' must be a non-negative integer, got {}", v));
      p.logprobs = v;
    } else
      return bad("'logprobs' must be a boolean or an integer");
  }
  if (auto it = j.find("prompt_logprobs"); it != j.end() && !it->is_null()) {
    int v = 0;
    if (!read_number(j, "prompt_logprobs", v, err)) return bad(err);
    if (v < 0) return bad(fmt::format("'prompt_logprobs' must be a non-negative integer, got {}", v));
    p.prompt_logprobs = v;
  }
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return bad("'logit_bias' must be an object mapping token ids to biases");
    p.logit_bias.clear();
    for (auto& [k, v] : it->items()) {
      // A decimal token id in the int32 range: "4294967296" must not wrap to token 0.
      int64_t id = -1;
      const char* b = k.data();
      const char* e = k.data() + k.size();
      auto [ptr, ec] = std::from_chars(b, e, id);
      if (k.empty() || ec != std::errc() || ptr != e || id < 0 || id > std::numeric_limits<int32_t>::max())
        return bad(
            fmt::format("'logit_bias' key \"{}\" is not a token id", k.size() > 32 ? k.substr(0, 32) + "..." : k));
      if (!v.is_number()) return bad("'logit_bias' must map token ids to numbers");
      p.logit_bias.emplace_back(static_cast<int32_t>(id), v.get<float>());
    }
  }
  return Status::Ok();
}

Status check_max_logprobs(const SamplingParams& p, int max_logprobs, int vocab_size, std::string* param) {
  const int cap = max_logprobs < 0 ? vocab_size : max_logprobs;
  auto over = [&](const char* what, const char* field, int n) {
    if (param) *param = field;
    return Status(ErrorKind::kInvalidArgument,
                  fmt::format("Requested {} logprobs of {}, which is greater than max allowed: {}", what, n, cap));
  };
  if (p.logprobs > cap) return over("sample", "logprobs", p.logprobs);
  if (p.prompt_logprobs > cap) return over("prompt", "prompt_logprobs", p.prompt_logprobs);
  return Status::Ok();
}

Status check_logprob_budget(const std::vector<size_t>& prompt_lengths, const std::vector<SamplingParams>& params,
                            int64_t limit, std::string* param) {
  // Entry counts, saturating at INT64_MAX instead of wrapping.
  auto times = [](int64_t a, int64_t b) {
    int64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
  };
  auto plus = [](int64_t a, int64_t b) {
    int64_t r = 0;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
  };
  int64_t generated = 0, prompt = 0;
  for (size_t i = 0; i < params.size() && i < prompt_lengths.size(); ++i) {
    const SamplingParams& p = params[i];
    const int64_t n = std::max(1, p.n);
    if (p.logprobs >= 0)
      generated = plus(generated, times(times(n, std::max(0, p.max_tokens)), int64_t{p.logprobs} + 1));
    if (p.prompt_logprobs >= 0) {
      const auto length = static_cast<int64_t>(std::min<size_t>(prompt_lengths[i], INT64_MAX));
      prompt = plus(prompt, times(times(n, length), int64_t{p.prompt_logprobs} + 1));
    }
  }
  if (plus(generated, prompt) <= limit) return Status::Ok();
  const bool prompt_side = prompt >= generated;
  if (param) *param = prompt_side ? "prompt_logprobs" : "logprobs";
  return Status(ErrorKind::kInvalidArgument,
                fmt::format("this request asks for {} logprob entries (tokens x (top logprobs + 1), for "
                            "every prompt and choice), more than the {} one response may hold; ask for fewer {}, "
                            "fewer tokens (max_tokens or a shorter prompt), or fewer prompts or choices (n)",
                            plus(generated, prompt), limit, prompt_side ? "prompt_logprobs" : "top logprobs"));
}

}  // namespace tessera::server
