// Builds damaged copies of the tiny HF fixtures (tests/fixtures/models) in a temp dir.
// Shared by the loader fault tests and the CLI fault driver.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera::testing {

namespace fs = std::filesystem;

inline fs::path fixture_path(const std::string& name) {
  return fs::path(TESSERA_SOURCE_DIR) / "tests" / "fixtures" / "models" / name;
}

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera-fault-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Copies fixture `name` to dir/name (without reference.json) and returns that path.
inline fs::path copy_fixture(const std::string& name, const fs::path& dir) {
  fs::path dst = dir / name;
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(fixture_path(name)))
    if (e.path().filename() != "reference.json") fs::copy_file(e.path(), dst / e.path().filename());
  return dst;
}

inline std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

inline nlohmann::ordered_json read_json(const fs::path& p) { return nlohmann::ordered_json::parse(read_file(p)); }
inline void write_json(const fs::path& p, const nlohmann::ordered_json& j) { write_file(p, j.dump(2)); }

// A safetensors file split into its JSON header and data section.
struct StFile {
  nlohmann::ordered_json header;
  std::string data;

  static StFile read(const fs::path& p) {
    std::string bytes = read_file(p);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    StFile f;
    f.header = nlohmann::ordered_json::parse(bytes.substr(8, n));
    f.data = bytes.substr(8 + n);
    return f;
  }
  // `header_len` overrides the length field (a lying header).
  void write(const fs::path& p, int64_t header_len = -1) const { write_file(p, serialize(header_len)); }
  std::string serialize(int64_t header_len = -1) const {
    std::string h = header.dump();
    uint64_t n = header_len >= 0 ? static_cast<uint64_t>(header_len) : h.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    return out + h + data;
  }
  std::vector<std::string> tensor_names() const {
    std::vector<std::string> v;
    for (const auto& [k, _] : header.items())
      if (k != "__metadata__") v.push_back(k);
    return v;
  }
  uint64_t begin(const std::string& t) const { return header.at(t).at("data_offsets")[0].get<uint64_t>(); }
  uint64_t end(const std::string& t) const { return header.at(t).at("data_offsets")[1].get<uint64_t>(); }
  // Drops tensor `t` and lays the remaining data out contiguously again (a consistent file).
  void remove(const std::string& t) {
    std::vector<std::pair<std::string, std::string>> keep;
    for (const auto& n : tensor_names())
      if (n != t) keep.emplace_back(n, data.substr(begin(n), end(n) - begin(n)));
    header.erase(t);
    data.clear();
    for (auto& [n, bytes] : keep) {
      header[n]["data_offsets"] = {data.size(), data.size() + bytes.size()};
      data += bytes;
    }
  }
};

}  // namespace tessera::testing
