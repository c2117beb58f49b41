// Model ids as vLLM takes them: `org/name` resolves to a snapshot in the Hugging Face hub cache (no network:
// tessera never downloads). The cache layout is huggingface_hub's: <cache>/models--org--name/refs/<revision>
// holds a commit hash, <cache>/models--org--name/snapshots/<commit>/ the files.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace tessera {

struct HubCacheLookup {
  std::string download_dir;  // vLLM's --download-dir: searched first
  std::string revision;      // --revision: a branch or tag (refs/), or a commit hash; empty: "main"
  // The caches searched after download_dir, in order: HF_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub,
  // ~/.cache/huggingface/hub (from the environment when empty; tests set them).
  std::vector<std::string> caches;
};

// The caches HubCacheLookup::caches defaults to, from the environment.
std::vector<std::string> default_hub_caches();

// `model` itself when it is a directory; else, for an `org/name` id, the snapshot directory of the revision in the
// first cache that has it. Error(kNotFound) otherwise, naming where it looked and how to download the model.
std::string resolve_model_dir(const std::string& model, const HubCacheLookup& lookup);

}  // namespace tessera
