// The custom all-reduce as the distributed layer's device fast path (make_device_all_reduce,
// declared in dist/custom_all_reduce_communicator.h): CustomAllReduce behind InPlaceAllReduce.
#include "backend/cuda/custom_all_reduce.h"
#include "distributed/custom_all_reduce_communicator.h"

namespace tessera::dist {

namespace {

class CudaInPlaceAllReduce : public InPlaceAllReduce {
 public:
  CudaInPlaceAllReduce(std::unique_ptr<cuda::CustomAllReduce> car, void* stream)
      : car_(std::move(car)), stream_(static_cast<CUstream_st*>(stream)) {}
  bool should_use(DType dtype, size_t bytes) const override {
    return cuda::CustomAllReduce::supports(dtype) && car_->should_use(bytes);
  }
  void all_reduce(void* data, DType dtype, int64_t n) override { car_->all_reduce(data, dtype, n, stream_); }
  std::string describe() const override { return car_->describe(); }
  std::optional<std::string> failure() const override { return car_->failure(); }

 private:
  std::unique_ptr<cuda::CustomAllReduce> car_;
  CUstream_st* stream_;
};

}  // namespace

std::unique_ptr<InPlaceAllReduce> make_device_all_reduce(const GroupInfo& g, const CustomAllReduceConfig& config,
                                                         const AllGatherBytes& all_gather) {
  cuda::CustomAllReduceOptions options;
  options.policy.max_bytes = config.max_bytes;
  options.policy.one_shot_max_bytes = config.one_shot_max_bytes;
  options.timeout = config.timeout;
  auto car =
      cuda::CustomAllReduce::create(g.rank, g.size(), config.device_index, all_gather, config.max_bytes, options);
  if (!car) return nullptr;
  return std::make_unique<CudaInPlaceAllReduce>(std::move(car), config.stream);
}

}  // namespace tessera::dist
