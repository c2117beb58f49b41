// Damaged checkpoints: each must fail with one tessera::Error whose single-line
// message names the file and, where there is one, the tensor. Each case starts from a
// real fixture, damages one thing, and runs the whole loading path (config, model,
// checkpoint, weights) as `tessera generate` does; lying headers are also opened
// directly with SafetensorsFile so the loader itself is pinned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "fault_util.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"
#include "loader/safetensors.h"
#include "model/registry.h"

namespace tessera {
namespace {

using testing::copy_fixture;
using testing::read_json;
using testing::StFile;
using testing::TempDir;
using testing::write_json;
namespace fs = std::filesystem;

constexpr const char* kSingle = "llama_gqa2";
constexpr const char* kSharded = "qwen3_mqa_untied_sharded";

// What `tessera generate` does before the first step.
void load_everything(const std::string& dir) {
  ModelConfig cfg = load_model_config(dir);
  CpuBackend backend(1);
  auto model = create_model(cfg, ModelOptions{}, backend);
  Checkpoint ckpt(cfg.model_dir);
  model->weights().load(ckpt, backend);
}

struct Failure {
  bool threw = false;
  ErrorKind kind = ErrorKind::kInternal;
  std::string message;
};

template <typename Fn>
Failure failure_of(Fn&& fn) {
  Failure f;
  try {
    fn();
  } catch (const Error& e) {
    f.threw = true;
    f.kind = e.kind();
    f.message = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-tessera exception: " << e.what();
  }
  return f;
}

// The message is one line and names every string in `names` (file paths, tensor names).
void expect_error(const Failure& f, ErrorKind kind, std::vector<std::string> names) {
  ASSERT_TRUE(f.threw) << "expected a tessera::Error";
  EXPECT_EQ(static_cast<int>(f.kind), static_cast<int>(kind)) << f.message;
  EXPECT_EQ(f.message.find('\n'), std::string::npos) << "not one line: " << f.message;
  EXPECT_EQ(f.message.find('\r'), std::string::npos) << f.message;
  for (char c : f.message) EXPECT_TRUE(static_cast<unsigned char>(c) >= 0x20) << "control byte in: " << f.message;
  for (const auto& n : names)
    EXPECT_NE(f.message.find(n), std::string::npos) << "'" << n << "' not named in: " << f.message;
}

class LoaderFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = copy_fixture(kSingle, tmp_.path());
    st_path_ = dir_ / "model.safetensors";
    st_ = StFile::read(st_path_);
  }
  Failure load_fails() {
    return failure_of([&] { load_everything(dir_.string()); });
  }
  Failure open_fails() {
    return failure_of([&] { SafetensorsFile f(st_path_.string()); });
  }
  // Both the raw file and the whole loading path reject the damage the same way.
  void expect_both(ErrorKind kind, const std::vector<std::string>& names) {
    expect_error(open_fails(), kind, names);
    expect_error(load_fails(), kind, names);
  }
  std::string file() const { return st_path_.string(); }

  TempDir tmp_;
  fs::path dir_, st_path_;
  StFile st_;
};

TEST_F(LoaderFaults, IntactFixtureLoads) {
  // The control: without damage the same path succeeds, so the failures below are the damage's.
  EXPECT_NO_THROW(load_everything(dir_.string()));
  SafetensorsFile f(file());
  EXPECT_EQ(f.tensors().size(), st_.tensor_names().size());
}

TEST_F(LoaderFaults, MissingDirectory) {
  std::string gone = (tmp_.path() / "no_such_model").string();
  expect_error(failure_of([&] { load_everything(gone); }), ErrorKind::kNotFound, {gone});
  expect_error(failure_of([&] { Checkpoint c(gone); }), ErrorKind::kNotFound, {gone});
}

TEST_F(LoaderFaults, MissingConfig) {
  fs::remove(dir_ / "config.json");
  expect_error(load_fails(), ErrorKind::kNotFound, {(dir_ / "config.json").string()});
}

TEST_F(LoaderFaults, ConfigNotJson) {
  testing::write_file(dir_ / "config.json", "{\"architectures\": [\"LlamaForCausalLM\"],\n\x01\x02 oops");
  Failure f = load_fails();
  expect_error(f, ErrorKind::kCorrupt, {(dir_ / "config.json").string(), "does not parse as JSON (parse error"});
  EXPECT_EQ(f.message.find("json.exception"), std::string::npos) << f.message;  // the library's text is not quoted
}

TEST_F(LoaderFaults, GenerationConfigNotJson) {
  testing::write_file(dir_ / "generation_config.json", "{\"eos_token_id\": ");
  expect_error(load_fails(), ErrorKind::kCorrupt, {(dir_ / "generation_config.json").string()});
}

// JSON nested 100,000 deep: `{"a": [[[[...]]]]}`. Loading it overflowed the stack before the depth bound.
std::string deeply_nested_json(const std::string& key) {
  return "{\"" + key + "\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
}

TEST_F(LoaderFaults, DeeplyNestedConfigIsRefusedNamingTheFile) {
  testing::write_file(dir_ / "config.json", deeply_nested_json("architectures"));
  Failure f = load_fails();
  expect_error(f, ErrorKind::kCorrupt, {(dir_ / "config.json").string(), "nested deeper than 128"});
}

TEST_F(LoaderFaults, DeeplyNestedGenerationConfigIsRefusedNamingTheFile) {
  testing::write_file(dir_ / "generation_config.json", deeply_nested_json("eos_token_id"));
  expect_error(load_fails(), ErrorKind::kCorrupt, {(dir_ / "generation_config.json").string(), "nested deeper"});
}

TEST_F(LoaderFaults, DeeplyNestedSafetensorsHeaderIsRefusedNamingTheFile) {
  std::string header = deeply_nested_json("__metadata__");
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  testing::write_file(st_path_, out + header + st_.data);
  expect_both(ErrorKind::kCorrupt, {file(), "nested deeper"});
}

TEST_F(LoaderFaults, MissingWeightsFile) {
  fs::remove(st_path_);
  expect_error(load_fails(), ErrorKind::kNotFound, {dir_.string(), "model.safetensors"});
}

TEST_F(LoaderFaults, EmptyFile) {
  testing::write_file(st_path_, "");
  expect_both(ErrorKind::kCorrupt, {file()});
}

TEST_F(LoaderFaults, ShorterThanLengthField) {
  testing::write_file(st_path_, testing::read_file(st_path_).substr(0, 5));
  expect_both(ErrorKind::kCorrupt, {file()});
}

TEST_F(LoaderFaults, TruncatedInHeader) {
  std::string bytes = testing::read_file(st_path_);
  testing::write_file(st_path_, bytes.substr(0, 8 + st_.header.dump().size() / 2));
  expect_both(ErrorKind::kCorrupt, {file(), "truncated"});
}

TEST_F(LoaderFaults, TruncatedInData) {
  // Cut the last tensor (by offset) in half: that tensor must be named.
  std::string last;
  for (const auto& n : st_.tensor_names())
    if (last.empty() || st_.end(n) > st_.end(last)) last = n;
  uint64_t cut = (st_.begin(last) + st_.end(last)) / 2;
  st_.data.resize(cut);
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + last + "'"});
}

TEST_F(LoaderFaults, HeaderLengthLargerThanFile) {
  std::string bytes = testing::read_file(st_path_);
  st_.write(st_path_, static_cast<int64_t>(bytes.size()));
  expect_both(ErrorKind::kCorrupt, {file()});
}

TEST_F(LoaderFaults, HeaderLengthHuge) {
  st_.write(st_path_, int64_t{1} << 62);
  expect_both(ErrorKind::kCorrupt, {file()});
}

TEST_F(LoaderFaults, HeaderNotJson) {
  std::string h = st_.header.dump();
  std::string garbage(h.size(), 'x');
  garbage[0] = '{';
  garbage[7] = '\n';  // raw bytes from the file must not break the one-line message
  garbage[9] = '\x07';
  std::string out(8, '\0');
  uint64_t n = garbage.size();
  std::memcpy(out.data(), &n, 8);
  testing::write_file(st_path_, out + garbage + st_.data);
  expect_both(ErrorKind::kCorrupt, {file()});
}

TEST_F(LoaderFaults, HeaderNotAnObject) {
  st_.header = nlohmann::ordered_json::array({1, 2, 3});
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file()});
}

TEST_F(LoaderFaults, HeaderEntryLacksFields) {
  const std::string t = "model.norm.weight";
  st_.header[t].erase("shape");
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + t + "'"});
}

TEST_F(LoaderFaults, OffsetsPastTheEnd) {
  const std::string t = "model.layers.0.self_attn.q_proj.weight";
  uint64_t len = st_.end(t) - st_.begin(t);
  st_.header[t]["data_offsets"] = {st_.data.size() - len / 2, st_.data.size() - len / 2 + len};
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + t + "'"});
}

TEST_F(LoaderFaults, OffsetsInverted) {
  const std::string t = "model.layers.1.mlp.up_proj.weight";
  st_.header[t]["data_offsets"] = {st_.end(t), st_.begin(t)};
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + t + "'"});
}

TEST_F(LoaderFaults, OffsetsNegativeOrNotNumbers) {
  const std::string t = "model.layers.1.mlp.up_proj.weight";
  st_.header[t]["data_offsets"] = {-2, st_.end(t)};
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + t + "'"});
  st_.header[t]["data_offsets"] = {"0", "16"};
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + t + "'"});
}

TEST_F(LoaderFaults, OffsetsOverlapAnotherTensor) {
  // k_proj and v_proj have the same size; point v_proj at k_proj's bytes.
  const std::string k = "model.layers.0.self_attn.k_proj.weight", v = "model.layers.0.self_attn.v_proj.weight";
  ASSERT_EQ(st_.end(k) - st_.begin(k), st_.end(v) - st_.begin(v));
  st_.header[v]["data_offsets"] = st_.header[k]["data_offsets"];
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + v + "'"});
  // Partial overlap: shift one tensor half-way into its neighbour.
  st_ = StFile::read(testing::fixture_path(kSingle) / "model.safetensors");
  const std::string a = "model.layers.0.mlp.down_proj.weight";
  uint64_t shift = (st_.end(a) - st_.begin(a)) / 2;
  std::string b;
  for (const auto& n : st_.tensor_names())
    if (st_.begin(n) == st_.end(a)) b = n;
  ASSERT_FALSE(b.empty());
  st_.header[b]["data_offsets"] = {st_.begin(b) - shift, st_.end(b) - shift};
  st_.write(st_path_);
  Failure f = open_fails();
  expect_error(f, ErrorKind::kCorrupt, {file()});
  EXPECT_TRUE(f.message.find("'" + a + "'") != std::string::npos || f.message.find("'" + b + "'") != std::string::npos)
      << f.message;
}

TEST_F(LoaderFaults, SizeDoesNotMatchDtypeTimesShape) {
  const std::string t = "model.embed_tokens.weight";  // [256, 64] bf16
  st_.header[t]["shape"] = {256, 63};
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + t + "'"});
  st_.header[t]["shape"] = {256, 64};
  st_.header[t]["dtype"] = "F32";  // same shape, twice the bytes
  st_.write(st_path_);
  expect_both(ErrorKind::kCorrupt, {file(), "'" + t + "'"});
}

TEST_F(LoaderFaults, AbsurdShape) {
  const std::string t = "model.norm.weight";
  for (auto shape : {nlohmann::ordered_json{1ull << 50}, nlohmann::ordered_json{1ull << 31, 1ull << 31},
                     nlohmann::ordered_json{1ull << 32, 1ull << 32}, nlohmann::ordered_json{1, 2, 3, 4, 5, 6, 7},
                     nlohmann::ordered_json{-64}, nlohmann::ordered_json{64.5}, nlohmann::ordered_json{"64"}}) {
    SCOPED_TRACE(shape.dump());
    st_.header[t]["shape"] = shape;
    // A shape whose byte count wraps around 2^64 to the real span must not slip through.
    if (shape.size() == 2 && shape[0] == (1ull << 31)) st_.header[t]["dtype"] = "F32";  // 2^62 * 4 = 2^64 -> 0
    if (shape.size() == 2 && shape[0] == (1ull << 32)) st_.header[t]["dtype"] = "U8";   // 2^64 -> 0
    if (shape.size() == 2) st_.header[t]["data_offsets"] = {st_.begin(t), st_.begin(t)};
    st_.write(st_path_);
    expect_both(ErrorKind::kCorrupt, {file(), "'" + t + "'"});
    st_ = StFile::read(testing::fixture_path(kSingle) / "model.safetensors");
  }
}

TEST_F(LoaderFaults, UnsupportedDtype) {
  const std::string t = "model.layers.1.self_attn.o_proj.weight";
  for (const char* dt : {"F64", "C64", "BOOL", "F4"}) {
    SCOPED_TRACE(dt);
    st_.header[t]["dtype"] = dt;
    st_.write(st_path_);
    expect_both(ErrorKind::kUnsupported, {file(), "'" + t + "'", dt});
  }
}

TEST_F(LoaderFaults, MissingTensor) {
  const std::string t = "model.layers.1.mlp.down_proj.weight";
  st_.remove(t);
  st_.write(st_path_);
  EXPECT_NO_THROW(SafetensorsFile f(file()));  // the file itself is consistent
  expect_error(load_fails(), ErrorKind::kNotFound, {file(), "'" + t + "'"});
}

TEST_F(LoaderFaults, WrongShapeWithConsistentByteCount) {
  // gate_proj is [128, 64]; the transpose has the same byte count, so only the model's
  // declared shape can catch it.
  const std::string t = "model.layers.0.mlp.gate_proj.weight";
  ASSERT_EQ(st_.header[t]["shape"], nlohmann::ordered_json({128, 64}));
  st_.header[t]["shape"] = {64, 128};
  st_.write(st_path_);
  EXPECT_NO_THROW(SafetensorsFile f(file()));
  expect_error(load_fails(), ErrorKind::kCorrupt, {file(), "'" + t + "'", "[64, 128]", "[128, 64]"});
  // Same for a plain (not stacked) parameter and a 1-d one with a different length.
  st_ = StFile::read(testing::fixture_path(kSingle) / "model.safetensors");
  const std::string o = "model.layers.1.self_attn.o_proj.weight";
  auto s = st_.header[o]["shape"];
  st_.header[o]["shape"] = {s[0].get<int64_t>() * 2, s[1].get<int64_t>() / 2};
  st_.write(st_path_);
  expect_error(load_fails(), ErrorKind::kCorrupt, {file(), "'" + o + "'"});
}

TEST_F(LoaderFaults, UnsupportedArchitecture) {
  auto cfg = read_json(dir_ / "config.json");
  cfg["architectures"] = {"GPT2LMHeadModel"};
  write_json(dir_ / "config.json", cfg);
  expect_error(load_fails(), ErrorKind::kUnsupported, {"GPT2LMHeadModel", (dir_ / "config.json").string()});
}

TEST_F(LoaderFaults, ArchitecturesOfTheWrongType) {
  auto cfg = read_json(dir_ / "config.json");
  cfg["architectures"] = {42};
  write_json(dir_ / "config.json", cfg);
  expect_error(load_fails(), ErrorKind::kCorrupt, {(dir_ / "config.json").string(), "architectures"});
}

TEST_F(LoaderFaults, ConfigFieldOfTheWrongType) {
  auto cfg = read_json(dir_ / "config.json");
  cfg["hidden_size"] = "sixty-four";
  write_json(dir_ / "config.json", cfg);
  expect_error(load_fails(), ErrorKind::kCorrupt, {(dir_ / "config.json").string(), "hidden_size"});
}

// Counts this process's mappings of `path` (a throwing constructor must not leak its mmap).
int mappings_of(const std::string& path) {
  std::string maps = testing::read_file("/proc/self/maps");
  int n = 0;
  for (size_t pos = 0; (pos = maps.find(path, pos)) != std::string::npos; pos += path.size()) ++n;
  return n;
}

TEST_F(LoaderFaults, RejectedFileIsUnmapped) {
  const std::string t = "model.layers.1.mlp.up_proj.weight";
  st_.header[t]["data_offsets"] = {st_.end(t), st_.begin(t)};
  st_.write(st_path_);
  for (int i = 0; i < 3; ++i) EXPECT_THROW(SafetensorsFile f(file()), Error);
  EXPECT_EQ(mappings_of(file()), 0);
  {
    st_ = StFile::read(testing::fixture_path(kSingle) / "model.safetensors");
    st_.write(st_path_);
    SafetensorsFile good(file());
    EXPECT_EQ(mappings_of(file()), 0) << "opening reads the header; only data() maps the file";
    (void)good.data(good.tensors().begin()->second);
    EXPECT_EQ(mappings_of(file()), 1) << "the probe itself must see a live mapping";
  }
  EXPECT_EQ(mappings_of(file()), 0);
}

TEST_F(LoaderFaults, WeightsPathIsADirectory) {
  fs::remove(st_path_);
  fs::create_directory(st_path_);
  expect_error(open_fails(), ErrorKind::kNotFound, {file()});
}

// ---- sharded checkpoints ----

class ShardedFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = copy_fixture(kSharded, tmp_.path());
    index_path_ = dir_ / "model.safetensors.index.json";
    index_ = read_json(index_path_);
  }
  Failure load_fails() {
    return failure_of([&] { load_everything(dir_.string()); });
  }
  // A tensor that the index maps to `shard`.
  std::string tensor_in(const std::string& shard) {
    for (const auto& [t, f] : index_["weight_map"].items())
      if (f == shard) return t;
    return "";
  }
  TempDir tmp_;
  fs::path dir_, index_path_;
  nlohmann::ordered_json index_;
};

TEST_F(ShardedFaults, IntactFixtureLoads) {
  EXPECT_NO_THROW(load_everything(dir_.string()));
  EXPECT_EQ(Checkpoint(dir_.string()).files().size(), 8u);
}

TEST_F(ShardedFaults, MissingShard) {
  const std::string shard = "model-00003-of-00008.safetensors";
  std::string t = tensor_in(shard);
  ASSERT_FALSE(t.empty());
  fs::remove(dir_ / shard);
  expect_error(load_fails(), ErrorKind::kNotFound, {(dir_ / shard).string(), "'" + t + "'"});
}

TEST_F(ShardedFaults, ShardPathEscapesTheDirectory) {
  // A shard outside the model directory exists, so only the name check can stop it.
  fs::copy_file(dir_ / "model-00002-of-00008.safetensors", tmp_.path() / "outside.safetensors");
  for (const char* bad : {"../outside.safetensors", "..", "/etc/passwd", "sub/../../outside.safetensors"}) {
    SCOPED_TRACE(bad);
    auto idx = index_;
    const std::string t = "model.layers.0.mlp.down_proj.weight";
    idx["weight_map"][t] = bad;
    write_json(index_path_, idx);
    expect_error(load_fails(), ErrorKind::kCorrupt, {index_path_.string(), bad, "'" + t + "'"});
  }
}

TEST_F(ShardedFaults, IndexNotJsonOrWithoutWeightMap) {
  testing::write_file(index_path_, "{\"weight_map\": {");
  expect_error(load_fails(), ErrorKind::kCorrupt, {index_path_.string()});
  testing::write_file(index_path_, "{\"metadata\": {}}");
  expect_error(load_fails(), ErrorKind::kCorrupt, {index_path_.string(), "weight_map"});
  testing::write_file(index_path_, "{\"weight_map\": {\"model.norm.weight\": 7}}");
  expect_error(load_fails(), ErrorKind::kCorrupt, {index_path_.string(), "model.norm.weight"});
}

TEST_F(ShardedFaults, DeeplyNestedIndexIsRefusedNamingTheFile) {
  testing::write_file(index_path_, deeply_nested_json("weight_map"));
  expect_error(load_fails(), ErrorKind::kCorrupt, {index_path_.string(), "nested deeper"});
}

TEST_F(ShardedFaults, TensorMissingFromEveryShard) {
  // Remove a tensor from its shard (file stays consistent): the error names the tensor
  // and the shard the index says should hold it.
  const std::string t = "model.layers.1.self_attn.k_norm.weight";
  std::string shard = index_["weight_map"][t].get<std::string>();
  StFile st = StFile::read(dir_ / shard);
  st.remove(t);
  st.write(dir_ / shard);
  expect_error(load_fails(), ErrorKind::kNotFound, {(dir_ / shard).string(), "'" + t + "'"});
}

TEST_F(ShardedFaults, TruncatedShard) {
  const std::string shard = "model-00005-of-00008.safetensors";
  std::string bytes = testing::read_file(dir_ / shard);
  StFile st = StFile::read(dir_ / shard);
  std::string last;
  for (const auto& n : st.tensor_names())
    if (last.empty() || st.end(n) > st.end(last)) last = n;
  testing::write_file(dir_ / shard, bytes.substr(0, bytes.size() - 3));
  expect_error(load_fails(), ErrorKind::kCorrupt, {(dir_ / shard).string(), "'" + last + "'"});
}

}  // namespace
}  // namespace tessera
