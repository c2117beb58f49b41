// A Hugging Face model directory's weights: model.safetensors, or shards listed in
// model.safetensors.index.json. Tensors are found by name across shards; their bytes are read
// through the checkpoint's StagedReader (bounded buffer, O_DIRECT or dropped pages), so loading
// leaves neither a mapping nor the file's pages behind.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loader/safetensors.h"
#include "loader/staged_reader.h"

namespace tessera {

struct CheckpointTensor {
  const TensorInfo* info = nullptr;
  std::shared_ptr<SafetensorsFile> file;
  StagedReader* reader = nullptr;  // the checkpoint's: reads this tensor's bytes
};

class Checkpoint {
 public:
  // `read_chunk_bytes` / `read_mode`: the StagedReader's buffer and mode (O_DIRECT where taken).
  explicit Checkpoint(const std::string& model_dir, size_t read_chunk_bytes = StagedReader::kDefaultChunkBytes,
                      StagedReader::Mode read_mode = StagedReader::Mode::kAuto);  // throws Error
  // Throws a "missing tensor" error naming the tensor and the file that should hold it.
  CheckpointTensor get(const std::string& name) const;
  bool contains(const std::string& name) const;
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  // The reader every CheckpointTensor reads through (its statistics: bytes, time, mode per file).
  StagedReader& reader() const { return *reader_; }

 private:
  std::string dir_;
  std::string index_path_;                        // empty without model.safetensors.index.json
  std::map<std::string, std::string> index_map_;  // tensor -> shard file name, from the index
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::unique_ptr<StagedReader> reader_;
};

}  // namespace tessera
