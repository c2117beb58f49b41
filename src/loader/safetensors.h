// One .safetensors file, memory-mapped. The header is validated against the file
// before any tensor is handed out, so a bad file fails at open with a message that
// names the file and the tensor, never with a crash later.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tessera {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  size_t offset = 0;  // from the start of the file
  size_t bytes = 0;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws Error
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const void* data(const TensorInfo& t) const { return static_cast<const char*>(map_) + t.offset; }
  // Header bytes (8-byte length + JSON), for fingerprints.
  std::string_view header_bytes() const { return {static_cast<const char*>(map_), header_end_}; }
  // A host tensor that borrows the mapping (zero copy); keeps the file mapped while alive.
  // Its data may be unaligned (the data section starts right after the header, whose
  // length writers need not pad to 8): read it through convert_host, not data<T>().
  Tensor view(const TensorInfo& t, std::shared_ptr<SafetensorsFile> self) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  size_t header_end_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace tessera
