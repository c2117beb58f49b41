#include "loader/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace tessera {

namespace fs = std::filesystem;

Checkpoint::Checkpoint(const std::string& model_dir) : dir_(model_dir) {
  fs::path dir(model_dir);
  fs::path index = dir / "model.safetensors.index.json";
  std::vector<std::string> names;
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      std::ifstream f(index);
      j = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      fail(ErrorKind::kCorrupt, "{}: does not parse ({})", index.string(), e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail(ErrorKind::kCorrupt, "{}: has no weight_map object", index.string());
    std::set<std::string> shards;
    for (auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail(ErrorKind::kCorrupt, "{}: weight_map['{}'] is not a file name", index.string(), tensor);
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == "..")
        fail(ErrorKind::kCorrupt, "{}: shard name '{}' must be a plain file name", index.string(), f);
      shards.insert(f);
    }
    names.assign(shards.begin(), shards.end());
  } else if (fs::exists(dir / "model.safetensors")) {
    names.push_back("model.safetensors");
  } else {
    if (!fs::is_directory(dir)) fail(ErrorKind::kNotFound, "{}: model directory not found", model_dir);
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    if (names.empty())
      fail(ErrorKind::kNotFound,
           "{}: no model.safetensors, model.safetensors.index.json or *.safetensors file; pass --load-format dummy "
           "to run with random weights",
           model_dir);
  }
  for (const auto& n : names) files_.push_back(std::make_shared<SafetensorsFile>((dir / n).string()));
}

bool Checkpoint::contains(const std::string& name) const {
  for (const auto& f : files_)
    if (f->find(name)) return true;
  return false;
}

CheckpointTensor Checkpoint::get(const std::string& name) const {
  for (const auto& f : files_)
    if (const TensorInfo* t = f->find(name)) return {t, f};
  std::string where = files_.size() == 1 ? files_[0]->path() : dir_ + " (" + std::to_string(files_.size()) + " shards)";
  fail(ErrorKind::kNotFound, "{}: missing tensor '{}'", where, name);
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->file_size();
  return n;
}

}  // namespace tessera
