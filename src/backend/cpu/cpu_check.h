// The CPU backend's argument check, shared by its files: a failed condition is an internal error
// that names the op.
#pragma once
#include <string>

#include "core/error.h"

namespace tessera::cpu {

inline void require(bool cond, const char* op, const std::string& what) {
  if (!cond) fail(ErrorKind::kInternal, "cpu {}: {}", op, what);
}

}  // namespace tessera::cpu
