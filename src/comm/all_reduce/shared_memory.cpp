#include "comm/all_reduce/shared_memory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include "comm/all_reduce/fusion_rows.h"
#include "comm/all_reduce/shm_kernels.h"
#include "cpu/features.h"

namespace tp::detail {
namespace {

// Each flag on its own 128-byte line: a rank spinning on a peer's flag must not
// share a line (or the adjacent-line prefetch pair) with a flag that rank writes.
constexpr size_t kFlagStride = 128;
static_assert(sizeof(ShmAllReduce::Fingerprint) <= kFlagStride, "a fingerprint must fit one slot");
constexpr size_t kPage = 4096;
// Elements per block when summing: the fp32/fp64 partial sums stay on the stack.
constexpr int64_t kBlock = 1024;

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory flags must be lock-free atomics to work across processes");

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t flags_bytes(int64_t world) { return round_up(static_cast<size_t>(world) * 7 * kFlagStride, kPage); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string unique_name() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  std::ostringstream name;
  name << "/tp-" << ::getpid() << "-" << std::hex << ((uint64_t{rd()} << 32) | rd()) << std::dec << "-"
       << counter.fetch_add(1);
  return name.str();
}

template <typename T>
constexpr bool is_row_type = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;
template <typename T>
constexpr RowType row_type = std::is_same_v<T, float> ? RowType::kFloat : RowType::kBFloat16;

bool avx512_sums() {
  static const bool yes = cpu::isa() >= cpu::Isa::kAvx512;
  return yes;
}

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

/// Unlinks the name when it goes out of scope, on success and on error alike.
struct Unlinker {
  std::string name;
  ~Unlinker() {
    if (!name.empty()) ::shm_unlink(name.c_str());
  }
};

}  // namespace

ShmAllReduce::ShmAllReduce(int64_t rank, int64_t world, std::chrono::milliseconds timeout,
                           const std::function<void(at::Tensor&)>& broadcast_from_rank0,
                           const std::function<void()>& barrier)
    : rank_(rank), world_(world), timeout_(timeout) {
  const size_t buffer = static_cast<size_t>(kBufferBytes);
  bytes_ = flags_bytes(world) + static_cast<size_t>(world) * 2 * buffer + 2 * buffer;
  // The segment's life: rank 0 picks a name and broadcasts it BEFORE creating the
  // segment, so every rank knows the name of anything that may exist in /dev/shm;
  // rank 0 creates it and broadcasts whether that worked; every rank maps it; a
  // barrier; then every rank unlinks the name (the mappings keep the memory). On any
  // failure past the first broadcast, each surviving rank unlinks it too, so a rank
  // killed half-way (rank 0 included) leaves nothing behind.
  constexpr int64_t kNameBytes = 64;
  at::Tensor name_bytes = at::zeros({kNameBytes}, at::kByte);
  if (rank_ == 0) {
    const std::string picked = unique_name();
    std::memcpy(name_bytes.data_ptr<uint8_t>(), picked.c_str(), picked.size());
  }
  broadcast_from_rank0(name_bytes);
  const std::string name(reinterpret_cast<const char*>(name_bytes.data_ptr<uint8_t>()));
  TORCH_CHECK(!name.empty(), "tp shared-memory all_reduce: rank ", rank_, " of world_size ", world_,
              ": got no segment name from rank 0");
  Unlinker unlinker{name};  // every rank, from here on: shm_unlink of a name already gone is harmless
  int fd = -1;
  std::string error;
  if (rank_ == 0) {
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      error = "shm_open(" + name + ", O_CREAT|O_EXCL) failed: " + errno_text(errno);
    } else {
      // posix_fallocate, not only ftruncate: a /dev/shm too small for the segment is
      // then an error here, not a SIGBUS on first touch in the middle of a reduction.
      const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes_));
      if (err != 0) {
        error = "reserving " + std::to_string(bytes_) + " bytes of shared memory for " + name +
                " failed: " + errno_text(err) + "; is /dev/shm large enough?";
      }
    }
  }
  // Rank 0 says whether the segment exists, even when it failed, so no peer waits for it.
  at::Tensor created = at::full({1}, error.empty() ? 1 : 0, at::kByte);
  broadcast_from_rank0(created);
  if (rank_ == 0 && !error.empty()) {
    if (fd >= 0) ::close(fd);
    TORCH_CHECK(false, "tp shared-memory all_reduce: rank 0 of world_size ", world_,
                " could not create its segment: ", error);
  }
  TORCH_CHECK(created.item<uint8_t>() == 1, "tp shared-memory all_reduce: rank ", rank_, " of world_size ", world_,
              ": rank 0 could not create the shared-memory segment (see rank 0's error)");
  if (rank_ != 0) {
    fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    TORCH_CHECK(fd >= 0, "tp shared-memory all_reduce: rank ", rank_, " of world_size ", world_,
                " could not open rank 0's segment ", name, ": ", errno_text(errno), "; are all ranks on one host?");
  }
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the segment alive
  TORCH_CHECK(p != MAP_FAILED, "tp shared-memory all_reduce: rank ", rank_, " of world_size ", world_,
              " could not map ", bytes_, " bytes of ", name, ": ", errno_text(map_errno));
  base_ = p;
  flag(rank_, kPid).store(static_cast<uint64_t>(::getpid()), std::memory_order_release);
  // Every rank has the segment mapped once this returns; the Unlinkers then remove the
  // name, leaving the mappings as the segment's only references.
  try {
    barrier();
  } catch (...) {
    ::munmap(base_, bytes_);
    base_ = nullptr;
    throw;
  }
  // A peer in another pid namespace (a container sharing /dev/shm and loopback) is
  // invisible here; its pid must not be mistaken for an exited process.
  watch_pid_.assign(world_, false);
  for (int64_t r = 0; r < world_; ++r) {
    const auto pid = static_cast<pid_t>(flag(r, kPid).load(std::memory_order_acquire));
    watch_pid_[r] = pid != ::getpid() && (::kill(pid, 0) == 0 || errno == EPERM);
  }
}

void ShmAllReduce::check_usable(const char* op) const {
  TORCH_CHECK(!broken_, "tp::Communicator::", op, " (", what_, "): rank ", rank_, " of world_size ", world_,
              ": an earlier shared-memory step of this communicator timed out at sequence ", seq_,
              "; the ranks are out of step, so this communicator cannot be used again");
}

void ShmAllReduce::exchange(const Fingerprint& fp, const char* op, const OnMismatch& on_mismatch) {
  what_ = "shared-memory call check";
  check_usable(op);
  step<float, float, float>(nullptr, 0, /*two_shot=*/false, op, &fp, on_mismatch);
}

ShmAllReduce::~ShmAllReduce() {
  if (base_ == nullptr) return;
  // Peers waiting for this rank then fail at once instead of after the timeout.
  flag(rank_, kLeft).store(1, std::memory_order_release);
  ::munmap(base_, bytes_);
}

std::atomic<uint64_t>& ShmAllReduce::flag(int64_t rank, Slot slot) const {
  auto* p = static_cast<char*>(base_) + (rank * kSlots + slot) * kFlagStride;
  return *reinterpret_cast<std::atomic<uint64_t>*>(p);
}

ShmAllReduce::Fingerprint* ShmAllReduce::fingerprint(int64_t rank, int64_t parity) const {
  auto* p = static_cast<char*>(base_) + (rank * kSlots + kFingerprint + parity) * kFlagStride;
  return reinterpret_cast<Fingerprint*>(p);
}

void* ShmAllReduce::data(int64_t rank, int64_t parity) const {
  return static_cast<char*>(base_) + flags_bytes(world_) + (rank * 2 + parity) * kBufferBytes;
}

void* ShmAllReduce::result(int64_t parity) const {
  return static_cast<char*>(base_) + flags_bytes(world_) + (world_ * 2 + parity) * kBufferBytes;
}

void ShmAllReduce::check_alive(int64_t peer, uint64_t target, const char* waiting_for, const char* op) {
  const bool left = flag(peer, kLeft).load(std::memory_order_acquire) != 0;
  const auto pid = static_cast<pid_t>(flag(peer, kPid).load(std::memory_order_acquire));
  const bool exited = watch_pid_[peer] && ::kill(pid, 0) != 0 && errno == ESRCH;
  if (!left && !exited) return;
  broken_ = true;
  TORCH_CHECK(false, "tp::Communicator::", op, " failed on rank ", rank_, " of world_size ", world_, " (strategy ",
              what_, "): rank ", peer, " is gone (",
              left ? "its communicator was destroyed: it failed or stopped calling collectives"
                   : "its process, pid " + std::to_string(pid) + ", has exited",
              ") while this rank waited at sequence ", target, " for it to ", waiting_for,
              ". This communicator's shared-memory state is now unknown; do not use it again.");
}

void ShmAllReduce::wait_peers(Slot slot, uint64_t target, const char* waiting_for, const char* op) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  int64_t spins = 0;
  for (int64_t p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    while (flag(p, slot).load(std::memory_order_acquire) < target) {
      // Back off: a short busy spin answers fastest, but ranks as threads may share
      // fewer cores than there are ranks, so yield soon and sleep when it is long.
      ++spins;
      if (spins < 128) {
        cpu_relax();
      } else if (spins < 20000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (spins % 1024 == 0) check_alive(p, target, waiting_for, op);
      if (spins % 64 == 0 && std::chrono::steady_clock::now() > deadline) {
        broken_ = true;
        std::vector<int64_t> missing;
        for (int64_t q = 0; q < world_; ++q) {
          if (q != rank_ && flag(q, slot).load(std::memory_order_acquire) < target) missing.push_back(q);
        }
        TORCH_CHECK(false, "tp::Communicator::", op, " failed on rank ", rank_, " of world_size ", world_, " (timeout ",
                    timeout_.count(), " ms, strategy ", what_, "): waited at sequence ", target, " for rank(s) ",
                    c10::IntArrayRef(missing), " to ", waiting_for,
                    ". Likely causes: a peer rank died or stopped calling collectives, or the "
                    "ranks made different calls. This communicator's shared-memory state is now "
                    "unknown; do not use it again.");
      }
    }
  }
}

template <typename T, typename P>
int64_t ShmAllReduce::publish(const T* values, int64_t n, const char* op, const Fingerprint* fp,
                              const OnMismatch& on_mismatch) {
  const uint64_t s = ++seq_;
  const int64_t parity = static_cast<int64_t>(s & 1);
  // Buffer `parity` (and result `parity`) were last used at step s-2: peers must have
  // finished reading them before this rank overwrites them.
  if (s > 2) wait_peers(kDone, s - 2, "finish reading step s-2's buffers", op);
  P* mine = static_cast<P*>(data(rank_, parity));
  if constexpr (std::is_same_v<T, P>) {
    if (n > 0) std::memcpy(mine, values, static_cast<size_t>(n) * sizeof(P));
  } else {
    for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<P>(values[i]);
  }
  // Double-buffered like the data: a peer may still compare step s-1's fingerprint.
  if (fp != nullptr) *fingerprint(rank_, parity) = *fp;
  flag(rank_, kArrived).store(s, std::memory_order_release);
  wait_peers(kArrived, s, "publish its input", op);
  if (fp != nullptr) {
    for (int64_t r = 0; r < world_; ++r) {
      const Fingerprint theirs = *fingerprint(r, parity);
      if (theirs == *fp) continue;
      // Every rank sees a mismatch (each differs from someone) and gives up at this same
      // step, having read nothing: mark it read so the workspace stays in step.
      flag(rank_, kDone).store(s, std::memory_order_release);
      on_mismatch(r, theirs);
      TORCH_INTERNAL_ASSERT(false, "ShmAllReduce: on_mismatch returned instead of throwing");
    }
  }
  return parity;
}

template <typename P, typename Acc, typename Out>
void ShmAllReduce::sum_ranks(int64_t parity, int64_t lo, int64_t hi, Out* out) const {
  std::vector<const P*> in(world_);
  for (int64_t r = 0; r < world_; ++r) in[r] = static_cast<const P*>(data(r, parity));
  // float32 / bf16 summed in float32: the AVX-512 kernel (the same bits) where the CPU has it.
  constexpr bool kVector = std::is_same_v<Acc, float> && is_row_type<P> && is_row_type<Out>;
  if constexpr (kVector) {
    if (avx512_sums()) {
      sum_parts_avx512(reinterpret_cast<const void* const*>(in.data()), world_, lo, hi - lo, row_type<P>, out,
                       row_type<Out>, cpu::features().avx512bf16);
      return;
    }
  }
  // Ranks 0..world-1 in that order for every element, on every rank: the results are
  // bitwise identical whichever rank computes them.
  Acc acc[kBlock];
  for (int64_t b = lo; b < hi; b += kBlock) {
    const int64_t m = std::min(kBlock, hi - b);
    const P* __restrict first = in[0] + b;
    for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<Acc>(first[i]);
    for (int64_t r = 1; r < world_; ++r) {
      const P* __restrict src = in[r] + b;
      for (int64_t i = 0; i < m; ++i) acc[i] += static_cast<Acc>(src[i]);
    }
    for (int64_t i = 0; i < m; ++i) out[b - lo + i] = static_cast<Out>(acc[i]);
  }
}

template <typename T, typename P, typename Acc>
void ShmAllReduce::step(T* values, int64_t n, bool two_shot, const char* op, const Fingerprint* fp,
                        const OnMismatch& on_mismatch) {
  const int64_t parity = publish<T, P>(values, n, op, fp, on_mismatch);
  if (!two_shot) {
    sum_ranks<P, Acc>(parity, 0, n, values);
  } else {
    // Slices are whole 64-byte lines so two owners never write one cache line.
    constexpr int64_t kAlign = 64 / sizeof(P);
    const int64_t per = (n + world_ - 1) / world_;
    const int64_t slice = (per + kAlign - 1) / kAlign * kAlign;
    const int64_t lo = std::min(n, rank_ * slice);
    const int64_t hi = std::min(n, lo + slice);
    P* res = static_cast<P*>(result(parity));
    sum_ranks<P, Acc>(parity, lo, hi, res + lo);
    flag(rank_, kReduced).store(seq_, std::memory_order_release);
    wait_peers(kReduced, seq_, "publish its reduced slice", op);
    if constexpr (std::is_same_v<T, P>) {
      if (n > 0) std::memcpy(values, res, static_cast<size_t>(n) * sizeof(P));
    } else {
      for (int64_t i = 0; i < n; ++i) values[i] = static_cast<T>(res[i]);
    }
  }
  flag(rank_, kDone).store(seq_, std::memory_order_release);
}

template <typename T, typename P>
void ShmAllReduce::run_fused_typed(const T* values, const FusionRows& rows, bool two_shot, const char* op,
                                   const Fingerprint* fp, const OnMismatch& on_mismatch) {
  const int64_t h = rows.hidden, packed = rows.packed_row_bytes();
  // Whole rows a step: their inputs fit one buffer, their packed outputs the result area.
  const int64_t per_step = std::min(kBufferBytes / (h * static_cast<int64_t>(sizeof(P))), kBufferBytes / packed);
  TORCH_INTERNAL_ASSERT(per_step >= 1, "ShmAllReduce::run_fused: a row of ", h, " elements does not fit a step");
  const c10::ScalarType part_dtype = c10::CppTypeToScalarType<P>::value;
  std::vector<const void*> parts(world_);
  // Row r of the step: every rank's part, summed in rank order inside the epilogue.
  const auto finish = [&](int64_t parity, int64_t first, int64_t r) {
    for (int64_t q = 0; q < world_; ++q) parts[q] = static_cast<const P*>(data(q, parity)) + r * h;
    rows.finish(first + r, parts.data(), world_, part_dtype);
  };
  // At least one step, so the fingerprint is compared even for zero rows.
  for (int64_t first = 0; first == 0 || first < rows.rows; first += per_step) {
    const int64_t count = std::min(per_step, rows.rows - first);
    const int64_t parity = publish<T, P>(values + first * h, count * h, op, first == 0 ? fp : nullptr, on_mismatch);
    // Two-shot splits a step's rows only when every rank gets at least two: with fewer,
    // a rank finishing its row, publishing it and copying the others' takes longer than
    // finishing them all (the same bits either way: the same parts, the same epilogue).
    if (!two_shot || count < 2 * world_) {
      for (int64_t r = 0; r < count; ++r) finish(parity, first, r);
    } else {
      // This rank's whole rows of the step; finished, packed into the shared result area.
      const int64_t share = (count + world_ - 1) / world_;
      const int64_t lo = std::min(count, rank_ * share), hi = std::min(count, lo + share);
      char* res = static_cast<char*>(result(parity));
      for (int64_t r = lo; r < hi; ++r) {
        finish(parity, first, r);
        rows.pack(first + r, res + r * packed);
      }
      flag(rank_, kReduced).store(seq_, std::memory_order_release);
      wait_peers(kReduced, seq_, "publish its finished rows", op);
      for (int64_t r = 0; r < count; ++r) {
        if (r < lo || r >= hi) rows.unpack(first + r, res + r * packed);
      }
    }
    flag(rank_, kDone).store(seq_, std::memory_order_release);
  }
}

bool ShmAllReduce::fits_fused(const FusionRows& rows, bool bf16_wire) {
  const int64_t p = bf16_wire ? 2 : static_cast<int64_t>(c10::elementSize(rows.dtype));
  return rows.hidden > 0 && rows.hidden * p <= kBufferBytes && rows.packed_row_bytes() <= kBufferBytes;
}

void ShmAllReduce::run_fused(const at::Tensor& in, const FusionRows& rows, bool two_shot, bool bf16_wire,
                             const char* op, const Fingerprint* fp, const OnMismatch& on_mismatch) {
  what_ = two_shot ? "shm_two_shot (fused)" : "shm_one_shot (fused)";
  check_usable(op);
  TORCH_INTERNAL_ASSERT(in.is_contiguous() && in.scalar_type() == rows.dtype && in.numel() == rows.rows * rows.hidden &&
                        fits_fused(rows, bf16_wire));
  switch (rows.dtype) {
    case at::kFloat:
      if (bf16_wire) {
        run_fused_typed<float, c10::BFloat16>(in.data_ptr<float>(), rows, two_shot, op, fp, on_mismatch);
      } else {
        run_fused_typed<float, float>(in.data_ptr<float>(), rows, two_shot, op, fp, on_mismatch);
      }
      break;
    case at::kBFloat16:
      run_fused_typed<c10::BFloat16, c10::BFloat16>(in.data_ptr<c10::BFloat16>(), rows, two_shot, op, fp, on_mismatch);
      break;
    case at::kHalf:
      run_fused_typed<c10::Half, c10::Half>(in.data_ptr<c10::Half>(), rows, two_shot, op, fp, on_mismatch);
      break;
    default: TORCH_INTERNAL_ASSERT(false, "ShmAllReduce::run_fused: unsupported dtype ", rows.dtype);
  }
}

template <typename T, typename Acc>
void ShmAllReduce::reduce_scatter_typed(const T* values, int64_t n, int64_t lo, int64_t hi, T* out, const char* op,
                                        const Fingerprint* fp, const OnMismatch& on_mismatch) {
  const int64_t capacity = kBufferBytes / static_cast<int64_t>(sizeof(T));
  // At least one step, so the fingerprint is compared even for an empty tensor.
  for (int64_t offset = 0; offset == 0 || offset < n; offset += capacity) {
    const int64_t len = std::min(capacity, n - offset);
    const int64_t parity = publish<T, T>(values + offset, len, op, offset == 0 ? fp : nullptr, on_mismatch);
    // This rank's range within the chunk: the only part of the peers' data it reads.
    const int64_t a = std::max(lo, offset);
    const int64_t b = std::min(hi, offset + len);
    if (a < b) sum_ranks<T, Acc>(parity, a - offset, b - offset, out + (a - lo));
    flag(rank_, kDone).store(seq_, std::memory_order_release);
  }
}

void ShmAllReduce::reduce_scatter(const at::Tensor& flat, int64_t lo, int64_t hi, at::Tensor& out, const char* op,
                                  const Fingerprint* fp, const OnMismatch& on_mismatch) {
  what_ = "shm_reduce_scatter";
  check_usable(op);
  TORCH_INTERNAL_ASSERT(flat.is_contiguous() && out.is_contiguous() && flat.scalar_type() == out.scalar_type() &&
                        0 <= lo && lo <= hi && hi <= flat.numel() && out.numel() == hi - lo);
  const int64_t n = flat.numel();
  switch (flat.scalar_type()) {
    case at::kFloat:
      reduce_scatter_typed<float, float>(flat.data_ptr<float>(), n, lo, hi, out.data_ptr<float>(), op, fp, on_mismatch);
      break;
    case at::kDouble:
      reduce_scatter_typed<double, double>(flat.data_ptr<double>(), n, lo, hi, out.data_ptr<double>(), op, fp,
                                           on_mismatch);
      break;
    case at::kBFloat16:
      reduce_scatter_typed<c10::BFloat16, float>(flat.data_ptr<c10::BFloat16>(), n, lo, hi,
                                                 out.data_ptr<c10::BFloat16>(), op, fp, on_mismatch);
      break;
    case at::kInt:
      reduce_scatter_typed<int32_t, int64_t>(flat.data_ptr<int32_t>(), n, lo, hi, out.data_ptr<int32_t>(), op, fp,
                                             on_mismatch);
      break;
    case at::kHalf:
      reduce_scatter_typed<c10::Half, float>(flat.data_ptr<c10::Half>(), n, lo, hi, out.data_ptr<c10::Half>(), op, fp,
                                             on_mismatch);
      break;
    default: TORCH_INTERNAL_ASSERT(false, "ShmAllReduce::reduce_scatter: unsupported dtype ", flat.scalar_type());
  }
}

template <typename T, typename P, typename Acc>
void ShmAllReduce::run_typed(T* values, int64_t n, bool two_shot, const char* op, const Fingerprint* fp,
                             const OnMismatch& on_mismatch) {
  const int64_t capacity = kBufferBytes / static_cast<int64_t>(sizeof(P));
  for (int64_t offset = 0; offset < n; offset += capacity) {
    // Only the first chunk compares: the ranks agree on the call, hence on the chunks.
    step<T, P, Acc>(values + offset, std::min(capacity, n - offset), two_shot, op, offset == 0 ? fp : nullptr,
                    on_mismatch);
  }
}

void ShmAllReduce::run(at::Tensor& t, bool two_shot, bool bf16_wire, const char* op, const Fingerprint* fp,
                       const OnMismatch& on_mismatch) {
  what_ = two_shot ? "shm_two_shot" : "shm_one_shot";
  check_usable(op);
  at::Tensor c = t.contiguous();
  const int64_t n = c.numel();
  // bfloat16 and float16 inputs travel as they are (exact: they widen to fp32 only
  // when summed), and so do their two-shot slices (the fp32 sum rounded to the dtype,
  // which is what the result would be rounded to anyway).
  switch (c.scalar_type()) {
    case at::kFloat:
      if (bf16_wire) {
        run_typed<float, c10::BFloat16, float>(c.data_ptr<float>(), n, two_shot, op, fp, on_mismatch);
      } else {
        run_typed<float, float, float>(c.data_ptr<float>(), n, two_shot, op, fp, on_mismatch);
      }
      break;
    case at::kDouble: run_typed<double, double, double>(c.data_ptr<double>(), n, two_shot, op, fp, on_mismatch); break;
    // int32 (invariant numerics moves float bits through it: one nonzero term per element),
    // summed in int64 and wrapped back as Gloo's ring would.
    case at::kInt: run_typed<int32_t, int32_t, int64_t>(c.data_ptr<int32_t>(), n, two_shot, op, fp, on_mismatch); break;
    case at::kBFloat16:
      run_typed<c10::BFloat16, c10::BFloat16, float>(c.data_ptr<c10::BFloat16>(), n, two_shot, op, fp, on_mismatch);
      break;
    case at::kHalf:
      run_typed<c10::Half, c10::Half, float>(c.data_ptr<c10::Half>(), n, two_shot, op, fp, on_mismatch);
      break;
    default: TORCH_INTERNAL_ASSERT(false, "ShmAllReduce::run: unsupported dtype ", c.scalar_type());
  }
  if (!c.is_same(t)) t.copy_(c);
}

}  // namespace tp::detail
