// This node's GPUs, driver and CUDA version for its NodeFacts: NVML (nvml.h) first; where it
// cannot answer, the kernel module's /proc/driver/nvidia/version for the driver alone.
#pragma once
#include <string>

#include "doctor/doctor.h"

namespace tessera::doctor {

// Fills f.gpus ("NVIDIA H200, 143771 MiB"), f.compute_caps, f.driver, f.cuda, f.p2p (with more
// than one GPU), f.nvml_errors, and f.gpu_query when no GPU was found. `nvml_library`: what
// dlopen is given (kNvmlLibrary; tests pass a fake or a missing one).
void collect_gpus(NodeFacts& f, const std::string& nvml_library);

// The driver version in the first line of /proc/driver/nvidia/version ("NVRM version: NVIDIA
// UNIX x86_64 Kernel Module  570.86.15  ..." or "... Open Kernel Module for x86_64  580.95.05
// ..."): the first word after "Kernel Module" that starts with a digit; "" when there is none.
std::string driver_from_proc_version(const std::string& line);

}  // namespace tessera::doctor
