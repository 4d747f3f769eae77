// NCCL communicators (tp/comm/nccl_communicator.h): over c10d::ProcessGroupNCCL, or over tp's raw
// NCCL backend (a c10d::Backend whose ncclUniqueId travels through the store and whose
// collectives run on the current torch CUDA stream), and the helpers of the GPU
// all-reduce strategies (nccl_strategy.h).

#include "tp/comm/nccl_communicator.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/communicator_state.h"
#include "comm/nccl/nccl_strategy.h"

#if TP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraphsUtils.cuh>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common/cuda_check.h"
#endif

#if TP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "common/nccl_check.h"
#endif

namespace tp {

namespace detail {

bool current_stream_capturing() {
#if TP_WITH_CUDA
  if (!at::cuda::is_available()) return false;
  return at::cuda::currentStreamCaptureStatus() != at::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

at::Tensor bf16_wire_message(const at::Tensor& t) { return t.to(at::kBFloat16).contiguous().view({-1}); }

void sum_bf16_wire(const std::vector<at::Tensor>& gathered, at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(!gathered.empty(), "sum_bf16_wire: nothing gathered");
  at::Tensor sum = gathered[0].to(at::kFloat);
  for (size_t r = 1; r < gathered.size(); ++r) sum.add_(gathered[r].to(at::kFloat));
  t.copy_(sum.view(t.sizes()));
}

}  // namespace detail

#if TP_WITH_NCCL

namespace {

constexpr const char* kRawBackendName = "tp_raw_nccl";

ncclDataType_t nccl_type(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    default: TORCH_CHECK_TYPE(false, "tp raw NCCL ", op, ": dtype ", t, " has no NCCL type");
  }
}

/// One NCCL communicator; destroyed (or aborted, after an error) with its last owner.
struct NcclComm {
  ncclComm_t comm = nullptr;
  int device = 0;
  int rank = 0, world = 1;
  std::chrono::milliseconds timeout{300000};
  bool aborted = false;
  ~NcclComm() {
    if (comm == nullptr) return;
    // No throw from a destructor: a failed destroy only leaks the communicator.
    if (aborted) return;
    ncclCommDestroy(comm);
  }
  void abort() {
    if (!aborted && comm != nullptr) ncclCommAbort(comm);
    aborted = true;
  }
};

/// A raw-NCCL collective, already enqueued on the caller's stream. wait() returns
/// at once while a CUDA graph is being captured (the op only exists in the graph);
/// otherwise it polls the op's event until the timeout, then aborts the
/// communicator and throws: a dead peer is an error, not a hang.
class RawNcclWork final : public c10d::Work {
 public:
  RawNcclWork(std::shared_ptr<NcclComm> comm, c10d::OpType type, const char* what)
      : c10d::Work(comm->rank, type), comm_(std::move(comm)), what_(what) {
    if (!detail::current_stream_capturing()) {
      TP_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
      TP_CHECK_CUDA(cudaEventRecord(event_, c10::cuda::getCurrentCUDAStream(comm_->device).stream()));
    }
  }
  ~RawNcclWork() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  bool isCompleted() override { return event_ == nullptr || cudaEventQuery(event_) == cudaSuccess; }
  bool isSuccess() const override { return true; }
  void synchronize() override {}  // stream-ordered: later work on the stream already follows it
  bool wait(std::chrono::milliseconds timeout) override {
    if (event_ == nullptr) return true;
    // kNoTimeout (0) and c10d's kUnsetTimeout (-1) both mean "the communicator's".
    const auto limit = timeout.count() <= 0 ? comm_->timeout : timeout;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      const cudaError_t st = cudaEventQuery(event_);
      if (st == cudaSuccess) return true;
      if (st != cudaErrorNotReady) TP_CHECK_CUDA(st);
      ncclResult_t async = ncclSuccess;
      TP_CHECK_NCCL(ncclCommGetAsyncError(comm_->comm, &async), what_);
      if (async != ncclSuccess && async != ncclInProgress) {
        comm_->abort();
        TORCH_CHECK(false, "tp raw NCCL ", what_, " on rank ", comm_->rank, " of ", comm_->world,
                    " failed: ", ncclGetErrorString(async), "; the communicator was aborted");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        comm_->abort();
        TORCH_CHECK(false, "tp raw NCCL ", what_, " on rank ", comm_->rank, " of ", comm_->world,
                    " did not complete within ", limit.count(),
                    " ms (a peer died or called a different collective); the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::shared_ptr<NcclComm> comm_;
  const char* what_;
  cudaEvent_t event_ = nullptr;
};

/// The collectives tp::Communicator uses (allreduce, allgather, broadcast, barrier)
/// over one NCCL communicator, on the current stream.
class RawNcclBackend final : public c10d::Backend {
 public:
  RawNcclBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world, std::chrono::milliseconds timeout,
                 const std::string& name)
      : c10d::Backend(rank, world), comm_(std::make_shared<NcclComm>()) {
    comm_->rank = rank;
    comm_->world = world;
    comm_->timeout = timeout;
    TP_CHECK_CUDA(cudaGetDevice(&comm_->device));
    // Rank 0 draws the id and publishes it; the others block in get() until it is
    // there, at most the store's timeout, so a missing rank 0 is an error, not a hang.
    const std::string key = "tp_raw_nccl/" + name + "/unique_id";
    ncclUniqueId id;
    if (rank == 0) {
      TP_CHECK_NCCL(ncclGetUniqueId(&id), "ncclGetUniqueId on rank 0");
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
    }
    const auto bytes = store->get(key);
    TORCH_CHECK(bytes.size() == sizeof(id), "tp raw NCCL: the store's '", key, "' holds ", bytes.size(),
                " bytes; an ncclUniqueId has ", sizeof(id), " (another communicator uses this name?)");
    std::memcpy(&id, bytes.data(), sizeof(id));
    TP_CHECK_NCCL(ncclCommInitRank(&comm_->comm, world, id, rank), "ncclCommInitRank (rank ", rank, " of ", world,
                  ", device ", comm_->device, ")");
  }

  const std::string getBackendName() const override { return kRawBackendName; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    auto& t = single(tensors, "allreduce");
    TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM, "tp raw NCCL allreduce supports SUM only");
    TP_CHECK_NCCL(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.scalar_type(), "allreduce"), ncclSum,
                                comm_->comm, stream()),
                  "allreduce of ", t.numel(), " x ", t.scalar_type());
    return work(c10d::OpType::ALLREDUCE, "allreduce");
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    auto& in = single(inputs, "allgather");
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == comm_->world,
                      "tp raw NCCL allgather: expected one list of ", comm_->world, " output tensors");
    const int64_t n = in.numel();
    // NCCL gathers into one buffer; the pieces are copied out on the same stream.
    auto flat = at::empty({n * comm_->world}, in.options());
    TP_CHECK_NCCL(ncclAllGather(in.data_ptr(), flat.data_ptr(), n, nccl_type(in.scalar_type(), "allgather"),
                                comm_->comm, stream()),
                  "allgather of ", n, " x ", in.scalar_type());
    for (int r = 0; r < comm_->world; ++r) {
      auto& out = outputs[0][r];
      TORCH_CHECK_VALUE(out.numel() == n && out.scalar_type() == in.scalar_type(), "tp raw NCCL allgather: output ", r,
                        " must match the input's size and dtype");
      out.copy_(flat.narrow(0, r * n, n).view(out.sizes()));
    }
    return work(c10d::OpType::ALLGATHER, "allgather");
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    auto& t = single(tensors, "broadcast");
    TP_CHECK_NCCL(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.scalar_type(), "broadcast"),
                                static_cast<int>(opts.rootRank), comm_->comm, stream()),
                  "broadcast of ", t.numel(), " x ", t.scalar_type(), " from root ", opts.rootRank);
    return work(c10d::OpType::BROADCAST, "broadcast");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    // A one-element allreduce that the host waits for: every rank has arrived
    // when it completes.
    const c10::cuda::CUDAGuard guard(comm_->device);
    auto one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, comm_->device));
    TP_CHECK_NCCL(ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_->comm, stream()),
                  "barrier");
    auto w = work(c10d::OpType::BARRIER, "barrier");
    w->wait(opts.timeout);
    return w;
  }

 private:
  at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
    TORCH_CHECK_VALUE(tensors.size() == 1, "tp raw NCCL ", op, ": expected one tensor, got ", tensors.size());
    auto& t = tensors[0];
    TORCH_CHECK_VALUE(t.is_cuda() && t.device().index() == comm_->device && t.is_contiguous(), "tp raw NCCL ", op,
                      ": the tensor must be contiguous on cuda:", comm_->device, " (this communicator's device); got ",
                      t.device(), t.is_contiguous() ? "" : ", non-contiguous");
    return t;
  }
  cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(comm_->device).stream(); }
  c10::intrusive_ptr<c10d::Work> work(c10d::OpType type, const char* what) {
    return c10::make_intrusive<RawNcclWork>(comm_, type, what);
  }

  std::shared_ptr<NcclComm> comm_;
};

}  // namespace

bool nccl_available() { return true; }

Communicator make_nccl_communicator(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world,
                                    CommunicatorOptions options, NcclBackend backend, const std::string& name) {
  constexpr const char* fn = "tp::make_nccl_communicator";
  TORCH_CHECK_VALUE(world >= 1, fn, ": world_size=", world, "; expected at least 1");
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, fn, ": invalid rank ", rank, " (rank should be in the 0..", world - 1,
                    " range)");
  TORCH_CHECK_VALUE(options.timeout.count() > 0, fn, ": options.timeout=", options.timeout.count(),
                    " ms; expected a positive number of milliseconds");
  TORCH_CHECK(at::cuda::is_available(), fn, ": no CUDA device is visible; NCCL needs one GPU per rank");
  detail::check_settings(options);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("tp_nccl/" + name, store);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(prefixed, static_cast<int>(rank), static_cast<int>(world));
  if (backend == NcclBackend::kProcessGroupNccl) {
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, static_cast<int>(rank), static_cast<int>(world),
                                                          nccl_options);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, pg);
  } else {
    auto raw = c10::make_intrusive<RawNcclBackend>(prefixed, static_cast<int>(rank), static_cast<int>(world),
                                                   options.timeout, name);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::CUSTOM, raw);
  }
  return Communicator(group, options);
}

void detail::check_nccl_strategy(const c10d::ProcessGroup* group, AllReduceStrategy strategy, const at::Tensor& t,
                                 const std::string& op) {
  TORCH_CHECK_VALUE(t.is_cuda(), op, ": strategy ", strategy, " reduces CUDA tensors; got one on ", t.device(),
                    ". Use auto for CPU tensors");
  if (strategy == AllReduceStrategy::kNcclBf16Wire) {
    TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat, op, ": strategy ", strategy,
                      " sends float32 messages as bf16; got ", t.scalar_type(), ". Use nccl or auto for it");
    return;
  }
  if (group == nullptr) return;  // world 1: nothing to reduce, any tensor will do
  const auto name = const_cast<c10d::ProcessGroup*>(group)->getBackend(c10::DeviceType::CUDA)->getBackendName();
  TORCH_CHECK_VALUE(name == "nccl" || name == kRawBackendName, op, ": strategy ", strategy,
                    " needs an NCCL group (tp::make_nccl_communicator, or torch.distributed's nccl); this group's "
                    "CUDA backend is '",
                    name, "'. Use auto or process_group");
}

#else  // !TP_WITH_NCCL

bool nccl_available() { return false; }

Communicator make_nccl_communicator(const c10::intrusive_ptr<c10d::Store>&, int64_t, int64_t, CommunicatorOptions,
                                    NcclBackend, const std::string&) {
  TORCH_CHECK(false,
              "tp::make_nccl_communicator: this build of tp has no NCCL (configure with TP_WITH_CUDA=ON "
              "on a machine with the CUDA toolkit and torch's NCCL)");
}

void detail::check_nccl_strategy(const c10d::ProcessGroup*, AllReduceStrategy strategy, const at::Tensor&,
                                 const std::string& op) {
  TORCH_CHECK_VALUE(false, op, ": strategy ", strategy, " needs CUDA and NCCL, and this build of tp has neither");
}

#endif  // TP_WITH_NCCL

}  // namespace tp
