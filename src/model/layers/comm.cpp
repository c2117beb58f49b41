#include "model/layers/comm.h"

#include "core/error.h"
#include "distributed/communicator.h"

namespace tessera {

ModelComm::ModelComm(Backend& backend, const ParallelContext& pc, const ParallelRuntime& rt)
    : backend_(backend), pc_(pc), rt_(rt) {
  if (pc_.tp_size > 1 && (!rt_.tp || rt_.tp->size() != pc_.tp_size || rt_.tp->rank() != pc_.tp_rank))
    fail(ErrorKind::kInternal, "tensor parallel size {} needs the matching TP communicator", pc_.tp_size);
  if (pc_.pp_size > 1 && (!rt_.pp || rt_.pp->size() != pc_.pp_size || rt_.pp->rank() != pc_.pp_rank))
    fail(ErrorKind::kInternal, "pipeline parallel size {} needs the matching PP communicator", pc_.pp_size);
}

void ModelComm::host_ready(const dist::Communicator& c) {
  // A host-side communicator reads the buffer outside the backend's stream.
  if (!c.stream_ordered()) backend_.synchronize();
}

void ModelComm::all_reduce(const Tensor& t) {
  if (pc_.tp_size == 1) return;
  host_ready(*rt_.tp);
  rt_.tp->all_reduce(t);
}

void ModelComm::gather_to_first(const Tensor& local, const Tensor& out) {
  if (pc_.tp_size == 1) {
    backend_.copy(out, local);
    return;
  }
  host_ready(*rt_.tp);
  rt_.tp->gather(local, out, 0);
}

void ModelComm::broadcast_from_first(const Tensor& t) {
  if (pc_.tp_size == 1) return;
  host_ready(*rt_.tp);
  rt_.tp->broadcast(t, 0);
}

void ModelComm::send_next_stage(const Tensor& t) {
  host_ready(*rt_.pp);
  rt_.pp->send(t, pc_.pp_rank + 1);
}

void ModelComm::recv_prev_stage(const Tensor& t) { rt_.pp->recv(t, pc_.pp_rank - 1); }

bool ModelComm::graph_safe() const { return pc_.pp_size == 1 && (pc_.tp_size == 1 || rt_.tp->stream_ordered()); }

}  // namespace tessera
