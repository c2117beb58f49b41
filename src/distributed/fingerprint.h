// What a node tells the head about itself when it joins, so that version skew and model
// files that differ between machines are caught at startup with a message naming the
// node and the file, rather than as garbage output or a hang.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distributed/wire.h"

namespace tessera::dist {

struct ShardFingerprint {
  std::string name;           // file name relative to the model directory
  uint64_t size = 0;          // bytes (stat)
  std::string header_sha256;  // hex SHA-256 of the 8-byte length + JSON header
  bool operator==(const ShardFingerprint&) const = default;
};

struct NodeFingerprint {
  std::string version;                   // tessera version + git commit
  std::string config_sha256;             // hex SHA-256 of config.json ("" when there is none)
  std::vector<ShardFingerprint> shards;  // sorted by name
  std::string dtype;                     // config.json's torch_dtype / dtype, or the --dtype flag
  std::vector<std::string> gpus;         // e.g. "NVIDIA H200 (139 GiB)"; empty on a CPU node
  int32_t num_ranks = 1;                 // rank processes this node runs
  std::string hostname;
  std::string nic;
  std::string ip;
};

// Hashes config.json and the header of every *.safetensors file in `model_dir` (never the
// weights themselves, so it takes milliseconds). Throws Error(kNotFound / kCorrupt).
// Fills version; dtype from config.json; leaves gpus, nic, ip, hostname to the caller.
NodeFingerprint compute_fingerprint(const std::string& model_dir);
std::string this_version();

// nullopt when `node` may join a cluster whose head has `head`; otherwise one line naming
// the node and the first difference, e.g.
// "node 1 (10.0.0.2): model-00003-of-00004.safetensors differs from the head's (size 4.9 GB vs 4.8 GB)".
std::optional<std::string> fingerprint_mismatch(const NodeFingerprint& head, const NodeFingerprint& node,
                                                int node_rank);

void encode_fingerprint(WireWriter& w, const NodeFingerprint& f);
NodeFingerprint decode_fingerprint(WireReader& r);

std::string human_bytes(uint64_t n);  // "4.9 GB"

}  // namespace tessera::dist
