// One table of op checks for every backend, in the style of llama.cpp's test-backend-ops. Each
// case makes its inputs once (seeded, rounded to bf16 so that every backend holds them exactly),
// runs one Backend op on the backend under test and returns the outputs as host values; the
// same case's plain double-precision reference (op_reference.h) gives the expected values.
//   cpu_ops_test:  the CPU backend against the reference, and every op declared in
//                  backend/backend.h must have a case (a new op without one fails);
//   cuda_ops_test: the CUDA backend against the CPU backend (itself checked as above), so a
//                  new op implemented for the CPU and forgotten for CUDA fails on the GPU.
// Tolerances are relative errors ||got - want|| / ||want|| per output, by the dtype the backend
// computes in (f32 on the CPU, bf16 on CUDA); ids and copies must match exactly.
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tessera::optest {

// One output of a case, downloaded to the host.
struct Output {
  std::string name;
  std::vector<double> values;
  bool exact = false;  // ids, copies, casts: every element equal
};
using Outputs = std::vector<Output>;

struct OpCase {
  std::string op;    // the Backend member it checks ("rms_norm")
  std::string name;  // the op and its shape, unique: the test's name
  // Runs the op on `be` from the case's inputs. Outputs are poisoned (NaN) before the op.
  std::function<Outputs(Backend& be)> run;
  // The expected outputs, computed on the host in double.
  std::function<Outputs()> reference;
  double tol_f32 = 1e-5;   // the backend computes in f32
  double tol_bf16 = 1e-2;  // the backend computes in bf16
  double tolerance(const Backend& be) const { return be.compute_dtype() == DType::kF32 ? tol_f32 : tol_bf16; }
};

// gtest prints a case by its name.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// Every case, built once.
const std::vector<OpCase>& op_cases();

// "" when `got` matches `want` within `tol` (exact outputs exactly), else what differs. NaN or
// infinity in `got` where `want` is finite never matches.
std::string compare(const Outputs& got, const Outputs& want, double tol);

// The ops of the Backend interface: the virtual members declared after the "---- ops" line of
// backend/backend.h (`header` is that file's text), in order.
std::vector<std::string> declared_backend_ops(const std::string& header);

// A gtest-safe name ("rms_norm_T7_D100").
std::string test_name(const std::string& case_name);

}  // namespace tessera::optest
