// The memory planner from the command line: `tessera plan`'s inputs from the serve flags, and
// the check `serve` / `generate` run before they load anything (src/plan/planner.h).
#pragma once
#include "cli/engine_flags.h"
#include "plan/planner.h"

namespace tessera::cli {

// The serve flags as planner inputs (the target is left to the caller).
plan::PlanInputs plan_inputs(const EngineFlags& f);

// This machine as the target: `backend`'s device, its memory (or --gpu-memory, whichever is
// smaller) and what is in use on it now.
plan::Target local_target(const EngineFlags& f, const Backend& backend);

// Plans this configuration on `backend`'s device before any weight is read; fails with the
// plan's sentence when it cannot fit, else fills `ec`'s planned figures and reserves.
// With `nodes` > 1 (the job's nodes, TP x PP / nodes ranks each) it also logs what a batch-1 decode step sends
// between the nodes (plan/network_cost.h).
void plan_or_fail(const EngineFlags& f, const Backend& backend, EngineConfig& ec, int nodes = 1);

// The same check from the flags alone, on a backend made for the purpose (serve calls it
// before the tokenizer, the rendezvous and the weights); silent when the plan fits.
void plan_or_fail(const EngineFlags& f);

}  // namespace tessera::cli
