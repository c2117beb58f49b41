// A copy of a fixture model (config.json + model.safetensors) whose one tensor is NaN in the file: what
// --check-weights, `doctor --verify-weights` and the sampler's NaN check must catch.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace tessera::testing {

// Copies `src` into a fresh temporary folder named after `tag` and overwrites tensor `name` with NaN (in the
// tensor's own dtype); returns the folder (the caller removes it).
inline std::filesystem::path copy_with_nan_tensor(const std::filesystem::path& src, const std::string& tag,
                                                  const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / (tag + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(src / f, dir / f);
  std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json t = nlohmann::json::parse(header).at(name);
  const auto offsets = t.at("data_offsets").get<std::vector<uint64_t>>();
  const DType dt = dtype_from_safetensors(t.at("dtype").get<std::string>()).value();
  std::vector<char> bytes(offsets[1] - offsets[0]);
  std::vector<float> nan(bytes.size() / dtype_size(dt), std::numeric_limits<float>::quiet_NaN());
  convert_host(nan.data(), DType::kF32, bytes.data(), dt, nan.size());
  f.seekp(static_cast<std::streamoff>(8 + header_len + offsets[0]));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return dir;
}

}  // namespace tessera::testing
