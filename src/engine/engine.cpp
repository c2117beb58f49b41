#include "engine/engine.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/logging.h"
#include "engine/memory_plan.h"

namespace tessera {

LLMEngine::LLMEngine(std::unique_ptr<Model> model, Backend& backend, EngineConfig config)
    : LLMEngine(std::make_unique<LocalExecutor>(std::move(model), backend), std::move(config)) {}

LLMEngine::LLMEngine(std::unique_ptr<Executor> executor, EngineConfig config)
    : executor_(std::move(executor)),
      backend_(executor_->backend()),
      config_(std::move(config)),
      seed_rng_(config_.seed) {
  const ModelConfig& mc = executor_->model_config();
  if (config_.scheduler.max_model_len <= 0) config_.scheduler.max_model_len = mc.max_position_embeddings;
  if (config_.scheduler.max_model_len > mc.max_position_embeddings)
    fail(ErrorKind::kInvalidArgument,
         "--max-model-len {} is larger than the model's max_position_embeddings ({}); lower --max-model-len",
         config_.scheduler.max_model_len, mc.max_position_embeddings);
  if (!config_.scheduler.enable_chunked_prefill &&
      config_.scheduler.max_num_batched_tokens < config_.scheduler.max_model_len)
    fail(ErrorKind::kInvalidArgument,
         "--max-num-batched-tokens ({}) is smaller than --max-model-len ({}) with chunked prefill off; raise it or "
         "enable chunked prefill",
         config_.scheduler.max_num_batched_tokens, config_.scheduler.max_model_len);
  eos_ids_.assign(mc.eos_token_ids.begin(), mc.eos_token_ids.end());
  config_.speculative = validate_speculative_config(config_.speculative);
  const SpeculativeConfig& sc = config_.speculative;
  if (sc.enabled()) {
    if (sc.method == "mtp")
      fail(ErrorKind::kUnsupported,
           "--speculative-config method 'mtp' is not built yet; use {{\"method\": \"ngram\", ...}} or run without "
           "--speculative-config");
    if (mc.is_hybrid() && !backend_.supports_token_state_slots())
      fail(ErrorKind::kUnsupported,
           "--speculative-config on a hybrid (linear-attention) model needs the {} backend to keep the state after "
           "each draft token, which it does not do yet (the CPU backend does); run without --speculative-config",
           backend_.name());
  }
  plan_kv_cache();
  scheduler_ = std::make_unique<Scheduler>(config_.scheduler, *cache_manager_);
  if (sc.enabled()) {
    proposer_ = std::make_unique<NgramProposer>(sc.prompt_lookup_min, sc.prompt_lookup_max);
    TLOG_INFO("Speculative decoding: {}; verification steps run eagerly (no CUDA graph)", describe(sc));
  }
}

LLMEngine::~LLMEngine() = default;

void LLMEngine::plan_kv_cache() {
  const auto specs = executor_->cache_specs();
  const DType dt = parse_kv_cache_dtype(config_.kv_cache_dtype, backend_.compute_dtype());
  const StateDtypes sdt =
      parse_mamba_cache_dtypes(config_.mamba_cache_dtype, config_.mamba_ssm_cache_dtype, backend_.compute_dtype());
  const int bs = config_.block_size;
  const CacheFootprint fp = cache_footprint(specs, dt, bs, sdt.conv, sdt.ssm);
  const bool hybrid = fp.state_layers > 0;
  const size_t bytes_per_block = fp.kv_bytes_per_block;
  KvBudgetInputs in;
  const size_t real_total = backend_.total_memory(), free = backend_.free_memory();
  in.total = config_.device_memory > 0 ? std::min(config_.device_memory, real_total) : real_total;
  in.used = real_total - std::min(real_total, free);
  in.reserved = config_.reserved_bytes;
  in.utilization = config_.gpu_memory_utilization;
  in.cpu = backend_.device().type == DeviceType::kCPU;
  in.explicit_budget = config_.kv_cache_memory_bytes;
  in.num_blocks_override = config_.num_blocks_override;
  in.block_size = bs;
  in.max_num_seqs = config_.scheduler.max_num_seqs;
  in.max_model_len = config_.scheduler.max_model_len;
  if (hybrid) in.extra_state_slots = checkpoint_state_slots(in.max_num_seqs, config_.enable_prefix_caching);
  // Speculative decoding keeps the state after each of a sequence's k drafts: 1 + k slots each.
  const int slots_per_seq = config_.speculative.enabled() ? 1 + config_.speculative.num_speculative_tokens : 1;
  in.state_slots_per_seq = slots_per_seq;
  const KvBudget budget = plan_kv_budget(in, fp);
  if (config_.num_blocks_override <= 0 && config_.kv_cache_memory_bytes == 0)
    TLOG_INFO(
        "Memory: {:.2f} GiB total, {:.2f} GiB in use (weights included), {:.2f} GiB reserved for activations and "
        "graphs, gpu_memory_utilization {:.2f}: {:.2f} GiB for the KV cache{}",
        in.total / 1073741824.0, in.used / 1073741824.0, in.reserved / 1073741824.0, config_.gpu_memory_utilization,
        budget.budget / 1073741824.0, hybrid ? " and the state slots" : "");
  if (hybrid && budget.max_num_seqs < config_.scheduler.max_num_seqs) {
    TLOG_WARN(
        "--max-num-seqs {} lowered to {}: the memory left for the cache holds {} linear-attention state slots of "
        "{:.2f} "
        "MiB next to the KV cache of one --max-model-len {} sequence (raise --gpu-memory-utilization, lower "
        "--max-model-len, or set --mamba-ssm-cache-dtype bfloat16 for more)",
        config_.scheduler.max_num_seqs, budget.max_num_seqs, budget.num_state_slots, fp.state_bytes_per_seq / 1048576.0,
        config_.scheduler.max_model_len);
    config_.scheduler.max_num_seqs = budget.max_num_seqs;
  }
  const int num_blocks = budget.num_blocks;
  const int max_len = config_.scheduler.max_model_len;
  if (static_cast<int64_t>(num_blocks) * bs < max_len)
    fail(ErrorKind::kOutOfMemory,
         "The model's max seq len ({}) is larger than the maximum number of tokens that can be stored in the KV cache "
         "({}). Try increasing --gpu-memory-utilization or decreasing --max-model-len.",
         max_len, static_cast<int64_t>(num_blocks) * bs);
  CacheInit init;
  init.num_blocks = num_blocks;
  init.block_size = bs;
  init.dtype = dt;
  init.max_model_len = max_len;
  init.max_graph_batch = config_.enforce_eager ? 0 : std::min(config_.scheduler.max_num_seqs, 256);
  init.num_state_slots = budget.num_state_slots;
  init.conv_dtype = sdt.conv;
  init.ssm_dtype = sdt.ssm;
  executor_->init_kv_cache(init);
  cache_manager_ = std::make_unique<KvCacheManager>(num_blocks, bs, config_.enable_prefix_caching,
                                                    budget.num_state_slots, hybrid ? slots_per_seq : 1);
  const int64_t tokens = static_cast<int64_t>(num_blocks) * bs;
  TLOG_INFO("# KV cache blocks: {} of {} tokens ({} bytes each, dtype {})", num_blocks, bs, bytes_per_block,
            dtype_name(dt));
  TLOG_INFO("KV cache size: {} tokens", with_thousands(tokens));
  double concurrency = static_cast<double>(tokens) / max_len;
  if (hybrid) {
    const int for_seqs = std::min(budget.num_state_slots, config_.scheduler.max_num_seqs * slots_per_seq);
    TLOG_INFO(
        "Linear-attention state slots: {} ({} for --max-num-seqs{}, {} for prefix-cache checkpoints; {} layers, {:.2f} "
        "MiB per slot, {:.2f} MiB in all; conv state {}, recurrent state {})",
        budget.num_state_slots, for_seqs,
        slots_per_seq > 1 ? fmt::format(", {} per sequence for speculative decoding", slots_per_seq) : "",
        budget.num_state_slots - for_seqs, fp.state_layers, fp.state_bytes_per_seq / 1048576.0,
        budget.state_bytes / 1048576.0, dtype_name(sdt.conv), dtype_name(sdt.ssm));
    concurrency = std::min(concurrency, static_cast<double>(config_.scheduler.max_num_seqs));
  }
  TLOG_INFO("Maximum concurrency for {} tokens per request: {:.2f}x", with_thousands(max_len), concurrency);
  if (config_.planned_blocks > 0)
    TLOG_INFO(
        "Planned before loading: {} blocks with {:.2f} GiB in use; measured: {} blocks with {:.2f} GiB ({:+.1f}%)",
        config_.planned_blocks, config_.planned_used_bytes / 1073741824.0, num_blocks, in.used / 1073741824.0,
        100.0 * (num_blocks - config_.planned_blocks) / config_.planned_blocks);
}

Status LLMEngine::add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params) {
  const ModelConfig& mc = executor_->model_config();
  if (Status s = validate_sampling_params(params, mc.vocab_size); !s.ok()) return s;
  if (prompt.empty()) return Status(ErrorKind::kInvalidArgument, "the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= mc.vocab_size)
      return Status(ErrorKind::kInvalidArgument,
                    fmt::format("prompt token {} is outside the vocabulary (0..{})", t, mc.vocab_size - 1));
  const int max_len = max_model_len();
  if (static_cast<int>(prompt.size()) + 1 > max_len)
    return Status(ErrorKind::kInvalidArgument,
                  fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens in "
                              "the prompt and at least 1 to generate. Please reduce the length of the prompt.",
                              max_len, prompt.size()));
  for (int i = 0; i < params.n; ++i) {
    std::string child = i == 0 ? id : id + "#" + std::to_string(i);
    if (requests_.count(child)) return Status(ErrorKind::kInvalidArgument, "duplicate request id " + child);
  }
  for (int i = 0; i < params.n; ++i) {
    auto r = std::make_unique<Request>();
    r->id = i == 0 ? id : id + "#" + std::to_string(i);
    r->prompt = prompt;
    r->params = params;
    r->params.n = 1;
    r->sample_seed = params.seed ? *params.seed + static_cast<uint64_t>(i) : seed_rng_();
    r->arrival_order = next_order_++;
    scheduler_->add(r.get());
    requests_.emplace(r->id, std::move(r));
  }
  return Status::Ok();
}

void LLMEngine::abort(const std::string& id, bool only_this_sequence) {
  std::vector<RequestOutput> ignored;
  for (auto it = requests_.begin(); it != requests_.end();) {
    const std::string& rid = it->first;
    bool match = rid == id || (!only_this_sequence && rid.size() > id.size() && rid.compare(0, id.size(), id) == 0 &&
                               rid[id.size()] == '#');
    Request* r = it->second.get();
    ++it;
    if (match) finish(r, FinishReason::kAbort, ignored);
  }
}

void LLMEngine::retire(Request* r) {
  scheduler_->remove(r);
  r->status = RequestStatus::kFinished;
  requests_.erase(r->id);  // r is gone after this
}

void LLMEngine::finish(Request* r, FinishReason reason, std::vector<RequestOutput>& out) {
  r->finish = reason;
  RequestOutput o;
  o.request_id = r->id;
  o.finished = true;
  o.finish_reason = reason;
  o.stop_token = r->stop_token;
  o.num_prompt_tokens = static_cast<int>(r->prompt.size());
  o.num_output_tokens = static_cast<int>(r->output.size());
  o.num_cached_tokens = r->num_cached_tokens;
  out.push_back(std::move(o));
  retire(r);
}

ModelInput LLMEngine::build_input(const SchedulerOutput& sched, std::vector<Sampled>& sampled) const {
  ModelInput in;
  const int bs = config_.block_size;
  int max_blocks = 0;
  for (const auto& s : sched.scheduled)
    max_blocks = std::max(max_blocks, static_cast<int>(s.request->block_ids.size()));
  in.attention.block_size = bs;
  in.attention.max_blocks_per_seq = max_blocks;
  in.attention.query_start_loc.push_back(0);
  const bool hybrid = cache_manager_->has_state_slots();
  bool spec_step = false;
  for (const auto& s : sched.scheduled) spec_step = spec_step || s.num_draft_tokens > 0;
  for (const auto& s : sched.scheduled) {
    const Request& r = *s.request;
    const int begin = r.num_computed_tokens, end = begin + s.num_new_tokens;
    for (int i = begin; i < end; ++i) {
      in.token_ids.push_back(r.token_at(i));
      in.positions.push_back(i);
      in.attention.slot_mapping.push_back(r.block_ids[i / bs] * bs + i % bs);
    }
    in.attention.query_start_loc.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.attention.seq_lens.push_back(end);
    for (int b = 0; b < max_blocks; ++b)
      in.attention.block_tables.push_back(b < static_cast<int>(r.block_ids.size()) ? r.block_ids[b] : 0);
    if (hybrid) {
      in.linear.state_slots.push_back(s.state_slot);
      in.linear.has_initial_state.push_back(s.has_initial_state ? 1 : 0);
      if (spec_step) {
        // The state after each token of a verification chunk goes to its own slot (the one
        // after the last accepted token is kept); other sequences' after their last token, as
        // without speculation, in place.
        for (int i = begin; i < end; ++i) {
          const int j = i - (end - 1 - s.num_draft_tokens);
          in.linear.token_state_slots.push_back(s.num_draft_tokens > 0 ? cache_manager_->draft_state_slot(r, j)
                                                : i == end - 1         ? s.state_slot
                                                                       : -1);
        }
      }
    }
    if (end == r.num_tokens() + s.num_draft_tokens) {
      // Caught up: the last position's logits give the next token; with drafts, each draft's
      // position's too (the token the target samples there, to compare with the next draft).
      const int rows = 1 + s.num_draft_tokens, T = static_cast<int>(in.token_ids.size());
      sampled.push_back({s.request, static_cast<int>(in.logits_indices.size()), s.num_draft_tokens});
      for (int j = rows; j >= 1; --j) in.logits_indices.push_back(T - j);
    }
  }
  if (hybrid) {
    in.linear.query_start_loc = in.attention.query_start_loc;
    in.state_copies = sched.state_copies;
  }
  return in;
}

std::vector<RequestOutput> LLMEngine::step() {
  std::vector<RequestOutput> out;
  timer_.start();
  SchedulerOutput sched = scheduler_->schedule();
  timer_.mark(0, "schedule");
  if (sched.scheduled.empty()) return out;
  ++stats_.steps;
  for (const auto& s : sched.scheduled) {
    Request* r = s.request;
    if (r->num_computed_tokens == r->num_cached_tokens && r->output.empty() && r->num_preemptions == 0) {
      stats_.prompt_tokens += r->prompt.size();
      stats_.prefix_cache_hit_tokens += static_cast<uint64_t>(r->num_cached_tokens);
    }
  }
  std::vector<Sampled> sampled;
  ModelInput in = build_input(sched, sampled);
  const int vocab = executor_->model_config().vocab_size;
  StepSampling sampling;
  for (const Sampled& sm : sampled) {
    const Request& r = *sm.request;
    // (min_tokens: if row 0 needs the host, so may the later ones; the host samples them all.)
    const bool host = needs_host_sampling(r);
    const SamplingRow row = sampling_row(r);
    for (int j = 0; j <= sm.drafts; ++j) {
      if (host) {
        sampling.host_rows.push_back(static_cast<int32_t>(sampling.rows.size()));
        sampling.rows.emplace_back();  // greedy (cheap); the host samples this row
      } else {
        sampling.rows.push_back(row);
        sampling.rows.back().position += static_cast<uint64_t>(j);  // output position of row j's token
      }
    }
  }
  // Every step runs the lm_head, even when only chunked prefills advanced (one row, unused).
  if (in.logits_indices.empty()) {
    in.logits_indices.push_back(0);
    sampling.rows.emplace_back();
  }
  timer_.mark(1, "build input");
  executor_->execute(in, sampling, step_out_);
  timer_.mark(2, "execute");
  scheduler_->on_step_done(sched);

  // Each sequence takes the target's token at its first row; with drafts, while that token
  // equals the draft at the same position, the next row's token too (spec_decode.h).
  size_t next_host = 0;
  std::vector<Request*> decoding;
  for (const Sampled& sm : sampled) {
    Request* r = sm.request;
    RequestOutput o;
    o.request_id = r->id;
    FinishReason reason = FinishReason::kNone;
    int accepted = 0;
    const int end_row = sm.first_row + sm.drafts + 1;
    for (int row = sm.first_row; row < end_row; ++row) {
      SampleResult res;
      if (next_host < sampling.host_rows.size() && sampling.host_rows[next_host] == row) {
        // The host sampler sees the tokens accepted so far (penalties, min_tokens, position).
        res =
            sampler_.sample(step_out_.host_logits.data() + next_host * static_cast<size_t>(vocab), vocab, *r, eos_ids_);
        ++next_host;
      } else {
        res.token = step_out_.tokens[row];
      }
      r->output.push_back(res.token);
      ++stats_.generation_tokens;
      o.new_token_ids.push_back(res.token);
      if (res.logprob) o.logprobs.push_back(*res.logprob);
      const SamplingParams& p = r->params;
      const bool min_reached = static_cast<int>(r->output.size()) > p.min_tokens;
      if (!p.ignore_eos && min_reached && std::find(eos_ids_.begin(), eos_ids_.end(), res.token) != eos_ids_.end()) {
        reason = FinishReason::kStop;
        r->stop_token = res.token;
      } else if (min_reached &&
                 std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), res.token) != p.stop_token_ids.end()) {
        reason = FinishReason::kStop;
        r->stop_token = res.token;
      } else if (static_cast<int>(r->output.size()) >= p.max_tokens || r->num_tokens() >= max_model_len()) {
        reason = FinishReason::kLength;
      }
      if (reason != FinishReason::kNone) break;
      const int j = row - sm.first_row;
      if (j == sm.drafts || res.token != r->spec_tokens[static_cast<size_t>(j)]) break;
      ++accepted;  // draft j was right: row j + 1's token follows it
    }
    while (next_host < sampling.host_rows.size() && sampling.host_rows[next_host] < end_row) ++next_host;
    stats_.spec.add(sm.drafts, accepted);
    o.num_prompt_tokens = static_cast<int>(r->prompt.size());
    o.num_output_tokens = static_cast<int>(r->output.size());
    o.num_cached_tokens = r->num_cached_tokens;
    if (reason != FinishReason::kNone) {
      o.finished = true;
      o.finish_reason = reason;
      o.stop_token = r->stop_token;
      retire(r);
    } else {
      scheduler_->accept_drafts(*r, accepted);
      decoding.push_back(r);
    }
    out.push_back(std::move(o));
  }
  if (proposer_ && !decoding.empty()) propose_drafts(decoding);
  if (proposer_) {  // vLLM's periodic line, every 10 s while drafts are verified
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - spec_logged_at_).count();
    if (secs >= 10 && stats_.spec.num_drafts > spec_logged_.num_drafts) {
      TLOG_INFO("{}", spec_decode_log_line(stats_.spec, spec_logged_, secs));
      spec_logged_ = stats_.spec;
      spec_logged_at_ = now;
    }
  }
  timer_.mark(3, "outputs");
  timer_.pass_done();
  return out;
}

void LLMEngine::set_proposer(std::unique_ptr<Proposer> p) {
  TESSERA_CHECK(config_.speculative.enabled(), "set_proposer without --speculative-config");
  proposer_ = std::move(p);
}

void LLMEngine::propose_drafts(const std::vector<Request*>& decoding) {
  // At most k, and no more than the request can still take: max_tokens (the step adds up to
  // drafts + 1 tokens) and max_model_len (the drafts' positions must exist).
  std::vector<int> room;
  room.reserve(decoding.size());
  for (const Request* r : decoding) {
    int k = config_.speculative.num_speculative_tokens;
    k = std::min(k, r->params.max_tokens - static_cast<int>(r->output.size()) - 1);
    k = std::min(k, max_model_len() - r->num_tokens());
    room.push_back(std::max(0, k));
  }
  proposer_->propose(decoding, room);
  for (size_t i = 0; i < decoding.size(); ++i)
    TESSERA_CHECK(static_cast<int>(decoding[i]->spec_tokens.size()) <= room[i], "proposer gave {} drafts for room {}",
                  decoding[i]->spec_tokens.size(), room[i]);
}

EngineStats LLMEngine::stats() const {
  EngineStats s = stats_;
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  s.kv_cache_usage = cache_manager_->pool().usage();
  s.num_preemptions = scheduler_->num_preemptions();
  s.num_speculative_tokens = config_.speculative.enabled() ? config_.speculative.num_speculative_tokens : 0;
  return s;
}

}  // namespace tessera
