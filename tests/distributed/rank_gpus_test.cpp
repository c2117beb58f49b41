// GPU per rank process (src/distributed/rank_gpus.h): CUDA_VISIBLE_DEVICES as CUDA reads it, and
// the error when TP x PP exceeds the visible GPUs. No GPU needed.
#include "distributed/rank_gpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CudaVisibleDevices, UnsetMeansEveryGpu) { EXPECT_FALSE(parse_cuda_visible_devices(nullptr).has_value()); }

TEST(CudaVisibleDevices, EmptyMeansNone) {
  auto v = parse_cuda_visible_devices("");
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->empty());
}

TEST(CudaVisibleDevices, IndicesAndUuids) {
  EXPECT_THAT(*parse_cuda_visible_devices("2,3"), ElementsAre("2", "3"));
  EXPECT_THAT(*parse_cuda_visible_devices(" 1 , 0"), ElementsAre("1", "0"));
  EXPECT_THAT(*parse_cuda_visible_devices("GPU-8f3a1c2e-1111-2222-3333-444455556666,MIG-abc"),
              ElementsAre("GPU-8f3a1c2e-1111-2222-3333-444455556666", "MIG-abc"));
}

TEST(CudaVisibleDevices, ListEndsAtFirstInvalidEntry) {
  EXPECT_THAT(*parse_cuda_visible_devices("0,1,-1,2"), ElementsAre("0", "1"));
  EXPECT_THAT(*parse_cuda_visible_devices("3,x,4"), ElementsAre("3"));
  EXPECT_THAT(*parse_cuda_visible_devices("0,,1"), ElementsAre("0"));
  EXPECT_TRUE(parse_cuda_visible_devices("-1")->empty());
  EXPECT_TRUE(parse_cuda_visible_devices("GPU-")->empty());
}

TEST(AssignRankGpus, LocalRankTakesVisibleDeviceOfItsIndex) {
  RankGpus g = assign_rank_gpus(2, 8, nullptr, "tensor parallel 2 x pipeline parallel 1");
  EXPECT_THAT(g.device_index, ElementsAre(0, 1));
  EXPECT_EQ(g.list(), "0,1");
}

TEST(AssignRankGpus, NamesComeFromCudaVisibleDevices) {
  RankGpus g = assign_rank_gpus(2, 2, "6,7", "tensor parallel 2 x pipeline parallel 1");
  EXPECT_THAT(g.device_index, ElementsAre(0, 1));  // indices are within the visible set
  EXPECT_EQ(g.list(), "6,7");
  // CUDA saw fewer entries than the list names (an index past the last GPU ends it): the
  // runtime's count is what counts; names beyond the list fall back to the index.
  RankGpus h = assign_rank_gpus(3, 3, "4,5", "tensor parallel 3 x pipeline parallel 1");
  EXPECT_EQ(h.list(), "4,5,2");
}

TEST(AssignRankGpus, MoreRanksThanGpusNamesBothNumbersAndWhatToDo) {
  try {
    assign_rank_gpus(8, 2, "0,1", "tensor parallel 4 x pipeline parallel 2");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    std::string m = e.what();
    EXPECT_THAT(m, HasSubstr("tensor parallel 4 x pipeline parallel 2 needs 8 GPUs"));
    EXPECT_THAT(m, HasSubstr("only 2 are visible (CUDA_VISIBLE_DEVICES=0,1)"));
    EXPECT_THAT(m, HasSubstr("--tensor-parallel-size"));
    EXPECT_THAT(m, HasSubstr("--nnodes"));
  }
  try {
    assign_rank_gpus(2, 1, nullptr, "tensor parallel 2 x pipeline parallel 1");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("only 1 is visible;"));
  }
}

TEST(AssignRankGpus, NoGpuSuggestsCpuRanks) {
  try {
    assign_rank_gpus(2, 0, "", "tensor parallel 2 x pipeline parallel 1");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("no GPU is visible (CUDA_VISIBLE_DEVICES=)"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("--device cpu"));
  }
}

}  // namespace
}  // namespace tessera::dist
