// torch.profiler's device activity for tpu: a Kineto activity profiler
// registered through PyTorch's PrivateUse1 profiler registry
// (REGISTER_PRIVATEUSE1_PROFILER, torch/csrc/profiler/standalone/
// privateuse1_profiler.h). With ProfilerActivity.PrivateUse1 (shown as
// ProfilerActivity.TPU) among the activities, a session turns on the
// runtime's trace ring (tpurt_trace_*), and at the end of the profile hands
// Kineto the ring's device events: kernels as CONCURRENT_KERNEL on a
// "stream N" row of the chip (fused kernels named after their ops, with the
// user's line), host<->device copies as GPU_MEMCPY, DeferAndFuse cuts, plan
// builds and kernel compiles as PRIVATEUSE1_RUNTIME. torch.profiler then
// lists them in key_averages() (device time) and export_chrome_trace().
//
// torch_tpu.profiler.profile owns the same ring: while it is active (or when
// only CPU activity is asked for) a session records nothing of its own.
#define USE_KINETO 1
// Kineto's activities format their metadata with fmt, whose compiled part
// libtorch keeps to itself: the header-only fmt here
#define FMT_HEADER_ONLY 1
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>

#include <time.h>

#include <memory>
#include <set>
#include <string>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "glue.h"
#include "tpurt.h"

namespace torch_tpu {
namespace {

using libkineto::ActivityType;

constexpr int32_t kHostRow = 1 << 20;  // the resource id of a chip's host-side runtime row

int64_t clock_ns(clockid_t id) {
  timespec t;
  clock_gettime(id, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

struct Event {
  ActivityType type;
  std::string name;
  int64_t start_ns, end_ns;  // Kineto's clock: nanoseconds since the epoch
  int32_t dev, resource;
  std::vector<std::pair<std::string, std::string>> meta;  // quoted values
  std::vector<std::pair<std::string, int64_t>> numbers;
};

// The session whose ring is on (0: none of ours). torch.profiler's stop
// synchronizes the device before it stops Kineto; when that raises (a
// kernel's asynchronous error) the session is never stopped, and the next
// one takes the ring over.
std::atomic<uint64_t> g_ring_owner{0};
std::atomic<uint64_t> g_sessions{0};

class TpuSession final : public libkineto::IActivityProfilerSession {
 public:
  explicit TpuSession(bool wanted) : wanted_(wanted), id_(++g_sessions) {}
  ~TpuSession() override { release(); }

  void start() override {
    if (!wanted_) return;
    if (tpurt_trace_enabled()) {
      if (g_ring_owner.load() == 0) return;  // torch_tpu.profiler's ring while it runs: record nothing
      tpurt_trace_stop();                    // an earlier session torch.profiler never stopped
    }
    if (tpurt_trace_start(0) != TPURT_OK) {
      errors_.push_back("tpu: the runtime's trace could not start");
      return;
    }
    g_ring_owner.store(id_);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (g_ring_owner.load() != id_) return;
    drain();
    release();
    // the ring's CLOCK_MONOTONIC times onto Kineto's (the system clock)
    const int64_t offset = clock_ns(CLOCK_REALTIME) - tpurt_trace_now_ns();
    std::vector<tpurt_trace_event> ev(tpurt_trace_count());
    uint64_t dropped = 0;
    ev.resize(tpurt_trace_read(ev.data(), ev.size(), &dropped));
    if (dropped) errors_.push_back("tpu: the trace ring dropped " + std::to_string(dropped) + " events");
    for (const tpurt_trace_event& e : ev) add(e, offset);
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    if (events_.empty()) return;
    int64_t lo = events_.front().start_ns, hi = events_.front().end_ns;
    for (const Event& e : events_) {
      lo = std::min(lo, e.start_ns);
      hi = std::max(hi, e.end_ns);
    }
    libkineto::TraceSpan span(lo, hi, "tpu");
    int32_t id = 0;
    for (const Event& e : events_) {
      libkineto::GenericTraceActivity a(span, e.type, e.name);
      a.startTime = e.start_ns;
      a.endTime = e.end_ns;
      a.device = e.dev;
      a.resource = e.resource;
      a.id = ++id;
      a.addMetadata("device", e.dev);
      for (const auto& [k, v] : e.meta) a.addMetadataQuoted(k, v);
      for (const auto& [k, v] : e.numbers) a.addMetadata(k, v);
      a.log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [dev, stream] : rows_)
      out.push_back(libkineto::ResourceInfo{stream, stream, dev,
                                            stream == kHostRow ? "runtime (host): DeferAndFuse, kernel compiles"
                                            : stream == 0      ? "stream 0 (default)"
                                                               : "stream " + std::to_string(stream)});
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

 private:
  void release() {
    uint64_t mine = id_;
    if (g_ring_owner.compare_exchange_strong(mine, 0)) tpurt_trace_stop();
  }

  // Runs each chip's pending deferred graph and waits for its default and
  // current streams. Not a synchronize: that would take a pending
  // asynchronous error from the user's next synchronize, and Kineto's stop
  // cannot raise it. Work still running on other streams when the profile
  // ends is left out (a torch.tpu.synchronize() at the block's end brings it in).
  static void drain() {
    for (int dev = 0; dev < device_count(); dev++) {
      tpurt_stream* def = nullptr;
      if (tpurt_stream_default(dev, &def) != TPURT_OK) continue;
      for (tpurt_stream* s : {def, tpurt_stream_current(dev)})
        while (s && !tpurt_stream_query(s)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void add(const tpurt_trace_event& e, int64_t offset) {
    Event out{ActivityType::PRIVATEUSE1_RUNTIME, e.name ? e.name : "", e.ts_ns + offset,
              e.ts_ns + offset + std::max<int64_t>(e.dur_ns, 0), e.dev, e.stream, {}, {}};
    switch (e.kind) {
      case TPURT_TRACE_KERNEL:
        out.type = ActivityType::CONCURRENT_KERNEL;
        if (out.name.empty()) out.name = "kernel";
        if (e.site) out.name += std::string(" (recorded at ") + e.site + ")";
        out.numbers.emplace_back("stream", e.stream);
        rows_.insert({e.dev, e.stream});
        break;
      case TPURT_TRACE_COPY: {
        static const char* const dir[] = {"HtoD", "DtoH", "DtoD"};
        out.type = ActivityType::GPU_MEMCPY;
        out.name = std::string("Memcpy ") + (e.b >= 0 && e.b < 3 ? dir[e.b] : "DtoD");
        out.numbers.emplace_back("bytes", e.a);
        break;
      }
      case TPURT_TRACE_CUT:
        out.name = std::string("DeferAndFuse cut: ") + (e.name ? e.name : "other");
        out.numbers.emplace_back("ops", e.b);
        if (e.site) out.meta.emplace_back("site", e.site);
        out.meta.emplace_back("plan", e.corr ? "cache hit" : "built");
        break;
      case TPURT_TRACE_PLAN:
        out.name = "DeferAndFuse plan";
        break;
      case TPURT_TRACE_COMPILE:
        out.name = std::string(e.a ? "kernel cache hit" : "kernel compile") + (e.name ? std::string(": ") + e.name : "");
        break;
      default:
        return;  // launches, members and memory samples: torch_tpu.profiler's business
    }
    if (out.type == ActivityType::PRIVATEUSE1_RUNTIME) {  // host-side work of the runtime: a row apart from the streams
      out.resource = kHostRow;
      rows_.insert({e.dev, kHostRow});
    }
    events_.push_back(std::move(out));
  }

  bool wanted_;
  uint64_t id_;
  std::vector<Event> events_;
  std::set<std::pair<int32_t, int32_t>> rows_;
  std::vector<std::string> errors_;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return types_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // ProfilerActivity.PrivateUse1 asks for the kernels; CPU alone does not
    return std::make_unique<TpuSession>(types.count(ActivityType::CONCURRENT_KERNEL) > 0);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"tpu"};
  std::set<ActivityType> types_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

}  // namespace
}  // namespace torch_tpu
