// A Hugging Face model directory's weights: model.safetensors, or shards listed in
// model.safetensors.index.json. Tensors are found by name across shards.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loader/safetensors.h"

namespace tessera {

struct CheckpointTensor {
  const TensorInfo* info = nullptr;
  std::shared_ptr<SafetensorsFile> file;
};

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& model_dir);  // throws Error
  // Throws a "missing tensor" error naming the tensor and the file that should hold it.
  CheckpointTensor get(const std::string& name) const;
  bool contains(const std::string& name) const;
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::string index_path_;                        // empty without model.safetensors.index.json
  std::map<std::string, std::string> index_map_;  // tensor -> shard file name, from the index
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
};

}  // namespace tessera
