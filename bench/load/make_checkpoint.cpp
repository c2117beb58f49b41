// Writes a safetensors checkpoint of a model's real layout with random values: every tensor the
// loader reads (WeightStore::checkpoint_layout of the model built on the planner's MetaBackend,
// which allocates nothing), in bf16, or e4m3 with f32 128x128 block scales where the config is FP8,
// in shards of --shard-gib with model.safetensors.index.json, next to the config.json (its layer
// count cut to --layers when given, so a checkpoint of a chosen size keeps the real tensor shapes).
//   make_checkpoint configs/qwen3.5-122b-a10b-fp8 /data/ckpt --layers 12
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "loader/model_config.h"
#include "model/registry.h"
#include "plan/meta_backend.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

// config.json with num_hidden_layers (and layer_types) cut to `layers` (0: unchanged).
void write_config(const fs::path& from, const fs::path& to, int layers) {
  nlohmann::json c = nlohmann::json::parse(std::ifstream(from / "config.json"));
  if (layers > 0) {
    nlohmann::json& t = c.contains("text_config") ? c["text_config"] : c;
    t["num_hidden_layers"] = layers;
    if (t.contains("layer_types") && t["layer_types"].is_array() && t["layer_types"].size() > size_t(layers))
      t["layer_types"].erase(t["layer_types"].begin() + layers, t["layer_types"].end());
  }
  std::ofstream(to / "config.json") << c.dump(2) << "\n";
  for (const char* f : {"generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(from / f)) fs::copy_file(from / f, to / f, fs::copy_options::overwrite_existing);
}

struct Out {
  std::string name;
  DType dtype;
  Shape shape;
  size_t bytes;
};

const char* safetensors_dtype(DType dt) {
  return dt == DType::kF8E4M3 ? "F8_E4M3" : dt == DType::kF32 ? "F32" : "BF16";
}

uint64_t next(uint64_t& s) {  // xorshift64
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// Random values that load and run: bf16 of magnitude 2^-7 .. 2^-6 with random sign, e4m3 with
// no NaN (exponent below all-ones), block scales of 0.05 / 448.
void fill(char* p, size_t n, DType dt, uint64_t& s) {
  if (dt == DType::kF32) {
    const float v = 0.05f / 448.0f;
    for (size_t i = 0; i + 4 <= n; i += 4) std::memcpy(p + i, &v, 4);
    return;
  }
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t r = next(s);
    if (dt == DType::kBF16) r = (r & 0x807f807f807f807full) | 0x3c003c003c003c00ull;
    if (dt == DType::kF8E4M3) r &= 0xf7f7f7f7f7f7f7f7ull;
    std::memcpy(p + i, &r, 8);
  }
}

void write_shard(const fs::path& file, const std::vector<Out>& ts, uint64_t& seed) {
  nlohmann::json h = nlohmann::json::object();
  size_t at = 0;
  for (const auto& t : ts) {
    nlohmann::json shape = nlohmann::json::array();
    for (int d = 0; d < t.shape.ndim(); ++d) shape.push_back(t.shape[d]);
    h[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", shape}, {"data_offsets", {at, at + t.bytes}}};
    at += t.bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream f(file, std::ios::binary);
  const uint64_t len = header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << header;
  std::vector<char> buf(size_t{64} << 20);
  for (const auto& t : ts)
    for (size_t done = 0; done < t.bytes;) {
      const size_t n = std::min(buf.size(), t.bytes - done);
      fill(buf.data(), n, t.dtype, seed);
      f.write(buf.data(), static_cast<std::streamsize>(n));
      done += n;
    }
  if (!f) fail(ErrorKind::kNotFound, "{}: write failed (disk full?)", file.string());
}

std::vector<Out> layout(const fs::path& dir) {
  const ModelConfig cfg = load_model_config(dir.string());
  plan::MetaBackend meta(plan::MetaBackendOptions{});
  ModelOptions mo;
  mo.max_positions = 256;
  auto model = create_model(cfg, mo, meta);
  std::vector<Out> out;
  for (const auto& s : model->weights().checkpoint_layout()) {
    const size_t n = static_cast<size_t>(s.shape.numel());
    out.push_back({s.name, s.fp8 ? DType::kF8E4M3 : DType::kBF16, s.shape, n * (s.fp8 ? 1 : 2)});
    if (s.fp8) {
      const Shape b = block_scale_shape(s.shape);
      out.push_back({s.name + "_scale_inv", DType::kF32, b, static_cast<size_t>(b.numel()) * 4});
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: make_checkpoint CONFIG_DIR OUT_DIR [--layers N] [--shard-gib G]\n");
    return 2;
  }
  const fs::path from = argv[1], to = argv[2];
  int layers = 0;
  double shard_gib = 4;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--layers") layers = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--shard-gib") shard_gib = std::atof(argv[i + 1]);
  }
  try {
    fs::create_directories(to);
    write_config(from, to, layers);
    const std::vector<Out> ts = layout(to);
    const size_t shard_bytes = static_cast<size_t>(shard_gib * 1073741824.0);
    std::vector<std::vector<Out>> shards(1);
    size_t in_shard = 0, total = 0;
    for (const auto& t : ts) {
      if (in_shard > 0 && in_shard + t.bytes > shard_bytes) shards.emplace_back(), in_shard = 0;
      shards.back().push_back(t);
      in_shard += t.bytes;
      total += t.bytes;
    }
    nlohmann::json index{{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      write_shard(to / name, shards[i], seed);
      for (const auto& t : shards[i]) index["weight_map"][t.name] = name;
      std::printf("%s: %zu tensors\n", name.c_str(), shards[i].size());
    }
    std::ofstream(to / "model.safetensors.index.json") << index.dump(2) << "\n";
    std::printf("%s: %zu tensors, %.2f GiB in %zu shards\n", to.c_str(), ts.size(), total / 1073741824.0,
                shards.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
