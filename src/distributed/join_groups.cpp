#include "distributed/join_groups.h"

#include <cstdlib>

#include "core/error.h"
#include "distributed/control_store.h"
#include "distributed/custom_all_reduce_communicator.h"
#include "distributed/gloo_communicator.h"
#include "distributed/node_locality.h"
#include "distributed/traffic_communicator.h"

#ifdef TESSERA_HAVE_NCCL
#include "distributed/nccl_communicator.h"
#endif

namespace tessera::dist {

namespace {

#ifdef TESSERA_HAVE_NCCL
void join_nccl_groups(const JoinGroupsOptions& o, std::shared_ptr<ControlStoreClient> store, ProcessGroups& g) {
  apply_nccl_host_id(o.node_rank);  // before this process's first NCCL call
  NcclOptions n;
  n.store = store;
  n.device_index = o.device_index;
  n.timeout = o.collective_timeout;
  n.namer = o.namer;
  n.stream = o.stream;
  n.exit_after_failure = o.exit_after_failure;
  NcclCommunicatorFactory data_factory(n);  // sets NCCL_NVLS_ENABLE=0
  g.tp = data_factory.create(o.layout.tp_group(o.rank));
  g.pp = data_factory.create(o.layout.pp_group(o.rank));
  CustomAllReduceConfig car;
  car.disable = o.disable_custom_all_reduce;
  car.store = store;
  car.device_index = o.device_index;
  car.stream = o.stream;
  car.timeout = o.collective_timeout;
  car.namer = o.namer;
  car.ranks_per_node = o.ranks_per_node;
  if (const char* v = std::getenv("NCCL_P2P_DISABLE")) car.nccl_p2p_disable = v;
  g.tp = with_traffic_count(with_custom_all_reduce(std::move(g.tp), car));
  g.pp = with_traffic_count(std::move(g.pp));
}
#endif

}  // namespace

std::unique_ptr<ProcessGroups> join_process_groups(const JoinGroupsOptions& o) {
  const bool local = o.bind_ip == "127.0.0.1";
  auto store = std::make_shared<ControlStoreClient>(
      HeadAddress{o.store_host, o.store_port, o.token, local ? "" : o.bind_ip}, o.rank, std::chrono::seconds(60));
  GlooOptions gloo;
  gloo.store = store;
  gloo.ip = o.bind_ip;
  gloo.namer = o.namer;
  gloo.timeout = o.plan_wait_timeout;
  auto g = std::make_unique<ProcessGroups>();
  g->world = with_traffic_count(GlooCommunicatorFactory(gloo).create(o.layout.world_group(o.rank)));
  if (o.device_tensors) {
#ifdef TESSERA_HAVE_NCCL
    join_nccl_groups(o, store, *g);
    return g;
#else
    fail(ErrorKind::kUnsupported, "CUDA rank processes need NCCL: rebuild with -DTESSERA_CUDA=ON");
#endif
  }
  gloo.timeout = o.collective_timeout;
  GlooCommunicatorFactory data_factory(gloo);
  g->tp = with_traffic_count(data_factory.create(o.layout.tp_group(o.rank)));
  g->pp = with_traffic_count(data_factory.create(o.layout.pp_group(o.rank)));
  return g;
}

}  // namespace tessera::dist
