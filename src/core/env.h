// On/off switches read from the environment (TESSERA_PDL=0, TESSERA_STEP_TIMING=1, ...).
// Header-only and C++17, so the CUDA kernel files can use it too.
#pragma once
#include <cstdlib>
#include <string_view>

namespace tessera {

// `fallback` unless the variable is set to the other one of "0" and "1": a switch that is
// on by default goes off only for "0", one that is off by default goes on only for "1".
inline bool env_switch(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  if (!e) return fallback;
  return fallback ? std::string_view(e) != "0" : std::string_view(e) == "1";
}

}  // namespace tessera
