// One .safetensors file. The header is read (pread, its pages dropped from the page cache after)
// and validated against the file before any tensor is handed out, so a bad file fails at open
// with a message that names the file and the tensor, never with a crash later. Weight loading
// reads tensors through a StagedReader (loader/staged_reader.h); data() and view() map the file
// on first use, for tools that scan a file once (doctor --verify-weights).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
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
  // A pointer into the file's mapping (made on the first call; its pages enter the page cache).
  const void* data(const TensorInfo& t) const { return static_cast<const char*>(mapping()) + t.offset; }
  // Header bytes (8-byte length + JSON), for fingerprints.
  std::string_view header_bytes() const { return header_; }
  // A host tensor that borrows the mapping (zero copy); keeps the file mapped while alive.
  // Its data may be unaligned (the data section starts right after the header, whose
  // length writers need not pad to 8): read it through convert_host, not data<T>().
  Tensor view(const TensorInfo& t, std::shared_ptr<SafetensorsFile> self) const;

 private:
  const void* mapping() const;
  std::string path_;
  mutable std::once_flag map_once_;
  mutable void* map_ = nullptr;
  size_t size_ = 0;
  std::string header_;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace tessera
