// Reads byte ranges of checkpoint files through one bounded, aligned buffer so that loading never
// holds the weights twice: with O_DIRECT the page cache is bypassed; where O_DIRECT is refused
// (tmpfs, some network file systems, a device with larger blocks) the reads are buffered and each
// read's pages are dropped with posix_fadvise(POSIX_FADV_DONTNEED) right after it. Either way the
// page cache grows by at most one buffer while a checkpoint loads. A file read with O_DIRECT has
// its cached pages dropped when it is opened, and every file when it is closed, so pages left by
// an earlier reader (a just-downloaded checkpoint) go too.
//
// Read-ahead: when a direct read starts where the previous one of the same file ended (a
// sequential walk through a file, as a whole-model load does), the next buffer of that file is read
// on a worker thread into the second buffer while the caller converts and uploads what the current
// one holds; it starts an eighth of a buffer before the current one's end (not before the request's
// end), so a request running past that end is served from it. A request that lies inside the
// current buffer or the one read ahead is served from it, so a walk through many small tensors reads
// each byte about once (at most an eighth more), the page cache still grows by nothing and the reads
// overlap the rest of the load; the staging memory is two buffers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace tessera {

struct StagedReadStats {
  size_t bytes = 0;            // bytes handed to consumers
  size_t device_bytes = 0;     // bytes read from the files (aligned reads read a little more)
  double read_seconds = 0;     // time inside pread
  size_t direct_files = 0;     // files read with O_DIRECT
  size_t read_ahead_hits = 0;  // direct reads served from the buffer read ahead
  size_t buffer_hits = 0;      // direct reads served from what the current buffer already held
  size_t buffered_files = 0;   // files read buffered, their pages dropped chunk by chunk
};

class StagedReader {
 public:
  static constexpr size_t kDefaultChunkBytes = size_t{64} << 20;
  static constexpr size_t kAlign = 4096;          // O_DIRECT's offset/length/buffer alignment (logical block size)
  enum class Mode { kAuto, kDirect, kBuffered };  // kAuto: O_DIRECT where the file system takes it

  // `chunk_bytes` is rounded up to kAlign (at least 4 x kAlign); the buffer is allocated on the first read.
  explicit StagedReader(size_t chunk_bytes = kDefaultChunkBytes, Mode mode = Mode::kAuto);
  ~StagedReader();
  StagedReader(const StagedReader&) = delete;
  StagedReader& operator=(const StagedReader&) = delete;

  // The bytes [offset, offset + bytes) of the file at `path`, valid until the next call;
  // bytes <= max_view_bytes(). Throws Error naming the file on an I/O error or a short file.
  const char* view(const std::string& path, uint64_t offset, size_t bytes);
  // The most view() hands out at once: the buffer less the alignment slack at both ends.
  size_t max_view_bytes() const { return chunk_ - 2 * kAlign; }
  // Consumer of consecutive pieces: `data` holds `n` bytes starting `at` bytes into the range.
  using Sink = std::function<void(const char* data, size_t at, size_t n)>;
  // Reads [offset, offset + bytes) of the file at `path`, in order, in pieces of at most
  // chunk_bytes(). Throws Error naming the file on an I/O error or a short file.
  void read(const std::string& path, uint64_t offset, size_t bytes, const Sink& sink);
  // read() into `dst` (bytes long).
  void read_into(const std::string& path, uint64_t offset, size_t bytes, char* dst);
  // Closes the files opened so far (their descriptors stay open between reads), dropping their
  // cached pages (a buffered read's readahead may have brought in pages past its range).
  void close_files();

  size_t chunk_bytes() const { return chunk_; }
  const StagedReadStats& stats() const { return stats_; }

 private:
  struct File {
    int fd = -1;
    bool direct = false;
    uint64_t size = 0;
    uint64_t last_end = UINT64_MAX;  // where the previous read of this file ended (none yet: UINT64_MAX)
  };
  // What a buffer holds: `len` bytes of `path` from `pos` (len 0: nothing usable).
  struct Held {
    std::string path;
    uint64_t pos = 0;
    size_t len = 0;
    bool covers(const std::string& p, uint64_t begin, uint64_t end) const {
      return len > 0 && path == p && begin >= pos && end <= pos + len;
    }
  };
  // A direct read of up to a buffer from `pos` into buffer `buf`, running on a worker thread.
  struct ReadAhead {
    std::string path;
    uint64_t pos = 0;
    int buf = 0;
    // Bytes read and the seconds inside pread; an exception for an error (the caller then reads
    // the range itself, which reports it).
    std::future<std::pair<size_t, double>> done;
    bool active() const { return done.valid(); }
  };
  File& open(const std::string& path);
  void reopen_buffered(File& f, const std::string& path);
  size_t pread_full(File& f, const std::string& path, char* dst, size_t n, uint64_t at);
  void drop_pages(const File& f, uint64_t offset, uint64_t bytes) const;
  const char* view_direct(File& f, const std::string& path, uint64_t offset, uint64_t end);
  // The read ahead's bytes at `offset` when it covers [offset, end) of `path` (its buffer is then
  // the current one), else nullptr; either way no read ahead is in flight afterwards.
  const char* take_read_ahead(const std::string& path, uint64_t offset, uint64_t end);
  void start_read_ahead(const File& f, const std::string& path, uint64_t pos);
  // Waits for a read ahead in flight, counts it in the stats and drops it: the bytes it read, or
  // nullopt when none was in flight or it failed.
  std::optional<size_t> finish_read_ahead();
  char* buffer(int i);  // allocated on first use
  size_t chunk_ = 0;
  Mode mode_;
  char* bufs_[2] = {nullptr, nullptr};
  int cur_ = 0;   // the buffer the last view() returned
  Held held_[2];  // what each buffer holds (direct reads only)
  ReadAhead ahead_;
  std::map<std::string, File> files_;
  StagedReadStats stats_;
};

}  // namespace tessera
