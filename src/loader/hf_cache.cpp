#include "loader/hf_cache.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// "org/name" (one slash, neither part empty, no path syntax): a hub id.
bool is_hub_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size() || s.find('/', slash + 1) != std::string::npos)
    return false;
  return s[0] != '.' && s[0] != '~' && s.find("..") == std::string::npos;
}

std::optional<std::string> snapshot_in(const fs::path& repo, const std::string& revision) {
  std::error_code ec;
  if (!fs::is_directory(repo / "snapshots", ec)) return std::nullopt;
  std::string commit = revision;
  if (std::ifstream ref(repo / "refs" / revision); ref) {
    std::getline(ref, commit);
    while (!commit.empty() && (commit.back() == '\n' || commit.back() == '\r' || commit.back() == ' '))
      commit.pop_back();
  }
  if (!commit.empty() && fs::is_directory(repo / "snapshots" / commit, ec))
    return (repo / "snapshots" / commit).string();
  return std::nullopt;
}

}  // namespace

std::vector<std::string> default_hub_caches() {
  std::vector<std::string> out;
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? v : "";
  };
  if (std::string v = env("HF_HUB_CACHE"); !v.empty()) out.push_back(v);
  if (std::string v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) out.push_back(v);
  if (std::string v = env("HF_HOME"); !v.empty()) out.push_back(v + "/hub");
  if (std::string v = env("XDG_CACHE_HOME"); !v.empty()) out.push_back(v + "/huggingface/hub");
  if (std::string v = env("HOME"); !v.empty()) out.push_back(v + "/.cache/huggingface/hub");
  return out;
}

std::string resolve_model_dir(const std::string& model, const HubCacheLookup& lookup) {
  std::error_code ec;
  if (fs::is_directory(model, ec)) return model;
  if (!is_hub_id(model))
    fail(ErrorKind::kNotFound,
         "{}: not a model directory (tessera needs a local directory with config.json, or a Hugging Face id "
         "org/name already in the hub cache)",
         model);
  const std::string revision = lookup.revision.empty() ? "main" : lookup.revision;
  const std::string repo = "models--" + model.substr(0, model.find('/')) + "--" + model.substr(model.find('/') + 1);
  std::vector<std::string> caches;
  if (!lookup.download_dir.empty()) caches.push_back(lookup.download_dir);
  for (const auto& c : lookup.caches.empty() ? default_hub_caches() : lookup.caches) caches.push_back(c);
  std::vector<std::string> looked;
  for (const auto& cache : caches) {
    const fs::path dir = fs::path(cache) / repo;
    if (auto snapshot = snapshot_in(dir, revision)) return *snapshot;
    looked.push_back(dir.string());
  }
  fail(ErrorKind::kNotFound,
       "{}: not a local directory, and revision '{}' is not in the Hugging Face cache (looked in {}). tessera does "
       "not download: fetch it first (`hf download {}{}` or `huggingface-cli download {}`), or pass the model's "
       "directory",
       model, revision, fmt::join(looked, ", "), model, lookup.revision.empty() ? "" : " --revision " + revision,
       model);
}

}  // namespace tessera
