#include "loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"

namespace tessera {

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // as HF safetensors: 100 MB

// The JSON header, its nesting bounded before it is parsed.
nlohmann::json parse_header(std::string_view text, const std::string& path) {
  check_json_file_depth(text, path + " (safetensors header)");
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(ErrorKind::kCorrupt, "{}: the JSON header does not parse ({})", path, json_error_text(e));
  }
}

// n bytes at `at`, or a "truncated" error (the size was checked, so a short read is a file that
// shrank under us or an I/O error).
void read_exact_at(int fd, const std::string& path, void* dst, size_t n, uint64_t at) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, static_cast<char*>(dst) + got, n - got, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail(ErrorKind::kCorrupt, "{}: cannot read the header ({})", path,
           r < 0 ? std::strerror(errno) : "the file ended early");
    got += static_cast<size_t>(r);
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) fail(ErrorKind::kNotFound, "{}: file not found", path);
    fail(ErrorKind::kNotFound, "{}: cannot open ({})", path, std::strerror(errno));
  }
  struct CloseOnExit {
    int fd;
    ~CloseOnExit() { ::close(fd); }
  } close_on_exit{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(ErrorKind::kNotFound, "{}: cannot stat ({})", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::kNotFound, "{}: not a regular file", path);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8)
    fail(ErrorKind::kCorrupt, "{}: truncated file ({} bytes; a safetensors file starts with an 8-byte header length)",
         path, size_);
  uint64_t header_len = 0;
  read_exact_at(fd, path, &header_len, 8, 0);
  if (header_len > kMaxHeader || header_len > size_ - 8) {
    fail(ErrorKind::kCorrupt, "{}: header claims {} bytes but the file has only {} after the length field{}", path,
         header_len, size_ - 8, header_len > kMaxHeader ? " (over the 100 MB limit)" : "; the file is truncated");
  }
  const size_t header_end = 8 + header_len;
  header_.resize(header_end);
  read_exact_at(fd, path, header_.data(), header_end, 0);
  (void)::posix_fadvise(fd, 0, static_cast<off_t>(header_end), POSIX_FADV_DONTNEED);
  nlohmann::json header = parse_header(std::string_view(header_).substr(8), path);
  if (!header.is_object()) fail(ErrorKind::kCorrupt, "{}: the JSON header is not an object", path);
  size_t data_size = size_ - header_end;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      fail(ErrorKind::kCorrupt, "{}: tensor '{}': header entry lacks dtype, shape or data_offsets", path, name);
    TensorInfo t;
    t.name = name;
    std::string dt = v["dtype"].is_string() ? v["dtype"].get<std::string>() : "?";
    auto parsed = dtype_from_safetensors(dt);
    if (!parsed)
      fail(ErrorKind::kUnsupported,
           "{}: tensor '{}': unsupported dtype {} (supported: F32, BF16, F16, F8_E4M3, F8_E5M2, "
           "I32, I64, U8)",
           path, name, dt);
    t.dtype = *parsed;
    const auto& shape = v["shape"];
    const auto& offs = v["data_offsets"];
    if (!shape.is_array() || shape.size() > Shape::kMaxDims)
      fail(ErrorKind::kCorrupt, "{}: tensor '{}': shape is not an array of at most {} dimensions", path, name,
           Shape::kMaxDims);
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) fail(ErrorKind::kCorrupt, "{}: tensor '{}': shape has a bad dimension", path, name);
      uint64_t dv = d.get<uint64_t>();
      if (dv > (1ull << 40) || (dv && numel > (1ull << 62) / dv))
        fail(ErrorKind::kCorrupt, "{}: tensor '{}': shape is absurdly large", path, name);
      numel *= dv;
      t.shape.push_back(static_cast<int64_t>(dv));
    }
    // Every element takes at least one byte, so a larger count is a lie; this also keeps
    // numel * dtype_size below from wrapping around 2^64 onto the real span.
    if (numel > data_size)
      fail(ErrorKind::kCorrupt, "{}: tensor '{}': shape {} is absurdly large for the file's {} data bytes", path, name,
           t.shape.str(), data_size);
    if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      fail(ErrorKind::kCorrupt, "{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    uint64_t want = numel * dtype_size(t.dtype);
    if (begin > end || end > data_size)
      fail(ErrorKind::kCorrupt,
           "{}: tensor '{}': data_offsets [{}, {}) lie outside the {} data bytes of the file (truncated or lying "
           "header)",
           path, name, begin, end, data_size);
    if (end - begin != want)
      fail(ErrorKind::kCorrupt, "{}: tensor '{}': {} {} needs {} bytes but data_offsets span {}", path, name, dt,
           t.shape.str(), want, end - begin);
    t.offset = header_end + begin;
    t.bytes = want;
    tensors_.emplace(name, std::move(t));
  }
  // Two tensors sharing bytes is a header that lies (HF's reader refuses it too).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, t] : tensors_)
    if (t.bytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    if (b.offset < a.offset + a.bytes)
      fail(ErrorKind::kCorrupt, "{}: tensor '{}': data_offsets [{}, {}) overlap those of tensor '{}' [{}, {})", path,
           b.name, b.offset - header_end, b.offset - header_end + b.bytes, a.name, a.offset - header_end,
           a.offset - header_end + a.bytes);
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const void* SafetensorsFile::mapping() const {
  std::call_once(map_once_, [this] {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::kNotFound, "{}: cannot open ({})", path_, std::strerror(errno));
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (m == MAP_FAILED) fail(ErrorKind::kNotFound, "{}: cannot map ({})", path_, std::strerror(map_errno));
    map_ = m;
  });
  return map_;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Tensor SafetensorsFile::view(const TensorInfo& t, std::shared_ptr<SafetensorsFile> self) const {
  return host_wrap(const_cast<void*>(data(t)), t.shape, t.dtype, std::move(self));
}

}  // namespace tessera
