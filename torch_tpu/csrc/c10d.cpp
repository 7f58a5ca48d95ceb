// c10d backend "tpu_dist": PyTorch's c10d::Backend for tpu tensors.
//
// The transport is an existing engine, Gloo inside torch (a ProcessGroupGloo
// built by torch_tpu/distributed.py over the same store, under its own key
// prefix): nothing of ours goes on the wire. This file only stages: a
// collective's inputs are copied from the device to pinned host buffers by the
// runtime (tpurt_memcpy_d2h on the tensor's current stream, so the copy sees
// every kernel queued before the call: a cut point in DeferAndFuse, deferred
// inputs are materialised first), Gloo runs on the host buffers, and its
// completion callback queues the host -> device copies of the results on the
// caller's stream (asynchronous: the pinned buffers' reuse is fenced by the
// runtime's stream sequence numbers). The Work returned completes, and its
// future carries the tpu outputs, once those copies are queued; anything the
// caller queues after wait() runs after them. all_reduce of a contiguous
// tensor of a Gloo dtype skips the copies (zero copy, below).
//
// Why C++ and not a Python backend: torch 2.13 cannot subclass
// c10d.Backend from Python (no constructor, no trampoline); a Python
// ProcessGroup subclass would replace the whole group, so "cpu:gloo,tpu:tpu_dist"
// and pg._get_backend(tpu) would not hold, and DDP's reducer, functional
// collectives and FSDP2 would call into Python under the GIL from autograd
// threads. A C++ Backend is dispatched by c10d's PrivateUse1 kernels like
// NCCL's, with no Python on the path. Gloo's C++ headers are not shipped with
// torch, so the Gloo backend is held through the c10d::Backend interface only.
//
// Dtypes and reduce ops Gloo lacks: data-moving collectives send any dtype
// as bytes; reductions run bool as uint8 (SUM -> MAX, PRODUCT -> MIN, as
// NCCL), complex as its real view (SUM, AVG, PREMUL_SUM), int16 / uint16 in
// int32, uint32 / uint64 in int64, other floating types in float32;
// PREMUL_SUM multiplies the input on the device, then sums.
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>

#include "glue.h"

namespace torch_tpu {
namespace {

namespace py = pybind11;
using c10d::ReduceOp;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using Tensors = std::vector<at::Tensor>;

constexpr const char* kName = "tpu_dist";

// ------------------------------------------------------------- validation

void check_tensor(const at::Tensor& t, const char* op) {
  if (!t.defined())
    C10_THROW_ERROR(ValueError, c10::str(kName, " ", op, ": undefined tensor"));
  if (t.device().type() != kTpu || t.layout() != at::kStrided)
    C10_THROW_ERROR(ValueError, c10::str("Tensors must be TPU and dense: ", kName, " ", op, " got a ",
                                         t.layout() == at::kStrided ? "" : "sparse ", "tensor on ", t.device()));
}

void check_tensors(const Tensors& v, const char* op) {
  for (const auto& t : v) check_tensor(t, op);
  for (const auto& t : v)
    if (t.device() != v[0].device())
      C10_THROW_ERROR(ValueError, c10::str(kName, " ", op, ": tensors on different devices (", v[0].device(), " and ",
                                           t.device(), ")"));
}

const at::Tensor& one_tensor(const Tensors& v, const char* op) {
  if (v.size() != 1)
    C10_THROW_ERROR(ValueError, c10::str(kName, " ", op, ": expecting one tensor only but got ", v.size()));
  check_tensor(v[0], op);
  return v[0];
}

// ------------------------------------------------------------ dtype plans

bool gloo_has(at::ScalarType s) {
  switch (s) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kChar: case at::kByte: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

// How a reduction of dtype `s` with `op` runs on Gloo.
struct ReducePlan {
  at::ScalarType wire;  // host buffer dtype (complex: the complex dtype, sent as its real view)
  ReduceOp op;          // the op Gloo runs
  bool premul = false;  // multiply the input by the PREMUL_SUM factor first
};

const char* op_name(ReduceOp::RedOpType t) {
  switch (t) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

ReducePlan plan_reduce(at::ScalarType s, const ReduceOp& op, const char* what) {
  ReducePlan p{s, op};
  ReduceOp::RedOpType t = op.op_;
  if (t == ReduceOp::PREMUL_SUM) {
    p.premul = true;
    p.op = ReduceOp(ReduceOp::SUM);
    t = ReduceOp::SUM;
  }
  bool bitwise = t == ReduceOp::BAND || t == ReduceOp::BOR || t == ReduceOp::BXOR;
  if (bitwise && (at::isFloatingType(s) || at::isComplexType(s)))
    C10_THROW_ERROR(ValueError, c10::str(kName, " ", what, ": ReduceOp.", op_name(t), " is not defined for ", s));
  if (at::isComplexType(s)) {
    if (t != ReduceOp::SUM && t != ReduceOp::AVG)
      C10_THROW_ERROR(ValueError, c10::str(kName, " ", what, ": ReduceOp.", op_name(op.op_),
                                           " is not supported on complex tensors"));
    return p;
  }
  if (s == at::kBool) {
    if (t == ReduceOp::AVG)
      C10_THROW_ERROR(ValueError, c10::str(kName, " ", what, ": ReduceOp.AVG is not supported on bool tensors"));
    p.wire = at::kByte;
    if (t == ReduceOp::SUM) p.op = ReduceOp(ReduceOp::MAX);
    if (t == ReduceOp::PRODUCT) p.op = ReduceOp(ReduceOp::MIN);
    return p;
  }
  if (gloo_has(s)) return p;
  if (s == at::kShort || s == at::kUInt16) p.wire = at::kInt;
  else if (s == at::kUInt32 || s == at::kUInt64) p.wire = at::kLong;
  else if (at::isFloatingType(s)) p.wire = at::kFloat;
  else C10_THROW_ERROR(TypeError, c10::str(kName, " ", what, ": dtype ", s, " is not supported"));
  return p;
}

// A reduction Gloo runs on the tensor's own values: no factor to apply first,
// no other dtype on the wire.
bool reduces_as_is(const ReducePlan& p, at::ScalarType s) { return !p.premul && p.wire == s && gloo_has(s); }

// ---------------------------------------------------------------- staging

at::Tensor host_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().device(at::kCPU).dtype(dtype).pinned_memory(true));
}

// Host copy of `t` in `dtype`, taken in `t`'s stream order (waits for the
// kernels queued before it).
at::Tensor stage_in(const at::Tensor& t, at::ScalarType dtype) {
  at::Tensor h = host_empty(t.sizes(), dtype);
  c10::DeviceGuard g(t.device());
  h.copy_(t);
  return h;
}
at::Tensor stage_in(const at::Tensor& t) { return stage_in(t, t.scalar_type()); }

// Zero copy. A contiguous tensor of a dtype Gloo reduces is handed to Gloo
// as a host view of its device memory (tpurt_memory_window: the chip's
// pending work is run and waited for first, as the staging copy did) and
// reduced in place: no pinned copy in, no copy back (2 x its bytes of
// memory traffic: at 16-256 MiB all_reduce the staging copies were the
// whole gap to Gloo on CPU tensors). It is the emulator's counterpart of
// a NIC (or a TPU's ICI) reading and writing HBM directly.
// TORCH_TPU_DIST_ZERO_COPY=0 stages every collective.
bool zero_copy_on() {
  static const bool on = [] {
    const char* e = std::getenv("TORCH_TPU_DIST_ZERO_COPY");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

at::Tensor device_window(const at::Tensor& t) {
  c10::DeviceGuard g(t.device());
  void* host = nullptr;
  check(tpurt_memory_window(current_stream(t.device().index()), view_of(t).ptr, t.nbytes(), &host), "collective");
  return at::from_blob(host, t.sizes(), t.strides(), at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
}

// Whether two tensors' bytes overlap (an all-gather whose input is its own
// slot of the output: the input is staged then).
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  tpurt_devptr pa = view_of(a).ptr, pb = view_of(b).ptr;
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// Whether Gloo may work in a tensor's device memory (zero copy on, the
// tensor contiguous and not empty), and in an input's and an output's (both
// so, one dtype and chip, apart).
bool windowable(const at::Tensor& t) { return zero_copy_on() && t.is_contiguous() && t.numel() > 0; }
bool windowable(const at::Tensor& in, const at::Tensor& out) {
  return windowable(in) && out.is_contiguous() && in.scalar_type() == out.scalar_type() &&
         in.device() == out.device() && !overlap(in, out);
}

// What Gloo sees of a host buffer: itself, its real view (complex) or its
// bytes (dtypes Gloo cannot move).
at::Tensor wire(const at::Tensor& h) {
  if (at::isComplexType(h.scalar_type())) return at::view_as_real(h);
  if (gloo_has(h.scalar_type())) return h;
  return h.reshape({-1}).view(at::kByte);
}
Tensors wire(const Tensors& v) {
  Tensors r;
  r.reserve(v.size());
  for (const auto& h : v) r.push_back(wire(h));
  return r;
}

Tensors joined(Tensors a, const Tensors& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Pairs (device destination, host result) copied back after the transport.
struct CopyBack {
  Tensors dev, host;
  void add(const at::Tensor& d, const at::Tensor& h) {
    dev.push_back(d);
    host.push_back(h);
  }
};

c10::Stream stream_of(const at::Tensor& t) {
  return c10::impl::getDeviceGuardImpl(kTpu)->getStream(t.device());
}

// ----------------------------------------------------------- verification
//
// Gloo aborts the process (std::terminate in its worker thread) when the
// ranks' buffers disagree in size, and silently mixes dtypes or ops. Before
// each collective the ranks therefore exchange a fixed-size fingerprint of
// it and all of them raise the same error naming every rank's call when
// they differ; the group stays usable. When every rank of the group runs on
// this host the fingerprints meet on a board in shared memory (the
// runtime's tpurt_board: microseconds, and a rank whose process is gone is
// named at once); otherwise, or with TORCH_TPU_DIST_VERIFY=gloo, through
// one small Gloo all_gather (a whole transport round trip, as long as a
// 4 KiB all_reduce). TORCH_TPU_DIST_VERIFY=0 turns the check off.

enum class Verify : int { kOff = 0, kAuto = 1, kTransport = 2 };

constexpr int kFpLen = 16;
constexpr int kFpDims = 8;

struct Fingerprint {
  int64_t v[kFpLen];
};

Fingerprint fingerprint(c10d::OpType type, const Tensors& ts, int64_t reduce_op = -1, int64_t root = -1,
                        bool shapes = true) {
  Fingerprint f;
  for (auto& x : f.v) x = -1;
  f.v[0] = 0x74707564;  // "tpud"
  f.v[1] = static_cast<int64_t>(type);
  f.v[2] = reduce_op;
  f.v[3] = root;
  f.v[5] = static_cast<int64_t>(ts.size());
  if (ts.empty()) return f;
  f.v[4] = static_cast<int64_t>(ts[0].scalar_type());
  if (shapes) {
    f.v[6] = ts[0].dim();
    for (int64_t d = 0; d < ts[0].dim() && d < kFpDims; d++) f.v[7 + d] = ts[0].size(d);
    int64_t numel = 0;
    for (const auto& t : ts) numel += t.numel();
    f.v[15] = numel;
  } else if (ts[0].dim() > 0) {
    // elements per row of dim 0, from the other dims: a rank that sends no
    // rows (uneven splits) still agrees with the others
    int64_t row = 1;
    for (int64_t d = 1; d < ts[0].dim(); d++) row *= ts[0].size(d);
    f.v[15] = row;
  }
  return f;
}

std::string describe(const int64_t* v) {
  std::string s = c10d::opTypeToString(static_cast<c10d::OpType>(v[1]));
  if (v[5] > 0 && v[4] >= 0) {
    s += c10::str(" of ", v[5], " tensor", v[5] == 1 ? "" : "s", " ", c10::toString(static_cast<at::ScalarType>(v[4])));
    if (v[6] >= 0) {
      s += "[";
      for (int64_t d = 0; d < v[6] && d < kFpDims; d++) s += c10::str(d ? ", " : "", v[7 + d]);
      if (v[6] > kFpDims) s += ", ...";
      s += c10::str("] (", v[15], " elements)");
    } else if (v[15] >= 0) {
      s += c10::str(" (", v[15], " elements a row)");
    }
  }
  if (v[2] >= 0) s += c10::str(", ReduceOp.", op_name(static_cast<ReduceOp::RedOpType>(v[2])));
  if (v[3] >= 0) s += c10::str(", root ", v[3]);
  return s;
}

using BoardPtr = std::shared_ptr<tpurt_board>;

// The fingerprints' board of a group whose ranks all run on this host, or
// nullptr (one rank, another host in the group, no /dev/shm, a rank with
// TORCH_TPU_DIST_VERIFY=gloo): rank 0 creates it and announces its name and
// token in the group's store, the others open it, and every rank then reads
// every rank's verdict and check mode, so all of them use the board or none
// does, and a group whose ranks disagree on checking at all (one would wait
// for an exchange the other never joins) fails here with a clear error. A
// counter in the store numbers the rendezvous, so keys left by an earlier
// group under the same prefix are never read. Rank 0 unlinks the file once
// all have opened it: nothing stays behind in /dev/shm, even after a crash.
BoardPtr make_board(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, Verify verify) {
  if (size < 2 || !store) return nullptr;
  auto st = c10::make_intrusive<c10d::PrefixStore>("tpu_dist_board/", store);
  std::string gen = std::to_string((st->add("arrivals", 1) - 1) / size) + "/";
  tpurt_board* b = nullptr;
  char name[TPURT_BOARD_NAME_LEN] = "";
  if (rank == 0) {
    uint64_t token = 0;
    std::string announce;
    if (verify == Verify::kAuto && tpurt_board_create(size, sizeof(Fingerprint), name, &token, &b) == TPURT_OK)
      announce = c10::str(name, " ", token);
    st->set(gen + "name", announce);
  } else {
    std::string announce = st->get_to_str(gen + "name");
    size_t sp = announce.find(' ');
    if (verify == Verify::kAuto && sp != std::string::npos && sp < sizeof name) {
      std::memcpy(name, announce.data(), sp);
      name[sp] = 0;
      uint64_t token = std::strtoull(announce.c_str() + sp + 1, nullptr, 10);
      if (tpurt_board_open(name, token, size, sizeof(Fingerprint), rank, &b) != TPURT_OK) b = nullptr;
    }
  }
  st->set(gen + "ok/" + std::to_string(rank), c10::str(static_cast<int>(verify), b ? " 1" : " 0"));
  bool all = true;
  std::string modes;
  bool on = verify != Verify::kOff, agree = true;
  for (int r = 0; r < size; r++) {
    std::string v = st->get_to_str(gen + "ok/" + std::to_string(r));
    all = all && v.size() == 3 && v[2] == '1';
    agree = agree && (v[0] != '0') == on;
    modes += c10::str(r ? ", " : "", "rank ", r, ": ", v[0] == '0' ? "0" : v[0] == '1' ? "1" : "gloo");
  }
  if (rank == 0 && name[0]) tpurt_board_unlink(name);
  if (!all || !agree) {
    tpurt_board_close(b);
    b = nullptr;
  }
  if (!agree)
    C10_THROW_ERROR(DistBackendError, c10::str(kName, ": TORCH_TPU_DIST_VERIFY must be on (1 or gloo) on every "
                                               "rank or off (0) on every rank; the group has ", modes));
  return b ? BoardPtr(b, tpurt_board_close) : nullptr;
}

// ------------------------------------------------------------------- Work

class TpuWork : public c10d::Work {
 public:
  // `keep` holds host buffers alive until the transport is done; `result`
  // is the tpu tensors the future completes with.
  TpuWork(int rank, c10d::OpType type, WorkPtr inner, CopyBack back, c10::Stream stream, Tensors result,
          Tensors keep)
      : Work(rank, type), inner_(std::move(inner)), result_(std::move(result)), keep_(std::move(keep)) {
    auto finish = [back = std::move(back), stream] {
      if (back.dev.empty()) return;
      c10::StreamGuard g(stream);
      for (size_t i = 0; i < back.dev.size(); i++) back.dev[i].copy_(back.host[i], /*non_blocking=*/true);
    };
    c10::intrusive_ptr<c10::ivalue::Future> fut;
    try {
      fut = inner_->getFuture();
    } catch (const std::exception&) {
      fut.reset();  // Gloo's point-to-point works have no future: finished in wait()
    }
    if (fut) {
      Tensors res = result_;
      Tensors keep_alive = keep_;
      future_ = fut->then(
          [finish, res, keep_alive](c10::ivalue::Future& parent) -> c10::IValue {
            parent.value();  // rethrows the transport's error
            finish();
            return c10::IValue(res);
          },
          c10::ListType::create(c10::TensorType::get()));
    } else {
      finish_ = finish;
    }
  }

  bool wait(std::chrono::milliseconds timeout) override {
    bool ok = inner_->wait(timeout);  // raises the transport's error or timeout
    if (future_) {
      future_->wait();
      if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    } else {
      std::call_once(once_, [this] { finish_(); });
    }
    return ok;
  }

  bool isCompleted() override {
    if (future_) return future_->completed();
    return inner_->isCompleted();
  }
  bool isSuccess() const override {
    if (future_) return future_->completed() && !future_->hasError();
    return inner_->isSuccess();
  }
  std::exception_ptr exception() const override {
    if (future_ && future_->completed() && future_->hasError()) return future_->exception_ptr();
    return inner_->exception();
  }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return result_; }
  void synchronize() override {}
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    TORCH_CHECK(future_, kName, ": ", c10d::opTypeToString(retrieveOpType()),
                " has no future (point-to-point works complete through wait())");
    return future_;
  }

 private:
  WorkPtr inner_;
  Tensors result_, keep_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::function<void()> finish_;
  std::once_flag once_;
};

// ---------------------------------------------------------------- Backend

// The backend's options (torch's Python layer deep-copies a parent group's
// options when it splits it; c10d's base Options cannot be copied).
struct TpuOptions : c10d::Backend::Options {
  explicit TpuOptions(std::chrono::milliseconds timeout) : Options(kName, timeout) {}
};

class TpuBackend : public c10d::Backend {
 public:
  TpuBackend(c10::intrusive_ptr<c10d::Backend> inner, std::chrono::milliseconds timeout, Verify verify,
             const c10::intrusive_ptr<c10d::Store>& store)
      : Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)), timeout_(timeout), verify_(verify) {
    board_ = make_board(store, getRank(), getSize(), verify_);
  }

  const std::string getBackendName() const override { return kName; }

  // DeviceMesh and split_group split a group bound to a device
  // (init_process_group(device_id=...)): the transport splits (a Gloo
  // context for the sub-ranks, rendezvous under the new group's store with
  // this backend's prefix, sharing the parent's Gloo options) and the
  // child is staged like this one. Ranks outside `ranks` get nullptr.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                    const c10::intrusive_ptr<Options>& opts) override {
    auto sub = inner_->split(c10::make_intrusive<c10d::PrefixStore>(std::string(kName) + "/", store), ranks,
                             inner_->getBackendOptions());
    if (!sub) return nullptr;
    return c10::make_intrusive<TpuBackend>(sub, opts ? opts->timeout : timeout_, verify_, store);
  }
  c10::intrusive_ptr<Options> getBackendOptions() override { return c10::make_intrusive<TpuOptions>(timeout_); }
  void setTimeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    inner_->setTimeout(timeout);
  }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void abort() override { inner_->abort(); }
  void shutdown() override { inner_->shutdown(); }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    inner_->monitoredBarrier(opts, wait_all_ranks);
  }

  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override {
    const at::Tensor& t = one_tensor(tensors, "broadcast");
    verify(fingerprint(c10d::OpType::BROADCAST, tensors, -1, opts.rootRank));
    bool root = opts.rootRank == getRank();
    at::Tensor h = root ? stage_in(t) : host_empty(t.sizes(), t.scalar_type());
    Tensors w{wire(h)};
    CopyBack back;
    if (!root) back.add(t, h);
    return make(c10d::OpType::BROADCAST, inner_->broadcast(w, opts), std::move(back), t, tensors, {h});
  }

  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override {
    const at::Tensor& t = one_tensor(tensors, "allreduce");
    verify(fingerprint(c10d::OpType::ALLREDUCE, tensors, opts.reduceOp.op_));
    c10d::AllreduceOptions o = opts;
    ReducePlan p = plan_reduce(t.scalar_type(), opts.reduceOp, "allreduce");
    if (reduces_as_is(p, t.scalar_type()) && windowable(t)) {  // in place; the Work keeps t alive until Gloo is done
      o.reduceOp = p.op;
      Tensors w{device_window(t)};
      return make(c10d::OpType::ALLREDUCE, inner_->allreduce(w, o), CopyBack{}, t, tensors, {t});
    }
    at::Tensor h = stage_reduce(t, opts.reduceOp, "allreduce", &o.reduceOp);
    Tensors w{wire(h)};
    CopyBack back;
    back.add(t, h);
    return make(c10d::OpType::ALLREDUCE, inner_->allreduce(w, o), std::move(back), t, tensors, {h});
  }

  WorkPtr allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    check_tensors(tensors, "allreduce_coalesced");
    TORCH_CHECK(!tensors.empty(), kName, " allreduce_coalesced: no tensors");
    verify(fingerprint(c10d::OpType::ALLREDUCE_COALESCED, tensors, opts.reduceOp.op_));
    c10d::AllreduceCoalescedOptions o = opts;
    Tensors hs;
    CopyBack back;
    for (const auto& t : tensors) {
      hs.push_back(stage_reduce(t, opts.reduceOp, "allreduce_coalesced", &o.reduceOp));
      back.add(t, hs.back());
    }
    Tensors w = wire(hs);
    return make(c10d::OpType::ALLREDUCE_COALESCED, inner_->allreduce_coalesced(w, o), std::move(back), tensors[0],
                tensors, hs);
  }

  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override {
    const at::Tensor& t = one_tensor(tensors, "reduce");
    verify(fingerprint(c10d::OpType::REDUCE, tensors, opts.reduceOp.op_, opts.rootRank));
    c10d::ReduceOptions o = opts;
    at::Tensor h = stage_reduce(t, opts.reduceOp, "reduce", &o.reduceOp);
    Tensors w{wire(h)};
    CopyBack back;
    if (opts.rootRank == getRank()) back.add(t, h);
    return make(c10d::OpType::REDUCE, inner_->reduce(w, o), std::move(back), t, tensors, {h});
  }

  WorkPtr allgather(std::vector<Tensors>& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts) override {
    const at::Tensor& t = one_tensor(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1, kName, " allgather: expecting one output list but got ", outputs.size());
    check_tensors(outputs[0], "allgather");
    verify(fingerprint(c10d::OpType::ALLGATHER, inputs));
    Tensors hin{stage_in(t)};
    CopyBack back;
    std::vector<Tensors> hout(1);
    for (const auto& o : outputs[0]) {
      hout[0].push_back(host_empty(o.sizes(), o.scalar_type()));
      back.add(o, hout[0].back());
    }
    std::vector<Tensors> wout{wire(hout[0])};
    Tensors win = wire(hin);
    Tensors keep = hout[0];
    keep.push_back(hin[0]);
    return make(c10d::OpType::ALLGATHER, inner_->allgather(wout, win, opts), std::move(back), t, outputs[0], keep);
  }

  WorkPtr _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& opts) override {
    check_tensors({out, in}, "all_gather_into_tensor");
    verify(fingerprint(c10d::OpType::_ALLGATHER_BASE, {in}));
    if (windowable(in, out)) {
      // Gloo reads the input and writes the output in device memory (FSDP2's parameter gathers)
      at::Tensor win = wire(device_window(in)), wout = wire(device_window(out));
      return make(c10d::OpType::_ALLGATHER_BASE, inner_->_allgather_base(wout, win, opts), CopyBack{}, in, {out},
                  {in, out});
    }
    at::Tensor hin = stage_in(in);
    at::Tensor hout = host_empty(out.sizes(), out.scalar_type());
    at::Tensor wout = wire(hout), win = wire(hin);
    CopyBack back;
    back.add(out, hout);
    return make(c10d::OpType::_ALLGATHER_BASE, inner_->_allgather_base(wout, win, opts), std::move(back), in, {out},
                {hin, hout});
  }

  WorkPtr allgather_into_tensor_coalesced(Tensors& outs, Tensors& ins, const c10d::AllgatherOptions& opts) override {
    check_tensors(outs, "allgather_into_tensor_coalesced");
    check_tensors(ins, "allgather_into_tensor_coalesced");
    TORCH_CHECK(!ins.empty() && outs.size() == ins.size(), kName,
                " allgather_into_tensor_coalesced: as many outputs as inputs expected");
    verify(fingerprint(c10d::OpType::COALESCED, ins));
    Tensors hin, hout;
    CopyBack back;
    for (size_t i = 0; i < ins.size(); i++) {
      hin.push_back(stage_in(ins[i]));
      hout.push_back(host_empty(outs[i].sizes(), outs[i].scalar_type()));
      back.add(outs[i], hout.back());
    }
    Tensors wout = wire(hout), win = wire(hin);
    return make(c10d::OpType::COALESCED, inner_->allgather_into_tensor_coalesced(wout, win, opts), std::move(back),
                ins[0], outs, joined(hin, hout));
  }

  WorkPtr allgather_coalesced(std::vector<Tensors>& outLists, Tensors& ins, const c10d::AllgatherOptions& opts) override {
    check_tensors(ins, "allgather_coalesced");
    TORCH_CHECK(!ins.empty(), kName, " allgather_coalesced: no tensors");
    verify(fingerprint(c10d::OpType::ALLGATHER_COALESCED, ins));
    Tensors hin = {}, keep, result;
    std::vector<Tensors> wout;
    CopyBack back;
    for (const auto& t : ins) hin.push_back(stage_in(t));
    for (auto& list : outLists) {
      check_tensors(list, "allgather_coalesced");
      Tensors hl;
      for (const auto& o : list) {
        hl.push_back(host_empty(o.sizes(), o.scalar_type()));
        back.add(o, hl.back());
        keep.push_back(hl.back());
        result.push_back(o);
      }
      wout.push_back(wire(hl));
    }
    Tensors win = wire(hin);
    keep.insert(keep.end(), hin.begin(), hin.end());
    return make(c10d::OpType::ALLGATHER_COALESCED, inner_->allgather_coalesced(wout, win, opts), std::move(back),
                ins[0], result, keep);
  }

  WorkPtr gather(std::vector<Tensors>& outputs, Tensors& inputs, const c10d::GatherOptions& opts) override {
    const at::Tensor& t = one_tensor(inputs, "gather");
    verify(fingerprint(c10d::OpType::GATHER, inputs, -1, opts.rootRank));
    Tensors hin{stage_in(t)}, keep{hin[0]}, result;
    std::vector<Tensors> wout;
    CopyBack back;
    if (opts.rootRank == getRank()) {
      TORCH_CHECK(outputs.size() == 1, kName, " gather: expecting one output list on the root but got ",
                  outputs.size());
      check_tensors(outputs[0], "gather");
      Tensors hl;
      for (const auto& o : outputs[0]) {
        hl.push_back(host_empty(o.sizes(), o.scalar_type()));
        back.add(o, hl.back());
        keep.push_back(hl.back());
      }
      wout.push_back(wire(hl));
      result = outputs[0];
    }
    Tensors win = wire(hin);
    return make(c10d::OpType::GATHER, inner_->gather(wout, win, opts), std::move(back), t, result, keep);
  }

  WorkPtr scatter(Tensors& outputs, std::vector<Tensors>& inputs, const c10d::ScatterOptions& opts) override {
    const at::Tensor& t = one_tensor(outputs, "scatter");
    verify(fingerprint(c10d::OpType::SCATTER, outputs, -1, opts.rootRank));
    at::Tensor hout = host_empty(t.sizes(), t.scalar_type());
    Tensors wout{wire(hout)}, keep{hout};
    std::vector<Tensors> win;
    if (opts.rootRank == getRank()) {
      TORCH_CHECK(inputs.size() == 1, kName, " scatter: expecting one input list on the root but got ", inputs.size());
      check_tensors(inputs[0], "scatter");
      Tensors hl;
      for (const auto& i : inputs[0]) hl.push_back(stage_in(i));
      keep.insert(keep.end(), hl.begin(), hl.end());
      win.push_back(wire(hl));
    }
    CopyBack back;
    back.add(t, hout);
    return make(c10d::OpType::SCATTER, inner_->scatter(wout, win, opts), std::move(back), t, outputs, keep);
  }

  WorkPtr reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& t = one_tensor(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1, kName, " reduce_scatter: expecting one input list but got ", inputs.size());
    check_tensors(inputs[0], "reduce_scatter");
    verify(fingerprint(c10d::OpType::REDUCE_SCATTER, outputs, opts.reduceOp.op_));
    c10d::ReduceScatterOptions o = opts;
    Tensors hl;
    for (const auto& i : inputs[0]) hl.push_back(stage_reduce(i, opts.reduceOp, "reduce_scatter", &o.reduceOp));
    at::Tensor hout = host_empty(t.sizes(), hl.empty() ? t.scalar_type() : hl[0].scalar_type());
    std::vector<Tensors> win{wire(hl)};
    Tensors wout{wire(hout)}, keep = hl;
    keep.push_back(hout);
    CopyBack back;
    back.add(t, hout);
    return make(c10d::OpType::REDUCE_SCATTER, inner_->reduce_scatter(wout, win, o), std::move(back), t, outputs, keep);
  }

  WorkPtr _reduce_scatter_base(at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
    check_tensors({out, in}, "reduce_scatter_tensor");
    verify(fingerprint(c10d::OpType::_REDUCE_SCATTER_BASE, {out}, opts.reduceOp.op_));
    c10d::ReduceScatterOptions o = opts;
    ReducePlan p = plan_reduce(in.scalar_type(), opts.reduceOp, "reduce_scatter_tensor");
    if (reduces_as_is(p, in.scalar_type()) && windowable(in, out)) {
      // Gloo reads the input and writes the output in device memory (FSDP2's gradient reductions); it
      // leaves the input as it was, as on CPU tensors
      o.reduceOp = p.op;
      at::Tensor win = device_window(in), wout = device_window(out);
      return make(c10d::OpType::_REDUCE_SCATTER_BASE, inner_->_reduce_scatter_base(wout, win, o), CopyBack{}, in,
                  {out}, {in, out});
    }
    at::Tensor hin = stage_reduce(in, opts.reduceOp, "reduce_scatter_tensor", &o.reduceOp);
    at::Tensor hout = host_empty(out.sizes(), hin.scalar_type());
    at::Tensor wout = wire(hout), win = wire(hin);
    CopyBack back;
    back.add(out, hout);
    return make(c10d::OpType::_REDUCE_SCATTER_BASE, inner_->_reduce_scatter_base(wout, win, o), std::move(back), in,
                {out}, {hin, hout});
  }

  WorkPtr reduce_scatter_tensor_coalesced(Tensors& outs, Tensors& ins,
                                          const c10d::ReduceScatterOptions& opts) override {
    check_tensors(outs, "reduce_scatter_tensor_coalesced");
    check_tensors(ins, "reduce_scatter_tensor_coalesced");
    TORCH_CHECK(!ins.empty() && outs.size() == ins.size(), kName,
                " reduce_scatter_tensor_coalesced: as many outputs as inputs expected");
    verify(fingerprint(c10d::OpType::COALESCED, outs, opts.reduceOp.op_));
    c10d::ReduceScatterOptions o = opts;
    Tensors hin, hout;
    CopyBack back;
    for (size_t i = 0; i < ins.size(); i++) {
      hin.push_back(stage_reduce(ins[i], opts.reduceOp, "reduce_scatter_tensor_coalesced", &o.reduceOp));
      hout.push_back(host_empty(outs[i].sizes(), hin.back().scalar_type()));
      back.add(outs[i], hout.back());
    }
    Tensors wout = wire(hout), win = wire(hin);
    return make(c10d::OpType::COALESCED, inner_->reduce_scatter_tensor_coalesced(wout, win, o), std::move(back),
                ins[0], outs, joined(hin, hout));
  }

  WorkPtr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outSplits,
                        std::vector<int64_t>& inSplits, const c10d::AllToAllOptions& opts) override {
    check_tensors({out, in}, "all_to_all_single");
    verify(fingerprint(c10d::OpType::ALLTOALL_BASE, {in}, -1, -1, /*shapes=*/false));
    at::Tensor hin = stage_in(in);
    at::Tensor hout = host_empty(out.sizes(), out.scalar_type());
    CopyBack back;
    back.add(out, hout);
    return exchange(c10d::OpType::ALLTOALL_BASE, hout, hin, outSplits, inSplits, opts, std::move(back), in, {out});
  }

  // Lists of any sizes (Gloo's own alltoall wants equal ones): one flat
  // host buffer each way, the list's sizes as the splits.
  WorkPtr alltoall(Tensors& outs, Tensors& ins, const c10d::AllToAllOptions& opts) override {
    check_tensors(outs, "all_to_all");
    check_tensors(ins, "all_to_all");
    TORCH_CHECK(!ins.empty() && ins.size() == outs.size() && ins.size() == static_cast<size_t>(getSize()), kName,
                " all_to_all: expecting ", getSize(), " input and output tensors, got ", ins.size(), " and ",
                outs.size());
    verify(fingerprint(c10d::OpType::ALLTOALL, ins, -1, -1, /*shapes=*/false));
    at::ScalarType dt = ins[0].scalar_type();
    for (const auto& t : outs)
      if (t.scalar_type() != dt || t.scalar_type() != outs[0].scalar_type())
        C10_THROW_ERROR(TypeError, c10::str(kName, " all_to_all: tensors of one dtype expected, got ", dt, " and ",
                                            t.scalar_type()));
    std::vector<int64_t> is, os;
    int64_t nin = 0, nout = 0;
    for (const auto& t : ins) {
      if (t.scalar_type() != dt)
        C10_THROW_ERROR(TypeError, c10::str(kName, " all_to_all: tensors of one dtype expected, got ", dt, " and ",
                                            t.scalar_type()));
      is.push_back(t.numel());
      nin += t.numel();
    }
    for (const auto& t : outs) {
      os.push_back(t.numel());
      nout += t.numel();
    }
    at::Tensor hin = host_empty({nin}, dt), hout = host_empty({nout}, dt);
    int64_t off = 0;
    for (const auto& t : ins) {
      c10::DeviceGuard g(t.device());
      hin.narrow(0, off, t.numel()).view(t.sizes()).copy_(t);
      off += t.numel();
    }
    CopyBack back;
    off = 0;
    for (const auto& t : outs) {
      back.add(t, hout.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    return exchange(c10d::OpType::ALLTOALL, hout, hin, os, is, opts, std::move(back), ins[0], outs);
  }

  WorkPtr send(Tensors& tensors, int dst, int tag) override {
    const at::Tensor& t = one_tensor(tensors, "send");
    at::Tensor h = stage_in(t);
    Tensors w{wire(h)};
    return make(c10d::OpType::SEND, inner_->send(w, dst, tag), CopyBack{}, t, tensors, {h});
  }

  WorkPtr recv(Tensors& tensors, int src, int tag) override {
    const at::Tensor& t = one_tensor(tensors, "recv");
    at::Tensor h = host_empty(t.sizes(), t.scalar_type());
    Tensors w{wire(h)};
    CopyBack back;
    back.add(t, h);
    return make(c10d::OpType::RECV, inner_->recv(w, src, tag), std::move(back), t, tensors, {h});
  }

  WorkPtr recvAnysource(Tensors& tensors, int tag) override {
    const at::Tensor& t = one_tensor(tensors, "recv");
    at::Tensor h = host_empty(t.sizes(), t.scalar_type());
    Tensors w{wire(h)};
    CopyBack back;
    back.add(t, h);
    return make(c10d::OpType::RECVANYSOURCE, inner_->recvAnysource(w, tag), std::move(back), t, tensors, {h});
  }

  WorkPtr barrier(const c10d::BarrierOptions& opts) override {
    verify(fingerprint(c10d::OpType::BARRIER, {}));
    // A barrier orders the host processes; like NCCL's, it completes after
    // the work this process queued on its chip before it.
    if (opts.device && opts.device->type() == kTpu) {
      check(tpurt_device_synchronize(opts.device->index() < 0 ? tpurt_get_device() : opts.device->index()),
            "barrier");
    }
    return inner_->barrier(opts);
  }

 private:
  // Host copy of a reduction's input in the plan's dtype (PREMUL_SUM: the
  // input times the factor, computed on the device); sets the op Gloo runs.
  at::Tensor stage_reduce(const at::Tensor& t, const ReduceOp& op, const char* what, ReduceOp* wire_op) {
    ReducePlan p = plan_reduce(t.scalar_type(), op, what);
    *wire_op = p.op;
    if (!p.premul) return stage_in(t, p.wire);
    auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
    TORCH_CHECK(sup, kName, " ", what, ": PREMUL_SUM without a factor");
    c10::DeviceGuard g(t.device());
    at::Tensor scaled = sup->tensor_factor.defined() ? t * sup->tensor_factor.to(t.device())
                                                     : t * sup->double_factor;
    return stage_in(scaled, p.wire);
  }

  // Gloo's alltoall_base over host buffers; splits count rows of dim 0
  // (empty: even), scaled to bytes when the dtype travels as bytes.
  WorkPtr exchange(c10d::OpType type, const at::Tensor& hout, const at::Tensor& hin, std::vector<int64_t> os,
                   std::vector<int64_t> is, const c10d::AllToAllOptions& opts, CopyBack back, const at::Tensor& any,
                   Tensors result) {
    at::Tensor win = wire(hin), wout = wire(hout);
    if (!win.is_same(hin) && !at::isComplexType(hin.scalar_type())) {
      auto row_bytes = [](const at::Tensor& t) {
        return t.dim() == 0 || t.size(0) == 0 ? int64_t(0) : int64_t(t.nbytes() / t.size(0));
      };
      for (auto& x : is) x *= row_bytes(hin);
      for (auto& x : os) x *= row_bytes(hout);
    }
    return make(type, inner_->alltoall_base(wout, win, os, is, opts), std::move(back), any, std::move(result),
                {hin, hout});
  }

  WorkPtr make(c10d::OpType type, WorkPtr inner, CopyBack back, const at::Tensor& any, Tensors result, Tensors keep) {
    return c10::make_intrusive<TpuWork>(getRank(), type, std::move(inner), std::move(back), stream_of(any),
                                        std::move(result), std::move(keep));
  }

  // Exchanges `f` with every rank (on the board, else a blocking Gloo
  // all_gather) and raises the same error on all of them when any differs.
  void verify(const Fingerprint& f) {
    if (verify_ == Verify::kOff || getSize() == 1) return;
    std::vector<int64_t> buf(static_cast<size_t>(getSize()) * kFpLen);
    if (board_) {
      tpurt_status s = tpurt_board_exchange(board_.get(), f.v, buf.data(), timeout_.count());
      if (s != TPURT_OK)
        C10_THROW_ERROR(DistBackendError, c10::str(kName, ": ", describe(f.v),
                                                   s == TPURT_ERR_TIMEOUT ? " timed out: " : ": ", tpurt_last_error()));
    } else {
      at::Tensor mine = at::from_blob(const_cast<int64_t*>(f.v), {kFpLen}, at::kLong).clone();
      at::Tensor all = at::from_blob(buf.data(), {getSize() * kFpLen}, at::kLong);
      c10d::AllgatherOptions o;
      o.timeout = timeout_;
      inner_->_allgather_base(all, mine, o)->wait();
    }
    const int64_t* a = buf.data();
    bool same = true;
    for (int r = 1; r < getSize() && same; r++)
      same = std::equal(a, a + kFpLen, a + r * kFpLen);
    if (same) return;
    std::string msg = c10::str(kName, ": mismatched collectives across ranks:");
    for (int r = 0; r < getSize(); r++) msg += c10::str("\n  rank ", r, ": ", describe(a + r * kFpLen));
    C10_THROW_ERROR(DistBackendError, msg);
  }

 public:
  // How this group checks its collectives: "board", "gloo" or "off".
  std::string verify_path() const {
    if (verify_ == Verify::kOff || getSize() == 1) return "off";
    return board_ ? "board" : "gloo";
  }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
  std::chrono::milliseconds timeout_;
  Verify verify_;
  BoardPtr board_;
};

}  // namespace

void init_c10d(py::module_& m) {
  // A Python type of its own (a c10d Backend to torch) for what torch's
  // Python layer asks of a backend that supports splitting.
  py::class_<TpuOptions, c10d::Backend::Options, c10::intrusive_ptr<TpuOptions>>(m, "_TpuDistOptions")
      .def(py::init<std::chrono::milliseconds>(), py::arg("timeout"))
      .def("__deepcopy__", [](const TpuOptions& o, py::dict) {
        auto c = c10::make_intrusive<TpuOptions>(o.timeout);
        c->group_name = o.group_name;
        c->group_desc = o.group_desc;
        c->global_ranks_in_group = o.global_ranks_in_group;
        return c;
      });
  py::class_<TpuBackend, c10d::Backend, c10::intrusive_ptr<TpuBackend>>(m, "_TpuDistBackend")
      .def_property_readonly("options", [](TpuBackend& b) {
        return c10::static_intrusive_pointer_cast<TpuOptions>(b.getBackendOptions());
      })
      // new_group on a rank outside the new group: nothing to do (the Gloo
      // split only involves its members).
      .def("perform_nocolor_split", [](TpuBackend&, const at::Device&) {})
      // how collectives are checked across ranks: "board" (shared memory,
      // every rank on this host), "gloo" (a transport all_gather) or "off"
      .def_property_readonly("_verify_path", &TpuBackend::verify_path);
  m.def(
      "_tpu_dist_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& inner, std::chrono::milliseconds timeout, int verify,
         const c10::intrusive_ptr<c10d::Store>& store) {
        TORCH_CHECK(inner, kName, ": no transport backend");
        TORCH_CHECK(verify >= 0 && verify <= 2, kName, ": bad verify mode ", verify);
        return c10::make_intrusive<TpuBackend>(inner, timeout, static_cast<Verify>(verify), store);
      },
      py::arg("transport"), py::arg("timeout"), py::arg("verify"), py::arg("store"));
}

}  // namespace torch_tpu
