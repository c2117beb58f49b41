#include "engine/engine.h"

#include <algorithm>
#include <cstring>

#include <fmt/ranges.h>

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
  init_speculative();
  plan_kv_cache();
  scheduler_ = std::make_unique<Scheduler>(config_.scheduler, *cache_manager_);
  if (config_.warm_up && captures_graphs()) warm_up();
  if (spec_ && spec_->wants_calibration()) calibrate_speculation();
}

void LLMEngine::init_speculative() {
  config_.speculative = validate_speculative_config(config_.speculative);
  if (!config_.speculative.enabled()) return;
  spec_ = std::make_unique<SpecDecoder>(
      config_.speculative, *executor_,
      SpecDecoder::Options{config_.block_size, config_.scheduler.max_model_len, config_.mtp_drafts_in_step});
}

LLMEngine::~LLMEngine() = default;

void LLMEngine::plan_kv_cache() {
  const auto specs = executor_->cache_specs();
  const DType dt = parse_kv_cache_dtype(config_.kv_cache_dtype, backend_.compute_dtype());
  const StateDtypes sdt =
      parse_mamba_cache_dtypes(config_.mamba_cache_dtype, config_.mamba_ssm_cache_dtype, backend_.compute_dtype());
  const int bs = config_.block_size;
  // Pipeline stages: rank 0 sees only its own layers, and every stage reads the same tables.
  const bool whole_model = static_cast<int>(specs.size()) >= executor_->model_config().num_layers;
  auto groups = engine_cache_groups(specs, bs, whole_model, config_.hybrid_kv_cache_manager);
  for (CacheGroup& g : groups)
    if (g.spec.kind == CacheGroupKind::kStateSlot) g.spec.checkpoint_interval = config_.state_checkpoint_interval;
  kv_layer_groups_ = cache_layer_groups(groups, static_cast<int>(specs.size()));
  const CacheFootprint fp = cache_footprint(specs, dt, bs, sdt.conv, sdt.ssm, kv_layer_groups_);
  const bool hybrid = fp.state_layers > 0;
  const size_t bytes_per_block = fp.kv_bytes_per_block;
  KvBudgetInputs in;
  const size_t real_total = backend_.total_memory(), free = backend_.free_memory();
  in.total = config_.device_memory > 0 ? std::min(config_.device_memory, real_total) : real_total;
  // This process's own use where the backend recorded the free memory at its start (a discrete
  // GPU: processes that share it each count theirs); else all that is in use (CPU, unified memory).
  const bool own_use = backend_.free_memory_at_start() > 0;
  in.used = memory_in_use(real_total, free, backend_.free_memory_at_start());
  in.reserved = config_.reserved_bytes;
  in.utilization = config_.gpu_memory_utilization;
  in.cpu = backend_.device().type == DeviceType::kCPU;
  in.explicit_budget = config_.kv_cache_memory_bytes;
  in.num_blocks_override = config_.num_blocks_override;
  in.block_size = bs;
  in.max_num_seqs = config_.scheduler.max_num_seqs;
  in.max_model_len = config_.scheduler.max_model_len;
  if (!kv_layer_groups_.empty() || groups.front().spec.kind == CacheGroupKind::kSlidingWindow)
    in.blocks_per_seq = max_blocks_per_seq(groups, in.max_model_len, config_.scheduler.max_num_batched_tokens);
  if (hybrid) in.extra_state_slots = checkpoint_state_slots(in.max_num_seqs, config_.enable_prefix_caching);
  // Speculative decoding keeps the state after each of a sequence's k drafts: 1 + k slots each.
  const int slots_per_seq = config_.speculative.enabled() ? 1 + config_.speculative.num_speculative_tokens : 1;
  in.state_slots_per_seq = slots_per_seq;
  const KvBudget budget = plan_kv_budget(in, fp);
  if (config_.num_blocks_override <= 0 && config_.kv_cache_memory_bytes == 0)
    TLOG_INFO(
        "Memory: {:.2f} GiB total, {:.2f} GiB in use {}, {:.2f} GiB reserved for activations and "
        "graphs, gpu_memory_utilization {:.2f}: {:.2f} GiB for the KV cache{}",
        in.total / 1073741824.0, in.used / 1073741824.0,
        own_use ? "by this process (weights included; other processes not counted)" : "(weights included)",
        in.reserved / 1073741824.0, config_.gpu_memory_utilization, budget.budget / 1073741824.0,
        hybrid ? " and the state slots" : "");
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
  TLOG_INFO("Cache groups: {}", describe_cache_groups(groups));
  check_sequence_fits(groups, num_blocks);
  CacheInit init;
  init.num_blocks = num_blocks;
  init.block_size = bs;
  init.dtype = dt;
  init.max_model_len = max_len;
  init.max_graph_batch = config_.enforce_eager ? 0 : std::min(config_.scheduler.max_num_seqs, 256);
  init.graph_query_len = 1 + (config_.speculative.enabled() ? config_.speculative.num_speculative_tokens : 0);
  init.num_state_slots = budget.num_state_slots;
  init.conv_dtype = sdt.conv;
  init.ssm_dtype = sdt.ssm;
  init.layer_groups = kv_layer_groups_;
  executor_->init_kv_cache(init);
  cache_manager_ = std::make_unique<KvCacheCoordinator>(std::move(groups), num_blocks, config_.enable_prefix_caching,
                                                        budget.num_state_slots, hybrid ? slots_per_seq : 1);
  const KvCapacity capacity =
      kv_capacity(cache_manager_->groups(), num_blocks, max_len, config_.scheduler.max_num_batched_tokens);
  const int num_groups = num_paged_groups(kv_layer_groups_);
  TLOG_INFO("# KV cache blocks: {} of {} tokens ({} bytes each, dtype {}{})", num_blocks, bs, bytes_per_block,
            dtype_name(dt),
            num_groups > 1 ? fmt::format("; one layer of each of {} cache groups, which share them", num_groups) : "");
  TLOG_INFO("KV cache size: {} tokens", with_thousands(capacity.tokens));
  double concurrency = capacity.max_concurrency;
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

void LLMEngine::check_sequence_fits(const std::vector<CacheGroup>& groups, int num_blocks) const {
  const int max_len = config_.scheduler.max_model_len, bs = config_.block_size;
  int per_seq = 0;
  bool windowed = false;
  for (const CacheGroup& g : groups) {
    if (!g.spec.paged()) continue;
    per_seq += max_blocks_per_seq(g.spec, max_len, config_.scheduler.max_num_batched_tokens);
    windowed = windowed || g.spec.kind == CacheGroupKind::kSlidingWindow;
  }
  if (num_blocks >= per_seq) return;
  if (!windowed)
    fail(ErrorKind::kOutOfMemory,
         "The model's max seq len ({}) is larger than the maximum number of tokens that can be stored in the KV cache "
         "({}). Try increasing --gpu-memory-utilization or decreasing --max-model-len.",
         max_len, static_cast<int64_t>(num_blocks) * bs);
  fail(ErrorKind::kOutOfMemory,
       "One sequence of the model's max seq len ({}) holds up to {} KV cache blocks of {} tokens (its sliding window "
       "and a step of --max-num-batched-tokens {}), more than the {} blocks the KV cache can store. Try increasing "
       "--gpu-memory-utilization or decreasing --max-model-len or --max-num-batched-tokens.",
       max_len, per_seq, bs, config_.scheduler.max_num_batched_tokens, num_blocks);
}

Status LLMEngine::add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params) {
  // Validated at the front door (AsyncEngine::submit); a request that reaches here invalid is a bug. The
  // front door's logprobs cap is the server's (--max-logprobs, up to the vocabulary).
  const int vocab = executor_->model_config().vocab_size;
  SamplingLimits limits;
  limits.max_logprobs = vocab;
  if (Status s = validate_request(prompt, params, max_model_len(), vocab, nullptr, limits); !s.ok())
    fail(ErrorKind::kInternal, "LLMEngine::add_request got an unvalidated request {}: {}", id, s.message());
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
    if (params.constraint) {
      r->constraint = params.constraint->make();
      r->constraint_active = params.constraint_after_token < 0;
    }
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

ModelInput LLMEngine::build_input(const SchedulerOutput& sched, std::vector<LogitsRow>& rows,
                                  std::vector<Request*>& scored) const {
  ModelInput in;
  const int bs = config_.block_size;
  // One block table and slot mapping per paged group (the first groups), group after group.
  const size_t G = static_cast<size_t>(num_paged_groups(kv_layer_groups_));
  int max_blocks = 0;
  for (const auto& s : sched.scheduled)
    for (size_t g = 0; g < G; ++g) max_blocks = std::max(max_blocks, static_cast<int>(s.request->block_ids(g).size()));
  in.attention.block_size = bs;
  in.attention.max_blocks_per_seq = max_blocks;
  in.attention.num_kv_groups = static_cast<int>(G);
  in.attention.query_start_loc.push_back(0);
  std::vector<std::vector<int32_t>> group_slots(G - 1), group_tables(G - 1);  // groups 1.. until the end
  const bool hybrid = cache_manager_->has_state_slots();
  bool spec_step = false;
  for (const auto& s : sched.scheduled) spec_step = spec_step || s.num_draft_tokens > 0;
  for (const auto& s : sched.scheduled) {
    Request& r = *s.request;
    const int begin = r.num_computed_tokens, end = begin + s.num_new_tokens;
    const int row0 = static_cast<int>(in.token_ids.size());  // the row of position `begin`
    for (int i = begin; i < end; ++i) {
      in.token_ids.push_back(r.token_at(i));
      in.positions.push_back(i);
      in.attention.slot_mapping.push_back(r.kv_slot(i, bs));
    }
    in.attention.query_start_loc.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.attention.seq_lens.push_back(end);
    r.append_block_table(in.attention.block_tables, max_blocks);
    for (size_t g = 1; g < G; ++g) {
      for (int i = begin; i < end; ++i) group_slots[g - 1].push_back(r.kv_slot(i, bs, g));
      r.append_block_table(group_tables[g - 1], max_blocks, g);
    }
    if (hybrid) {
      in.linear.state_slots.push_back(s.state_slot);
      in.linear.has_initial_state.push_back(s.has_initial_state ? 1 : 0);
      if (spec_step) add_token_state_slots(s, in.linear);
    }
    // Prompt logprobs: the logits of every prompt position in this chunk not scored yet (the scheduler
    // bounded how many).
    if (r.wants_prompt_logprobs())
      for (int p = std::max(begin, r.prompt_logprob_next()); p < std::min(end, r.prompt_logprob_end()); ++p) {
        in.logits_indices.push_back(row0 + p - begin);
        rows.push_back({&r, p});
      }
    if (end == r.num_tokens() + s.num_draft_tokens) {
      // Caught up: the last position's logits give the next token; with drafts, each draft's
      // position's too (the token the target samples there, to compare with the next draft).
      if (r.output.empty() && r.params.max_tokens == 0) {
        scored.push_back(&r);  // scoring only: nothing to generate
        continue;
      }
      const int T = static_cast<int>(in.token_ids.size());
      for (int j = 0; j <= s.num_draft_tokens; ++j) {
        in.logits_indices.push_back(T - 1 - s.num_draft_tokens + j);
        rows.push_back({&r, -1, j, s.num_draft_tokens});
      }
    }
  }
  for (size_t g = 1; g < G; ++g) {
    const auto& slots = group_slots[g - 1];
    const auto& table = group_tables[g - 1];
    in.attention.slot_mapping.insert(in.attention.slot_mapping.end(), slots.begin(), slots.end());
    in.attention.block_tables.insert(in.attention.block_tables.end(), table.begin(), table.end());
  }
  if (hybrid) {
    in.linear.query_start_loc = in.attention.query_start_loc;
    in.state_copies = sched.state_copies;
  }
  return in;
}

void LLMEngine::add_token_state_slots(const ScheduledRequest& s, LinearAttnLayout& linear) const {
  // The state after each token of a verification chunk goes to its own slot (the one after the
  // last accepted token is kept); other sequences' after their last token, as without
  // speculation, in place.
  const Request& r = *s.request;
  const int begin = r.num_computed_tokens, end = begin + s.num_new_tokens;
  for (int i = begin; i < end; ++i) {
    const int j = i - (end - 1 - s.num_draft_tokens);
    linear.token_state_slots.push_back(s.num_draft_tokens > 0 ? cache_manager_->draft_state_slot(r, j)
                                       : i == end - 1         ? s.state_slot
                                                              : -1);
  }
}

void LLMEngine::step_sampling(const std::vector<LogitsRow>& rows, StepSampling& sampling) {
  std::vector<size_t> constrained;  // row 0 of each constrained sequence sampled on the device
  for (size_t i = 0; i < rows.size(); ++i) {
    const Request& r = *rows[i].request;
    // (min_tokens: if a sequence's row 0 needs the host, so may its later ones; the host samples them all.)
    if (rows[i].prompt_pos >= 0 || needs_host_sampling(r)) {
      sampling.host_rows.push_back(static_cast<int32_t>(i));
      sampling.rows.emplace_back();  // greedy (cheap); the host samples this row or scores the prompt
    } else {
      sampling.rows.push_back(sampling_row(r));
      sampling.rows.back().position += static_cast<uint64_t>(rows[i].draft);  // output position of the row's token
      if (!r.constraint || rows[i].draft != 0) continue;
      // A row is masked where the constraint applies: from row 0 when it is active, else from the row
      // after the draft that ends the reasoning.
      const auto drafts = r.spec_tokens.begin() + rows[i].drafts;
      if (r.constraint_active || std::find(r.spec_tokens.begin(), drafts, r.params.constraint_after_token) != drafts)
        constrained.push_back(i);
    }
  }
  if (!constrained.empty()) start_token_masks(rows, constrained, sampling);
}

// Row j of a constrained sequence (first: its row 0) is sampled in the constraint's state after drafts
// 0..j-1: the constraint advances through them for the masks, then steps back (take_tokens advances it by
// the tokens taken). Rows after a draft the constraint refuses are never taken (the target cannot draw that
// draft there): they stay unmasked. Each sequence is one task of mask_pool_ (its constraint on one thread),
// filling its rows' masks into its own slots while the engine thread goes on to the forward; the used
// slots are then packed in row order (finish_token_masks, when the executor first needs them).
void LLMEngine::start_token_masks(const std::vector<LogitsRow>& rows, const std::vector<size_t>& firsts,
                                  StepSampling& sampling) {
  MaskFill& f = mask_fill_;
  TESSERA_CHECK(!f.pending, "a step's token masks started before the last step's were done");
  f.rows = &rows;
  f.sampling = &sampling;
  f.words = static_cast<size_t>((executor_->model_config().vocab_size + 31) / 32);
  f.firsts = firsts;
  const size_t n = firsts.size();
  f.slot0.assign(n + 1, 0);
  for (size_t k = 0; k < n; ++k) f.slot0[k + 1] = f.slot0[k] + static_cast<size_t>(rows[firsts[k]].drafts) + 1;
  f.slot_row.assign(f.slot0[n], -1);
  f.errors.assign(n, std::string());
  for (size_t k = 0; k < n; ++k)  // (firsts ascend, and a sequence's rows are consecutive)
    for (int j = 0; j <= rows[firsts[k]].drafts; ++j)
      sampling.constrained_rows.push_back(static_cast<int32_t>(firsts[k]) + j);
  sampling.mask_words = static_cast<int32_t>(f.words);
  sampling.masks.swap(mask_store_);  // (every word of a used slot is written: no need to clear it)
  sampling.masks.resize(f.slot0[n] * f.words);
  f.masks = reinterpret_cast<uint32_t*>(sampling.masks.data());
  f.pending = true;
  if (config_.mask_threads < 0) {
    for (size_t k = 0; k < n; ++k) fill_token_masks_of(k);
    finish_token_masks();
    return;
  }
  if (!mask_pool_)
    mask_pool_ = std::make_unique<BackgroundTasks>(config_.mask_threads > 0 ? config_.mask_threads
                                                                            : BackgroundTasks::default_threads());
  mask_pool_->start(static_cast<int64_t>(n), [this](int64_t k) { fill_token_masks_of(static_cast<size_t>(k)); });
  sampling.await_masks = [this] { finish_token_masks(); };
}

void LLMEngine::fill_token_masks_of(size_t k) {
  MaskFill& f = mask_fill_;
  const size_t first = f.firsts[k];
  Request& r = *(*f.rows)[first].request;
  const int drafts = (*f.rows)[first].drafts;
  bool active = r.constraint_active;
  int advanced = 0;
  try {
    for (int j = 0; j <= drafts; ++j) {
      if (active) {
        const size_t slot = f.slot0[k] + static_cast<size_t>(j);
        f.slot_row[slot] = static_cast<int32_t>(first) + j;
        r.constraint->fill_mask(std::span(f.masks + slot * f.words, f.words));
      }
      if (j == drafts) break;
      const int32_t d = r.spec_tokens[static_cast<size_t>(j)];
      if (!active) {
        active = d == r.params.constraint_after_token;
      } else if (r.constraint->accept(d)) {
        ++advanced;
      } else {
        break;
      }
    }
    if (advanced > 0) r.constraint->rollback(advanced);
  } catch (const std::exception& e) {
    f.errors[k] = e.what();
  } catch (...) {
    f.errors[k] = "an exception that is not a std::exception";
  }
  if (!f.errors[k].empty())  // (its rows go unmasked; the sequence ends at this step)
    std::fill(f.slot_row.begin() + static_cast<std::ptrdiff_t>(f.slot0[k]),
              f.slot_row.begin() + static_cast<std::ptrdiff_t>(f.slot0[k + 1]), -1);
}

void LLMEngine::finish_token_masks() {
  MaskFill& f = mask_fill_;
  if (!f.pending) return;
  f.pending = false;
  if (mask_pool_) mask_pool_->wait();  // (the tasks catch what the constraints throw)
  StepSampling& sampling = *f.sampling;
  const size_t words = f.words;
  size_t used = 0;
  for (size_t slot = 0; slot < f.slot_row.size(); ++slot) {
    if (f.slot_row[slot] < 0) continue;
    sampling.mask_rows.push_back(f.slot_row[slot]);
    if (used != slot) std::memmove(f.masks + used * words, f.masks + slot * words, words * sizeof(uint32_t));
    ++used;
  }
  sampling.masks.resize(used * words);
  for (size_t k = 0; k < f.firsts.size(); ++k) {
    if (f.errors[k].empty()) continue;
    Request& r = *(*f.rows)[f.firsts[k]].request;
    r.constraint_error =
        fmt::format("the output constraint ({}) failed: {}", r.params.constraint->describe(), f.errors[k]);
  }
}

void LLMEngine::abandon_token_masks() noexcept {
  if (!mask_fill_.pending) return;
  mask_fill_.pending = false;
  try {
    if (mask_pool_) mask_pool_->wait();
  } catch (const std::exception& e) {
    TLOG_ERROR("token masks of a failed step: {}", e.what());
  } catch (...) {
  }
}

std::vector<RequestOutput> LLMEngine::step() {
  std::vector<RequestOutput> out;
  timer_.start();
  SchedulerOutput sched = scheduler_->schedule();
  timer_.mark(0, "schedule");
  if (sched.scheduled.empty()) return out;
  ++stats_.steps;
  const auto now = std::chrono::steady_clock::now();
  uint64_t step_tokens = 0;
  for (const auto& s : sched.scheduled) {
    Request* r = s.request;
    step_tokens += static_cast<uint64_t>(s.num_new_tokens);
    if (r->num_computed_tokens == r->num_cached_tokens && r->output.empty() && r->num_preemptions == 0) {
      stats_.prompt_tokens += r->prompt.size();
      stats_.prefix_cache_queries += r->prompt.size();
      stats_.prefix_cache_hit_tokens += static_cast<uint64_t>(r->num_cached_tokens);
    }
    if (r->scheduled_at == std::chrono::steady_clock::time_point{}) r->scheduled_at = now;
  }
  count_iteration_tokens(step_tokens);
  // (Before the input: the blocks the MTP passes write go into the block tables.)
  if (spec_) spec_->plan_step(sched, scheduler_->num_running(), *cache_manager_);
  std::vector<LogitsRow> rows;
  std::vector<Request*> scored;
  ModelInput in = build_input(sched, rows, scored);
  const int vocab = executor_->model_config().vocab_size;
  StepSampling sampling;
  step_sampling(rows, sampling);  // (the constrained rows' masks are filled while the forward runs)
  // The fill reads `rows` and writes `sampling`: it ends before they do, also when the step fails.
  struct MaskFillEnd {
    LLMEngine& e;
    ~MaskFillEnd() { e.abandon_token_masks(); }
  } mask_fill_end{*this};
  // Every step runs the lm_head, even when only chunked prefills advanced (one row, unused).
  if (in.logits_indices.empty()) {
    in.logits_indices.push_back(0);
    sampling.rows.emplace_back();
  }
  timer_.mark(1, "build input");
  if (spec_)
    spec_->execute(in, sampling, step_out_);
  else
    executor_->execute(in, sampling, step_out_);
  sampling.wait_masks();  // (the executor waited before sampling; the constraints are the engine's again)
  timer_.mark(2, "execute");
  scheduler_->on_step_done(sched);

  size_t next_host = 0;
  std::vector<Request*> decoding;
  size_t seq = 0;  // generating sequences so far
  for (size_t i = 0; i < rows.size();) {
    const LogitsRow& row = rows[i];
    if (row.prompt_pos >= 0) {  // raw logits, as vLLM's prompt logprobs
      Request* r = row.request;
      const float* logits = host_logits(sampling, next_host, static_cast<int>(i));
      TESSERA_CHECK(logits && row.prompt_pos == r->prompt_logprob_next(), "prompt logprobs of {} out of order", r->id);
      r->prompt_logprobs.push_back(
          token_logprobs(logits, vocab, r->prompt[row.prompt_pos + 1], r->params.prompt_logprobs));
      ++r->prompt_logprobs_done;
      ++i;
      continue;
    }
    Request* r = row.request;  // dangles once take_tokens retires it
    int accepted = 0;
    const bool goes_on = take_tokens(rows, static_cast<int>(i), sampling, next_host, out, accepted);
    if (goes_on) decoding.push_back(r);
    if (spec_) spec_->note_verification(seq, row.drafts, accepted, goes_on ? r : nullptr);
    i += 1 + static_cast<size_t>(row.drafts);
    ++seq;
  }
  // max_tokens 0: the prompt is scored; the request ends there ("length", as vLLM reports it).
  for (Request* r : scored) {
    RequestOutput o = output_of(*r);
    o.prompt_logprobs = std::move(r->prompt_logprobs);
    o.finished = true;
    o.finish_reason = FinishReason::kLength;
    retire(r);
    out.push_back(std::move(o));
  }
  if (spec_) spec_->finish_step(decoding, scheduler_->num_running(), *cache_manager_);
  if (sampling.mask_words > 0) mask_store_.swap(sampling.masks);
  timer_.mark(3, "outputs");
  timer_.pass_done();
  return out;
}

float* LLMEngine::host_logits(const StepSampling& sampling, size_t& next_host, int row) {
  if (next_host >= sampling.host_rows.size() || sampling.host_rows[next_host] != row) return nullptr;
  const size_t vocab = static_cast<size_t>(executor_->model_config().vocab_size);
  return step_out_.host_logits.data() + next_host++ * vocab;
}

void LLMEngine::count_iteration_tokens(uint64_t tokens) {
  size_t b = 0;
  while (b < kNumIterationTokensBuckets && tokens > static_cast<uint64_t>(kIterationTokensBuckets[b])) ++b;
  ++stats_.iteration_tokens[b];
  stats_.iteration_tokens_sum += tokens;
}

RequestOutput LLMEngine::output_of(const Request& r) const {
  RequestOutput o;
  o.request_id = r.id;
  o.scheduled_at = r.scheduled_at;
  o.num_prompt_tokens = static_cast<int>(r.prompt.size());
  o.num_output_tokens = static_cast<int>(r.output.size());
  o.num_cached_tokens = r.num_cached_tokens;
  return o;
}

void LLMEngine::advance_constraint(Request& r, int32_t token) {
  if (!r.constraint_active) {
    r.constraint_active = token == r.params.constraint_after_token;  // the reasoning ended: constrained from here
    return;
  }
  if (r.constraint->accept(token)) return;
  // Only a masked draw reaches here; a constraint that refuses its own choice is a bug in it. The sequence
  // goes on unconstrained rather than stopping the engine.
  TLOG_WARN(
      "request {}: the output constraint ({}) refused token {} it allowed; the rest of this output is "
      "not constrained",
      r.id, r.params.constraint->describe(), token);
  r.constraint_active = false;
  r.constraint.reset();
}

FinishReason LLMEngine::finish_reason_after(Request& r, int32_t token) const {
  const SamplingParams& p = r.params;
  const bool min_reached = static_cast<int>(r.output.size()) > p.min_tokens;
  if ((!p.ignore_eos && min_reached && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) ||
      (min_reached && std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end())) {
    r.stop_token = token;
    return FinishReason::kStop;
  }
  if (static_cast<int>(r.output.size()) >= p.max_tokens || r.num_tokens() >= max_model_len())
    return FinishReason::kLength;
  return FinishReason::kNone;
}

bool LLMEngine::take_tokens(const std::vector<LogitsRow>& rows, int first, const StepSampling& sampling,
                            size_t& next_host, std::vector<RequestOutput>& out, int& accepted) {
  Request* r = rows[static_cast<size_t>(first)].request;
  const int drafts = rows[static_cast<size_t>(first)].drafts, vocab = executor_->model_config().vocab_size;
  RequestOutput o = output_of(*r);
  if (r->output.empty() && r->params.prompt_logprobs >= 0) o.prompt_logprobs = std::move(r->prompt_logprobs);
  FinishReason reason = FinishReason::kNone;
  accepted = 0;
  if (!r->constraint_error.empty()) {  // its rows were not masked: none of its tokens is taken
    reason = FinishReason::kError;
    o.error = fmt::format("step {}: request {} at output token {}: {}", stats_.steps, r->id, r->output.size(),
                          r->constraint_error);
    TLOG_ERROR("{}", o.error);
  }
  for (int j = 0; j <= drafts && reason == FinishReason::kNone; ++j) {
    SampleResult res;
    // The host sampler sees the tokens accepted so far (penalties, min_tokens, position).
    if (float* logits = host_logits(sampling, next_host, first + j))
      res = sampler_.sample(logits, vocab, *r, eos_ids_);
    else
      res.token = step_out_.tokens[static_cast<size_t>(first + j)];
    if (res.token < 0) {  // the row's logits held NaN or +inf (Backend::sample): fail this request only
      reason = FinishReason::kError;
      o.error = fmt::format(
          "step {}: the logits for output token {} of request {} hold NaN or Inf, so no token could be sampled; "
          "the model's weights or activations are broken (check the weights with --check-weights or `tessera "
          "doctor --verify-weights MODEL`)",
          stats_.steps, r->output.size(), r->id);
      TLOG_ERROR("{}", o.error);
      break;
    }
    r->output.push_back(res.token);
    if (r->constraint) advance_constraint(*r, res.token);
    ++stats_.generation_tokens;
    o.new_token_ids.push_back(res.token);
    if (res.logprob) o.logprobs.push_back(*res.logprob);
    reason = finish_reason_after(*r, res.token);
    if (reason != FinishReason::kNone || j == drafts || res.token != r->spec_tokens[static_cast<size_t>(j)]) break;
    ++accepted;  // draft j was right: row j + 1's token follows it
  }
  if (drafts > 0)
    TLOG_DEBUG("speculative decoding: {} at {} tokens: drafts {} -> {} accepted (tokens {})", r->id,
               r->num_tokens() - static_cast<int>(o.new_token_ids.size()), fmt::join(r->spec_tokens, " "), accepted,
               fmt::join(o.new_token_ids, " "));
  // The rows after a rejected draft are not used.
  while (next_host < sampling.host_rows.size() && sampling.host_rows[next_host] <= first + drafts) ++next_host;
  o.num_output_tokens = static_cast<int>(r->output.size());
  const bool goes_on = reason == FinishReason::kNone;
  if (goes_on) {
    scheduler_->accept_drafts(*r, accepted);
  } else {
    o.finished = true;
    o.finish_reason = reason;
    o.stop_token = r->stop_token;
    retire(r);
  }
  out.push_back(std::move(o));
  return goes_on;
}

void LLMEngine::set_proposer(std::unique_ptr<Proposer> p) {
  TESSERA_CHECK(spec_, "set_proposer without --speculative-config");
  spec_->set_proposer(std::move(p));
}

const std::vector<std::pair<int, double>>& LLMEngine::speculation_costs() const {
  static const std::vector<std::pair<int, double>> none;
  return spec_ ? spec_->costs() : none;
}

bool LLMEngine::add_random_request(const std::string& id, int len, int max_tokens, std::mt19937_64& rng) {
  const int vocab = executor_->model_config().vocab_size;
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  std::vector<int32_t> prompt(static_cast<size_t>(len));
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return validate_request(prompt, p, max_model_len(), vocab).ok() && add_request(id, std::move(prompt), p).ok();
}

void LLMEngine::end_internal_run(const EngineStats& saved) {
  stats_ = saved;
  if (spec_) spec_->end_internal_run();
}

int LLMEngine::warm_up() {
  const auto start = std::chrono::steady_clock::now();
  // Room for the prompt and the decode steps (with k drafts each when speculating).
  const int k = spec_ ? spec_->num_speculative_tokens() : 0;
  const int len = std::min(kWarmUpPrompt, max_model_len() - (kWarmUpDecode + 1) * (k + 1) - 1);
  // (A host proposer, ngram, drafts every count in turn: room for one round of them even where they are accepted.)
  const int tokens = std::min(kWarmUpDecode + 1 + (spec_ ? spec_->warm_up_extra_tokens() : 0),
                              std::max(kWarmUpDecode + 1, max_model_len() - len - 1));
  std::mt19937_64 rng(0x7e55e7a);
  const std::string id = "tessera-warm-up";
  if (len < 1 || !add_random_request(id, len, tokens, rng)) {
    TLOG_DEBUG("warm-up skipped: no room for a {}-token request", kWarmUpPrompt);
    return 0;
  }
  const EngineStats saved = stats_;
  if (spec_) spec_->begin_internal_run(true);  // (drafting is not turned off while it runs)
  int steps = 0;
  while (has_unfinished() && steps < 4 * tokens + len) {
    step();
    ++steps;
  }
  if (has_unfinished()) abort(id);
  end_internal_run(saved);
  const char* graphs = !captures_graphs() ? ""
                       : k > 0            ? " (the batch-1 decode and verification graphs are captured)"
                                          : " (the batch-1 decode graph is captured)";
  TLOG_INFO("Warm-up: a {}-token request through prefill and decode, {} steps in {:.2f} s{}", len, steps,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), graphs);
  return steps;
}

double LLMEngine::time_calibration_steps(int batch, bool drafts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> ids;
  for (int b = 0; b < batch; ++b) {
    const std::string id = fmt::format("tessera-calibration-{}-{}-{}", drafts ? "drafts" : "plain", batch, b);
    // (--max-model-len too short for it: no figure)
    if (!add_random_request(id, SpecDecoder::kCalibrationPrompt, spec_->calibration_max_tokens(), rng)) break;
    ids.push_back(id);
    if (!drafts) requests_.at(id)->spec_off = true;
  }
  std::vector<double> times;
  int warm = 0;
  while (static_cast<int>(ids.size()) == batch && has_unfinished() &&
         static_cast<int>(times.size()) < SpecDecoder::kCalibrationSteps) {
    bool decoding = scheduler_->num_waiting() == 0;
    for (const auto& [id, r] : requests_) decoding = decoding && !r->output.empty();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (decoding && ++warm > SpecDecoder::kCalibrationWarm) times.push_back(dt);
  }
  for (const std::string& id : ids) abort(id);
  if (static_cast<int>(times.size()) < SpecDecoder::kCalibrationSteps) return 0;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void LLMEngine::calibrate_speculation() {
  const EngineStats saved = stats_;
  spec_->calibrate(
      [this](int batch, bool drafts, uint64_t seed) { return time_calibration_steps(batch, drafts, seed); },
      config_.scheduler.max_num_seqs, *cache_manager_);
  stats_ = saved;
}

EngineStats LLMEngine::stats() const {
  EngineStats s = stats_;
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  s.kv_cache_usage = cache_manager_->pool().usage();
  s.num_preemptions = scheduler_->num_preemptions();
  if (spec_) {
    s.spec = spec_->stats();
    s.num_speculative_tokens = spec_->num_speculative_tokens();
  }
  return s;
}

}  // namespace tessera
