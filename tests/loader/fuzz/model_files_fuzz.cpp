// libFuzzer target for the JSON a model directory holds: the input is read as config.json and as
// generation_config.json (each through the loader's own reading and checks), then as tokenizer.json and
// as tokenizer_config.json beside a minimal tokenizer. A tessera::Error naming the file is the expected
// answer to a bad file; a crash, a stack overflow, an over-read (ASan), undefined behaviour (UBSan), a
// timeout or memory past -rss_limit_mb is a finding (an added token id of 10^8 once cost 3.4 GB).
//   scripts/fuzz.sh 60 files
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "loader/model_config.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

// A byte-level BPE with a one-token vocabulary and no merges: the smallest tokenizer.json that loads.
const char* kTinyTokenizer =
    R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"},)"
    R"( "decoder": {"type": "ByteLevel"}})";

const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tessera-files-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

template <typename Fn>
void expect_error_or_success(Fn&& fn) {
  try {
    fn();
  } catch (const tessera::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const fs::path& dir = scratch_dir();
  write(dir / "config.json", text);
  write(dir / "generation_config.json", text);
  expect_error_or_success([&] { tessera::load_model_config(dir.string()); });
  fs::remove(dir / "config.json");
  expect_error_or_success([&] { tessera::load_generation_config(dir.string()); });
  expect_error_or_success([&] { tessera::tokenizer::Tokenizer::from_json_text(text, ""); });
  expect_error_or_success([&] { tessera::tokenizer::Tokenizer::from_json_text(kTinyTokenizer, text); });
  return 0;
}
