#include "loader/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json_depth.h"

namespace tessera {

namespace fs = std::filesystem;

Checkpoint::Checkpoint(const std::string& model_dir, size_t read_chunk_bytes, StagedReader::Mode read_mode)
    : dir_(model_dir), reader_(std::make_unique<StagedReader>(read_chunk_bytes, read_mode)) {
  fs::path dir(model_dir);
  fs::path index = dir / "model.safetensors.index.json";
  std::vector<std::string> names;
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      std::ifstream f(index, std::ios::binary);
      std::ostringstream text;
      text << f.rdbuf();
      check_json_file_depth(text.view(), index.string());
      j = nlohmann::json::parse(text.view());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(ErrorKind::kCorrupt, "{}: does not parse ({})", index.string(), json_error_text(e));
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail(ErrorKind::kCorrupt, "{}: has no weight_map object", index.string());
    std::set<std::string> shards;
    for (auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string())
        fail(ErrorKind::kCorrupt, "{}: weight_map['{}'] is not a file name", index.string(), tensor);
      std::string f = file.get<std::string>();
      // Shards live in the model directory: no paths, so an index cannot reach other files.
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        fail(ErrorKind::kCorrupt, "{}: tensor '{}': shard name '{}' must be a plain file name in the model directory",
             index.string(), tensor, f);
      shards.insert(f);
      index_map_.emplace(tensor, f);
    }
    if (shards.empty()) fail(ErrorKind::kCorrupt, "{}: weight_map lists no tensors", index.string());
    names.assign(shards.begin(), shards.end());
    index_path_ = index.string();
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
  for (const auto& n : names) {
    try {
      files_.push_back(std::make_shared<SafetensorsFile>((dir / n).string()));
    } catch (const Error& e) {
      if (index_path_.empty()) throw;
      // Name a tensor the index places in this shard, so the user knows what is at stake.
      std::string example;
      size_t count = 0;
      for (const auto& [tensor, file] : index_map_)
        if (file == n && count++ == 0) example = tensor;
      throw Error(e.kind(), fmt::format("{} (model.safetensors.index.json maps tensor '{}'{} to this shard)", e.what(),
                                        example, count > 1 ? fmt::format(" and {} others", count - 1) : ""));
    }
  }
}

bool Checkpoint::contains(const std::string& name) const {
  for (const auto& f : files_)
    if (f->find(name)) return true;
  return false;
}

CheckpointTensor Checkpoint::get(const std::string& name) const {
  for (const auto& f : files_)
    if (const TensorInfo* t = f->find(name)) return {t, f, reader_.get()};
  if (auto it = index_map_.find(name); it != index_map_.end())
    fail(ErrorKind::kNotFound, "{}: missing tensor '{}' (model.safetensors.index.json maps it to this shard)",
         (fs::path(dir_) / it->second).string(), name);
  if (files_.size() == 1) fail(ErrorKind::kNotFound, "{}: missing tensor '{}'", files_[0]->path(), name);
  fail(ErrorKind::kNotFound, "{}: missing tensor '{}' (in none of the {} shards{})", dir_, name, files_.size(),
       index_path_.empty() ? "" : " nor in model.safetensors.index.json");
}

}  // namespace tessera
