// staged_reader.h.
#include "loader/staged_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "core/logging.h"

namespace tessera {

namespace {

constexpr uint64_t round_down(uint64_t v, uint64_t a) { return v / a * a; }
constexpr uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// A direct read the file system refused for its alignment (EINVAL): that file is read buffered.
struct DirectRefused {};

// Up to n bytes of `fd` at `at` into dst (fewer only at the end of the file), retrying on EINTR: the
// bytes read and 0, or the bytes read before an error and its errno. A direct read may end short only
// at the end of the file (the next read would return 0), so it stops at a short, unaligned count.
std::pair<size_t, int> pread_loop(int fd, char* dst, size_t n, uint64_t at, bool direct) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return {got, errno};
    if (r == 0) break;
    got += static_cast<size_t>(r);
    if (direct && got % StagedReader::kAlign != 0) break;
  }
  return {got, 0};
}

}  // namespace

StagedReader::StagedReader(size_t chunk_bytes, Mode mode)
    : chunk_(static_cast<size_t>(round_up(std::max<size_t>(chunk_bytes, 4 * kAlign), kAlign))), mode_(mode) {}

StagedReader::~StagedReader() {
  close_files();
  std::free(bufs_[0]);
  std::free(bufs_[1]);
}

char* StagedReader::buffer(int i) {
  if (!bufs_[i] && ::posix_memalign(reinterpret_cast<void**>(&bufs_[i]), kAlign, chunk_) != 0)
    fail(ErrorKind::kOutOfMemory, "cannot allocate the {} MiB checkpoint read buffer", chunk_ >> 20);
  return bufs_[i];
}

void StagedReader::close_files() {
  finish_read_ahead();  // its descriptor is about to close
  held_[0] = held_[1] = Held{};
  for (auto& [path, f] : files_) {
    drop_pages(f, 0, f.size);  // and what readahead brought in past the ranges read
    ::close(f.fd);
  }
  files_.clear();
}

StagedReader::File& StagedReader::open(const std::string& path) {
  if (auto it = files_.find(path); it != files_.end()) return it->second;
  File f;
#ifdef O_DIRECT
  if (mode_ != Mode::kBuffered) {
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    f.direct = f.fd >= 0;
    if (f.fd < 0 && mode_ == Mode::kDirect)
      fail(ErrorKind::kNotFound, "{}: cannot open with O_DIRECT ({}); load it buffered (the default picks that itself)",
           path, std::strerror(errno));
  }
#else
  if (mode_ == Mode::kDirect) fail(ErrorKind::kUnsupported, "{}: this system has no O_DIRECT", path);
#endif
  if (f.fd < 0) f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) fail(ErrorKind::kNotFound, "{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    const int err = errno;
    ::close(f.fd);
    fail(ErrorKind::kNotFound, "{}: cannot stat ({})", path, std::strerror(err));
  }
  f.size = static_cast<uint64_t>(st.st_size);
  if (f.direct) drop_pages(f, 0, f.size);  // pages an earlier reader left
  ++(f.direct ? stats_.direct_files : stats_.buffered_files);
  buffer(cur_);
  return files_.emplace(path, f).first->second;
}

// Up to n bytes at `at` (fewer only at the end of the file).
size_t StagedReader::pread_full(File& f, const std::string& path, char* dst, size_t n, uint64_t at) {
  const auto start = std::chrono::steady_clock::now();
  const auto [got, err] = pread_loop(f.fd, dst, n, at, f.direct);
  if (err == EINVAL && f.direct) throw DirectRefused{};
  if (err != 0)
    fail(ErrorKind::kCorrupt, "{}: read of {} bytes at offset {} failed ({}; a disk or file system error)", path,
         n - got, at + got, std::strerror(err));
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats_.device_bytes += got;
  return got;
}

// Drops the page-cache pages of [offset, offset + bytes), widened to whole pages (fadvise keeps
// partial pages at the ends), so that pages cached before the load or by a buffered read go.
void StagedReader::drop_pages(const File& f, uint64_t offset, uint64_t bytes) const {
  const uint64_t b = round_down(offset, kAlign),
                 e = std::min(round_up(offset + bytes, kAlign), round_up(f.size, kAlign));
  if (e > b) (void)::posix_fadvise(f.fd, static_cast<off_t>(b), static_cast<off_t>(e - b), POSIX_FADV_DONTNEED);
}

void StagedReader::reopen_buffered(File& f, const std::string& path) {
  TLOG_WARN(
      "{}: the file system refused an aligned O_DIRECT read; reading it buffered, dropping each read's pages "
      "from the page cache after it",
      path);
  finish_read_ahead();  // it may be reading this descriptor
  held_[0] = held_[1] = Held{};
  ::close(f.fd);
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  f.direct = false;
  --stats_.direct_files;
  ++stats_.buffered_files;
  if (f.fd < 0) fail(ErrorKind::kNotFound, "{}: cannot open ({})", path, std::strerror(errno));
}

const char* StagedReader::view(const std::string& path, uint64_t offset, size_t bytes) {
  TESSERA_CHECK(bytes <= max_view_bytes(), "staged read of {} bytes, over the {}-byte view", bytes, max_view_bytes());
  File& f = open(path);
  const uint64_t end = offset + bytes;
  if (end < offset || end > f.size)
    fail(ErrorKind::kCorrupt, "{}: bytes [{}, {}) lie past the end of the file ({} bytes; truncated?)", path, offset,
         end, f.size);
  stats_.bytes += bytes;
  if (f.direct) {
    try {
      return view_direct(f, path, offset, end);
    } catch (const DirectRefused&) {
      reopen_buffered(f, path);
    }
  }
  finish_read_ahead();
  char* buf = buffer(cur_);
  held_[cur_] = Held{};  // a buffered read's bytes are not aligned; nothing is served from them
  const size_t got = pread_full(f, path, buf, bytes, offset);
  if (got < bytes)
    fail(ErrorKind::kCorrupt, "{}: the file ended at {} bytes while reading up to {} (truncated?)", path, offset + got,
         end);
  drop_pages(f, offset, bytes);
  f.last_end = end;
  return buf;
}

const char* StagedReader::view_direct(File& f, const std::string& path, uint64_t offset, uint64_t end) {
  const bool sequential = offset == f.last_end;
  const char* data = nullptr;
  bool hit = false;
  if (held_[cur_].covers(path, offset, end)) {
    data = bufs_[cur_] + (offset - held_[cur_].pos);
    ++stats_.buffer_hits;
  } else if ((data = take_read_ahead(path, offset, end)) != nullptr) {
    hit = true;
  } else {
    const uint64_t pos = round_down(offset, kAlign);
    const size_t want = static_cast<size_t>(round_up(end, kAlign) - pos);
    held_[cur_] = Held{};
    const size_t got = pread_full(f, path, buffer(cur_), want, pos);
    if (pos + got < end)
      fail(ErrorKind::kCorrupt, "{}: the file ended at {} bytes while reading up to {} (truncated?)", path, pos + got,
           end);
    held_[cur_] = Held{path, pos, got};
    data = buffer(cur_) + (offset - pos);
  }
  f.last_end = end;
  // The next buffer of a file walked in order, read while the caller works through this one (one
  // read ahead at a time: the next requests are served from the current buffer meanwhile). It starts
  // an eighth of a buffer before the end of what this one holds, so that a request starting in that
  // last eighth and running past the end is served from it too, and never before this request's end.
  if ((sequential || hit) && !ahead_.active()) {
    const Held& h = held_[cur_];
    uint64_t next = round_down(end, kAlign);
    if (h.pos + h.len > next + chunk_ / 8) next = round_down(h.pos + h.len - chunk_ / 8, kAlign);
    start_read_ahead(f, path, next);
  }
  return data;
}

const char* StagedReader::take_read_ahead(const std::string& path, uint64_t offset, uint64_t end) {
  const std::optional<size_t> got = finish_read_ahead();  // failed: the caller's own read reports the error
  if (!got) return nullptr;
  Held read{ahead_.path, ahead_.pos, *got};
  if (!read.covers(path, offset, end)) return nullptr;
  cur_ = ahead_.buf;
  held_[cur_] = std::move(read);
  ++stats_.read_ahead_hits;
  return bufs_[cur_] + (offset - ahead_.pos);
}

void StagedReader::start_read_ahead(const File& f, const std::string& path, uint64_t pos) {
  const uint64_t file_end = round_up(f.size, kAlign);
  if (pos >= f.size || ahead_.active()) return;
  ahead_.path = path;
  ahead_.pos = pos;
  ahead_.buf = cur_ ^ 1;
  held_[ahead_.buf] = Held{};  // being overwritten
  char* dst = buffer(ahead_.buf);
  const int fd = f.fd;
  const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk_, file_end - pos));
  ahead_.done = std::async(std::launch::async, [fd, dst, want, pos]() -> std::pair<size_t, double> {
    const auto start = std::chrono::steady_clock::now();
    const auto [got, err] = pread_loop(fd, dst, want, pos, true);
    if (err != 0) throw std::system_error(err, std::generic_category(), "read ahead");
    return {got, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  });
}

std::optional<size_t> StagedReader::finish_read_ahead() {
  if (!ahead_.active()) return std::nullopt;
  try {
    const auto [n, seconds] = ahead_.done.get();
    stats_.read_seconds += seconds;
    stats_.device_bytes += n;
    return n;
  } catch (...) {
    return std::nullopt;
  }
}

void StagedReader::read(const std::string& path, uint64_t offset, size_t bytes, const Sink& sink) {
  const size_t step = max_view_bytes();
  for (size_t at = 0; at < bytes; at += step) {
    const size_t n = std::min(step, bytes - at);
    sink(view(path, offset + at, n), at, n);
  }
}

void StagedReader::read_into(const std::string& path, uint64_t offset, size_t bytes, char* dst) {
  read(path, offset, bytes, [dst](const char* data, size_t at, size_t n) { std::memcpy(dst + at, data, n); });
}

}  // namespace tessera
