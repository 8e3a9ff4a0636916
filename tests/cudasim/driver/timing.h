// GPU time on cudasim (opt-in): the engines a GPU has, each busy for the time its work takes, so
// that a program's wall-clock time under cudasim is the time it would take on the modeled GPU.
//
//   CUDASIM_H2D_GBPS, CUDASIM_D2H_GBPS  host-to-device / device-to-host bandwidth, GB/s (10^9
//                     bytes/s, decimals allowed); unset or 0: copies take no modeled time (as
//                     before this existed). One copy engine per direction, shared by every stream;
//                     the two directions and the compute engine overlap. Pageable host memory
//                     moves at half the bandwidth, and the call returns only once the copy is done.
//   CUDASIM_D2D_GBPS  device-to-device copies and memsets, on the compute engine (default 1000);
//                     timed only when one of the host bandwidths is set.
//   cudasimKernelTime(ns)  called by a kernel body: the compute engine (one, shared by every
//                     stream) is busy that long for the kernel, timed mode or not.
//   CUDASIM_VERBOSE=1 at exit, what was timed and whether the host kept up.
//
// Time is kept as absolute deadlines per engine: an item starts when its stream reaches it or
// when its engine is free, whichever is later, and ends its modeled duration after; the worker
// sleeps until that deadline (clock_nanosleep, TIMER_ABSTIME), so sleeping late never adds up.
// The item's host work (the memcpy, the kernel body) runs first, inside that window; when it
// takes longer than the modeled duration the item ends when the host work does, and the overrun
// is counted and reported at exit: the figures of such a run are not to be trusted.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace cudasim {

enum class Engine : uint8_t { kNone, kCompute, kHostToDevice, kDeviceToHost };

// What an item was last to wait for before it could start: its submission by the host, the end
// of the item before it on its stream, or what it waits for on another stream (an event).
enum class ReadyBy : uint8_t { kSubmission, kPredecessor, kOtherStream };

class Timing {
 public:
  // Reads the environment (a bad value ends the process with one line, exit status 2).
  Timing();

  // Host copies and device copies are timed (a host bandwidth was given).
  bool copiesTimed() const { return h2dBytesPerNs_ > 0 || d2hBytesPerNs_ > 0; }
  // Modeled duration of a copy or memset of `bytes` on `engine` (0 when not timed).
  int64_t copyNs(Engine engine, uint64_t bytes, bool pageable) const;

  // The item became ready at `readyNs` (modeled), its host work ran from `hostStartNs` until now;
  // it occupies `engine` for `durationNs`, or for as long as its host work took if that was
  // longer (an overrun, counted). Sleeps until the item ends on the modeled clock; returns that.
  // `readyBy` says why it could not start earlier: an engine left idle before it is counted
  // against that cause (CUDASIM_VERBOSE=1), which tells a device starved by a host that fell
  // behind from one waiting for copies.
  int64_t finish(Engine engine, int64_t readyNs, int64_t hostStartNs, int64_t durationNs,
                 ReadyBy readyBy);

  // Timed items whose host work outlasted their modeled time, so far.
  uint64_t overruns() const { return overruns_.load(std::memory_order_relaxed); }
  int64_t overrunNs() const { return overrunNs_.load(std::memory_order_relaxed); }

  // At exit, with CUDASIM_VERBOSE=1: what was timed, and the overruns.
  void report() const;

 private:
  struct EngineClock {
    std::mutex mutex;
    int64_t freeAtNs = 0;
  };

  double h2dBytesPerNs_ = 0;
  double d2hBytesPerNs_ = 0;
  double d2dBytesPerNs_ = 1000;
  bool verbose_ = false;
  EngineClock engines_[4];
  std::atomic<uint64_t> timed_{0};
  std::atomic<uint64_t> overruns_{0};
  std::atomic<int64_t> overrunNs_{0};
  std::atomic<int64_t> overrunByEngineNs_[4] = {};
  std::atomic<int64_t> busyNs_[4] = {};
  std::atomic<int64_t> idleNs_[3] = {};  // the compute engine's, by ReadyBy
};

Timing& timing();
int64_t monotonicNs();

// The time the running kernel body declared (cudasimKernelTime), on its worker thread.
void declareKernelTime(int64_t ns);
int64_t takeDeclaredKernelTime();

}  // namespace cudasim
