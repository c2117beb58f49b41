// Model ids resolved through the Hugging Face hub cache layout (no network): refs name commits, snapshots hold
// the files; --download-dir first, then the caches in order; a clear error naming where it looked.
#include "loader/hf_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "core/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class HubCache : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tessera-hf-cache-" + std::to_string(::getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  // A snapshot of org/name in `cache` at `commit`, with `ref` pointing at it when given.
  fs::path add(const std::string& cache, const std::string& commit, const std::string& ref = "") {
    const fs::path repo = root_ / cache / "models--Qwen--Qwen3.5-122B-A10B-FP8";
    fs::create_directories(repo / "snapshots" / commit);
    std::ofstream(repo / "snapshots" / commit / "config.json") << "{}";
    if (!ref.empty()) {
      fs::create_directories(repo / "refs");
      std::ofstream(repo / "refs" / ref) << commit << "\n";
    }
    return repo / "snapshots" / commit;
  }
  std::string cache(const std::string& name) const { return (root_ / name).string(); }
  fs::path root_;
};

TEST_F(HubCache, DirectoriesStayAndIdsResolveToTheirSnapshot) {
  const fs::path main = add("hub", "abc123", "main");
  add("hub", "def456", "v2");
  HubCacheLookup l;
  l.caches = {cache("empty"), cache("hub")};
  EXPECT_EQ(resolve_model_dir(root_.string(), l), root_.string());
  EXPECT_EQ(resolve_model_dir("Qwen/Qwen3.5-122B-A10B-FP8", l), main.string());
  l.revision = "v2";
  EXPECT_EQ(fs::path(resolve_model_dir("Qwen/Qwen3.5-122B-A10B-FP8", l)).filename(), "def456");
  l.revision = "abc123";  // a commit hash names its snapshot directly
  EXPECT_EQ(fs::path(resolve_model_dir("Qwen/Qwen3.5-122B-A10B-FP8", l)).filename(), "abc123");
}

TEST_F(HubCache, DownloadDirIsSearchedFirst) {
  add("hub", "abc123", "main");
  const fs::path mine = add("mine", "fff000", "main");
  HubCacheLookup l;
  l.caches = {cache("hub")};
  l.download_dir = cache("mine");
  EXPECT_EQ(resolve_model_dir("Qwen/Qwen3.5-122B-A10B-FP8", l), mine.string());
}

TEST_F(HubCache, MissingModelsSayWhereItLookedAndHowToDownload) {
  HubCacheLookup l;
  l.caches = {cache("hub")};
  try {
    resolve_model_dir("Qwen/Qwen3.5-122B-A10B-FP8", l);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("models--Qwen--Qwen3.5-122B-A10B-FP8"), std::string::npos) << m;
    EXPECT_NE(m.find("hf download Qwen/Qwen3.5-122B-A10B-FP8"), std::string::npos) << m;
  }
  add("hub", "abc123", "main");
  l.revision = "v9";
  EXPECT_THROW(resolve_model_dir("Qwen/Qwen3.5-122B-A10B-FP8", l), Error);
  EXPECT_THROW(resolve_model_dir("./no/such", l), Error);  // a path, not an id
  EXPECT_THROW(resolve_model_dir("a/b/c", l), Error);      // not an id either
}

}  // namespace
}  // namespace tessera
