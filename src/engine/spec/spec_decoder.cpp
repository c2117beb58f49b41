#include "engine/spec/spec_decoder.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/logging.h"
#include "engine/executor.h"
#include "engine/kv_cache_coordinator.h"
#include "engine/scheduler.h"
#include "engine/spec/mtp_proposer.h"
#include "engine/spec/ngram_proposer.h"

namespace tessera {

namespace {

// The warm-up's drafts for a proposer that drafts on the host (ngram finds none in random
// tokens): 0, k, k - 1, ..., 1 drafts in successive steps (the request's last token, repeated), so
// the batch-1 graphs of the decode step and of each verification shape are captured before a
// user's request comes.
class WarmUpDrafts : public Proposer {
 public:
  explicit WarmUpDrafts(int k) : k_(k) {}
  void propose(const std::vector<Request*>& requests, const std::vector<int>& room) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      Request& r = *requests[i];
      const int d = std::max(0, std::min(next_, room[i]));
      r.spec_tokens.assign(static_cast<size_t>(d), r.output.empty() ? r.prompt.back() : r.output.back());
    }
    next_ = next_ == 0 ? k_ : next_ - 1;
  }

 private:
  int k_, next_ = 0;
};

// A proposer that drafts on the host, one step at a time (the warm-up drafts every count for it).
bool drafts_on_host(const Proposer& p) { return !p.drafts_in_step() && !p.needs_lookahead_slots(); }

}  // namespace

SpecDecoder::SpecDecoder(const SpeculativeConfig& config, Executor& executor, Options options)
    : config_(config), executor_(executor), options_(options) {
  TESSERA_CHECK(config_.enabled(), "SpecDecoder without a speculative config");
  Backend& backend = executor_.backend();
  if (executor_.model_config().is_hybrid() && !backend.supports_token_state_slots())
    fail(ErrorKind::kUnsupported,
         "--speculative-config on a hybrid (linear-attention) model needs the {} backend to keep the state after "
         "each draft token, which it does not do yet (the CPU backend does); run without --speculative-config",
         backend.name());
  if (config_.method == "mtp") {
    if (!executor_.supports_mtp())
      fail(ErrorKind::kUnsupported,
           "--speculative-config method 'mtp': the model was loaded without its multi-token-prediction layer (load "
           "it with the MTP layer, as `tessera serve` does for this flag); use {{\"method\": \"ngram\", ...}} or no "
           "--speculative-config");
    proposer_ = std::make_unique<MtpProposer>(executor_, options_.block_size);
  } else {
    proposer_ = std::make_unique<NgramProposer>(config_.prompt_lookup_min, config_.prompt_lookup_max);
  }
  TLOG_INFO(
      "Speculative decoding: {}; verification steps whose sequences carry as many drafts{} replay CUDA graphs "
      "unless --enforce-eager",
      describe(config_), config_.method == "mtp" ? ", and the MTP draft passes after them," : "");
}

SpecDecoder::~SpecDecoder() = default;

void SpecDecoder::plan_step(const SchedulerOutput& sched, size_t num_running, KvCacheCoordinator& cache) {
  // MTP: while drafting is off no pass runs after the step, so its sequences stop drafting for good.
  if (proposer_->needs_every_step() && drafting_off(num_running))
    for (const auto& s : sched.scheduled) s.request->spec_off = true;
  passes_ = passes_in_step(sched, cache);
  drafted_ = false;
  step_verifications_ = step_accepted_ = 0;
  // What each sequence computes this step (a proposer may read the target's hidden states there).
  spans_.clear();
  caught_up_.clear();
  int row = 0;
  for (const auto& s : sched.scheduled) {
    const Request& r = *s.request;
    spans_.push_back({s.request, r.num_computed_tokens, 0, row, s.num_new_tokens});
    caught_up_.push_back(r.num_computed_tokens + s.num_new_tokens == r.num_tokens() + s.num_draft_tokens);
    row += s.num_new_tokens;
  }
}

int SpecDecoder::passes_in_step(const SchedulerOutput& sched, KvCacheCoordinator& cache) const {
  if (!proposer_->drafts_in_step() || !options_.drafts_in_step || sched.scheduled.empty()) return -1;
  const int q = sched.scheduled.front().num_new_tokens;
  for (const auto& s : sched.scheduled) {
    const Request& r = *s.request;
    if (s.num_new_tokens != q || s.num_draft_tokens != q - 1 || r.num_computed_tokens + 1 != r.num_tokens() ||
        r.output.empty())
      return -1;
  }
  for (const auto& s : sched.scheduled)
    if (s.request->spec_off) return -1;  // (no pass for it: drafting after the step covers the others)
  const int passes = config_.num_speculative_tokens;
  if (passes < 2) return passes;
  // Pass j + 1 (j >= 1) writes the MTP layer's KV at the accepted row's position + j: up to
  // position num_computed + q + passes - 2.
  for (const auto& s : sched.scheduled) {
    Request& r = *s.request;
    if (r.num_computed_tokens + q + passes - 2 >= options_.max_model_len || !cache.allocate(r, q + passes - 1))
      return -1;
  }
  return passes;
}

void SpecDecoder::execute(const ModelInput& in, const StepSampling& sampling, StepOutput& out) {
  drafted_ = passes_ >= 0 && sampling.host_rows.empty() && sampling.mask_words == 0 &&
             executor_.execute_with_mtp(in, sampling, passes_, out, step_drafts_);
  if (!drafted_) executor_.execute(in, sampling, out);
}

void SpecDecoder::note_verification(size_t seq, int drafts, int accepted, const Request* going_on) {
  stats_.add(drafts, accepted);
  if (drafts > 0) {
    ++step_verifications_;
    step_accepted_ += static_cast<uint64_t>(accepted);
  }
  // The device accepted as the host did (the passes drafted from that row).
  TESSERA_CHECK(!drafted_ || !going_on || step_drafts_.accepted[seq] == accepted,
                "speculative decoding: the device accepted {} drafts of {}, the host {}", step_drafts_.accepted[seq],
                going_on ? going_on->id : "", accepted);
}

void SpecDecoder::finish_step(const std::vector<Request*>& decoding, size_t num_running, KvCacheCoordinator& cache) {
  recent_drafts_ = recent_drafts_ * kDecay + static_cast<double>(step_verifications_);
  recent_accepted_ = recent_accepted_ * kDecay + static_cast<double>(step_accepted_);
  if (drafted_) {
    // (The step's sequences, retired ones included: pointers the proposer compares.)
    std::vector<const Request*> seqs;
    for (const ComputedSpan& s : spans_) seqs.push_back(s.request);
    proposer_->take_step_drafts(std::move(seqs), std::move(step_drafts_.drafts), step_drafts_.passes);
    ++stats_.steps_drafting_in_step;
  } else {
    // Sequences that go on: the decoding ones and those whose prefill continues (the others of
    // the step were retired: their pointers dangle, so they are matched, not read).
    std::vector<ComputedSpan> going_on;
    const bool every_step = proposer_->needs_every_step();
    for (size_t i = 0; i < spans_.size(); ++i) {
      if (caught_up_[i] && std::find(decoding.begin(), decoding.end(), spans_[i].request) == decoding.end()) continue;
      if (every_step && spans_[i].request->spec_off) continue;  // (not retired: it is in decoding or prefilling)
      spans_[i].end = spans_[i].request->num_computed_tokens;
      going_on.push_back(spans_[i]);
    }
    proposer_->observe_step(going_on);
  }
  spans_.clear();
  propose_drafts(decoding, num_running, cache);
  log_metrics();
}

void SpecDecoder::propose_drafts(const std::vector<Request*>& decoding, size_t num_running, KvCacheCoordinator& cache) {
  // At most k, and no more than the request can still take: max_tokens (the step adds up to
  // drafts + 1 tokens) and max_model_len (the drafts' positions must exist).
  std::vector<int> room;
  room.reserve(decoding.size());
  const bool off = drafting_off(num_running);
  for (const Request* r : decoding) {
    int k = off || r->spec_off ? 0 : config_.num_speculative_tokens;
    k = std::min(k, r->params.max_tokens - static_cast<int>(r->output.size()) - 1);
    k = std::min(k, options_.max_model_len - r->num_tokens());
    room.push_back(std::max(0, k));
  }
  if (proposer_->needs_lookahead_slots())
    for (size_t i = 0; i < decoding.size(); ++i) {
      // Draft j >= 2 is drafted at position num_tokens - 3 + j: blocks up to num_tokens + room - 2 positions.
      Request& r = *decoding[i];
      if (room[i] < 2 || cache.allocate(r, room[i] - 1)) continue;
      const int held = static_cast<int>(r.block_ids().size()) * options_.block_size;
      room[i] = std::clamp(held - r.num_tokens() + 2, 1, room[i]);
    }
  proposer_->propose(decoding, room);
  for (Request* r : decoding) {  // an MTP draft from NaN logits is -1 (Backend::argmax): drafting stops there
    auto& d = r->spec_tokens;
    d.erase(std::find_if(d.begin(), d.end(), [](int32_t t) { return t < 0; }), d.end());
  }
  for (size_t i = 0; i < decoding.size(); ++i)
    TESSERA_CHECK(static_cast<int>(decoding[i]->spec_tokens.size()) <= room[i], "proposer gave {} drafts for room {}",
                  decoding[i]->spec_tokens.size(), room[i]);
}

bool SpecDecoder::drafting_off(size_t num_running) const {
  const int limit = config_.disable_by_batch_size;
  if (limit > 0) return num_running >= static_cast<size_t>(limit);
  if (limit != SpeculativeConfig::kDisableAuto || internal_run_ || costs_.empty()) return false;
  return cost_at(num_running) >= expected_tokens_per_verification();
}

double SpecDecoder::expected_tokens_per_verification() const {
  // Recent verifications (each weighs kDecay^steps since) plus kPrior pseudo-verifications that
  // accept every draft: drafting starts wherever it might pay, and once it stopped for poor
  // acceptance the evidence fades, so a later sequence tries again (a workload's acceptance moves).
  const double k = config_.num_speculative_tokens;
  return 1.0 + (recent_accepted_ + kPrior * k) / (recent_drafts_ + kPrior);
}

double SpecDecoder::cost_at(size_t n) const {
  for (const auto& [b, cost] : costs_)
    if (static_cast<size_t>(b) >= n) return cost;
  return costs_.back().second;
}

void SpecDecoder::log_metrics() {
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - logged_at_).count();
  if (secs >= 10 && stats_.num_drafts > logged_.num_drafts) {
    TLOG_INFO("{}", spec_decode_log_line(stats_, logged_, secs));
    logged_ = stats_;
    logged_at_ = now;
  }
}

void SpecDecoder::begin_internal_run(bool warm_up) {
  internal_run_ = true;
  saved_stats_ = stats_;
  if (warm_up && drafts_on_host(*proposer_)) {
    parked_ = std::move(proposer_);
    proposer_ = std::make_unique<WarmUpDrafts>(config_.num_speculative_tokens);
  }
}

void SpecDecoder::end_internal_run() {
  internal_run_ = false;
  if (parked_) proposer_ = std::move(parked_);
  stats_ = saved_stats_;
  recent_drafts_ = recent_accepted_ = 0;
  logged_ = stats_;
  logged_at_ = std::chrono::steady_clock::now();
}

int SpecDecoder::warm_up_extra_tokens() const {
  const int k = config_.num_speculative_tokens;
  return drafts_on_host(*proposer_) ? k * (k + 1) / 2 : 0;
}

bool SpecDecoder::wants_calibration() const {
  return proposer_->needs_every_step() && config_.disable_by_batch_size == SpeculativeConfig::kDisableAuto;
}

int SpecDecoder::calibration_tokens() const {
  // The prompt, then up to k + 1 tokens in each of the warm-up, timed and two spare steps, then k drafts ahead.
  const int k = config_.num_speculative_tokens;
  return kCalibrationPrompt + (kCalibrationWarm + kCalibrationSteps + 2) * (k + 1) + k;
}

int SpecDecoder::calibration_max_tokens() const {
  return calibration_tokens() - kCalibrationPrompt - config_.num_speculative_tokens;  // (every step may take k + 1)
}

void SpecDecoder::calibrate(const TimeSteps& time_steps, int max_num_seqs, const KvCacheCoordinator& cache) {
  const int k = config_.num_speculative_tokens;
  TLOG_INFO("Speculative decoding: measuring a step with {} drafts a sequence against one without (batch 1, 2, 4, ...)",
            k);
  begin_internal_run(false);
  // Blocks a calibration sequence may hold: prompt, tokens, drafts' lookahead, one spare.
  const int per_seq = calibration_tokens() / options_.block_size + 2;
  std::string line;
  // A budget for slow backends (a large model on the CPU): batches it did not reach count as the
  // largest measured one.
  const auto start = std::chrono::steady_clock::now();
  for (int b = 1; b <= max_num_seqs; b *= 2) {
    if (b * per_seq > cache.pool().num_free()) break;
    if (!costs_.empty() && std::chrono::steady_clock::now() - start > kCalibrationBudget) {
      TLOG_INFO("Speculative decoding: measuring stopped at batch {} after {} s (batches above count as it)",
                costs_.back().first, kCalibrationBudget.count());
      break;
    }
    const double plain = time_steps(b, false, 2 * static_cast<uint64_t>(b));
    const double with = time_steps(b, true, 2 * static_cast<uint64_t>(b) + 1);
    if (plain <= 0 || with <= 0) break;
    costs_.emplace_back(b, with / plain);
    line += fmt::format("{}{}: {:.2f}x", line.empty() ? "" : ", ", b, with / plain);
    if (with / plain >= k + 1) break;  // no acceptance pays for it here or (in practice) above
  }
  end_internal_run();
  if (costs_.empty()) {
    TLOG_WARN(
        "Speculative decoding: could not measure its cost (no room for a calibration sequence of {} tokens in the "
        "cache or --max-model-len); it drafts at every batch size (set \"disable_by_batch_size\" to limit it)",
        calibration_tokens());
    return;
  }
  TLOG_INFO(
      "Speculative decoding: a step with drafts costs (x a plain step, by batch) {}; it drafts while the mean "
      "acceptance length exceeds the cost at the running batch (sequences that run a step without drafts draft no "
      "more); \"disable_by_batch_size\" sets a fixed limit instead",
      line);
}

}  // namespace tessera
