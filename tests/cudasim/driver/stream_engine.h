// Streams and events of the simulated GPU.
//
// Every stream has a worker thread that runs its work in order, late: the caller gets
// control back as soon as the work is queued, so a missing wait in a program (or in the
// shim) shows up as wrong data, as on a GPU. Ordering across streams follows CUDA:
// - the legacy default stream waits for all earlier work of every blocking stream, and
//   blocking streams wait for all earlier work of the legacy stream;
// - CU_STREAM_NON_BLOCKING streams take part in neither;
// - the per-thread default stream is an ordinary blocking stream, one per host thread;
// - cuStreamWaitEvent makes later work on a stream wait for the event's point in another.
// A dependency is a "wait" item queued before the work, which blocks that worker until the
// other stream has reached the given position. Waits only ever point at work queued
// earlier, so they cannot form a cycle.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fault_handler.h"
#include "timing.h"

namespace cudasim {

class Stream;

struct WorkItem {
  std::function<void()> run;
  const char* call = "";
  const char* kernel = nullptr;
  std::shared_ptr<Stream> after;  // when set: first wait until `after` has reached afterPosition
  uint64_t afterPosition = 0;
  uint32_t delayUs = 0;  // injected slowness (faults.h): the worker waits this long first
  // GPU time (timing.h): the engine the item occupies and for how long; for a kernel, the
  // time its body declares (kDeclared).
  Engine engine = Engine::kNone;
  int64_t durationNs = 0;
  static constexpr int64_t kDeclared = -1;
  // Takes no time of its own (an event's stamp): it ends when it becomes ready.
  bool instant = false;
  int64_t submitNs = 0;  // set by Stream::submit
};

// The modeled time at which the item now running on this worker became ready (an event stamp
// records it).
int64_t currentItemReadyNs();

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(uint64_t id, unsigned flags, bool legacy) : id_(id), flags_(flags), legacy_(legacy) {}

  // Starts the worker thread; false when the system cannot give one (out of memory).
  bool start();
  // Queues the item; returns its position (1, 2, ...). reached(position) once it has run.
  uint64_t submit(WorkItem item);
  uint64_t lastSubmitted();
  bool reached(uint64_t position);
  // When the item at `position` (reached) ended on the modeled clock; 0 when long ago.
  int64_t endOf(uint64_t position);
  void waitUntil(uint64_t position);
  // Lets the worker finish what is queued, then exit.
  void retire();

  uint64_t id() const { return id_; }
  unsigned flags() const { return flags_; }
  bool legacy() const { return legacy_; }
  bool blocking() const { return !(flags_ & CU_STREAM_NON_BLOCKING); }

 private:
  void work();

  const uint64_t id_;
  const unsigned flags_;
  const bool legacy_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<WorkItem> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool retiring_ = false;
  // The modeled clock (timing.h): when each recent item ended, the last first. An item is
  // ready when it was submitted, its predecessor ended and what it waits for ended, whatever
  // the worker's own wake-up latency.
  int64_t lastEndNs_ = 0;
  // Why the last item ended when it did: a timed one, when its engine finished it; an untimed
  // one (a wait for an event, a host function), when what it was waiting for did.
  ReadyBy lastEndBy_ = ReadyBy::kPredecessor;
  std::deque<std::pair<uint64_t, int64_t>> ends_;
};

struct Event {
  unsigned flags;
  std::mutex mutex;
  std::shared_ptr<Stream> stream;  // where it was last recorded
  uint64_t position = 0;
  uint64_t generation = 0;
  bool recorded = false;
  int64_t timeNs = 0;
};

class StreamEngine {
 public:
  StreamEngine();

  // Resolves a stream handle: 0 is the legacy stream (or the per-thread stream for the
  // _ptsz/_ptds API variants), CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are what they say.
  CUresult resolve(CUstream handle, bool perThreadDefault, std::shared_ptr<Stream>* out);
  CUresult create(unsigned flags, CUstream* out);
  CUresult destroy(CUstream handle);

  // Queues work with the legacy-stream ordering rules; returns its position.
  uint64_t submit(const std::shared_ptr<Stream>& stream, WorkItem item);
  // Queues work and waits until it has run.
  void submitAndWait(const std::shared_ptr<Stream>& stream, WorkItem item);
  void synchronizeAll();
  CUresult query(const std::shared_ptr<Stream>& stream);

  CUresult createEvent(unsigned flags, CUevent* out);
  CUresult destroyEvent(CUevent handle);
  CUresult record(CUevent handle, const std::shared_ptr<Stream>& stream);
  CUresult queryEvent(CUevent handle);
  CUresult synchronizeEvent(CUevent handle);
  CUresult elapsed(float* milliseconds, CUevent start, CUevent end);
  CUresult waitEvent(const std::shared_ptr<Stream>& stream, CUevent handle);

 private:
  // nullptr when no worker thread can be started.
  std::shared_ptr<Stream> newStream(unsigned flags, bool legacy);
  std::shared_ptr<Stream> perThreadStream();
  std::shared_ptr<Event> findEvent(CUevent handle);

  std::mutex mutex_;
  uint64_t nextStreamId_ = 1;
  std::shared_ptr<Stream> legacy_;
  // Streams that work may still be queued on: created ones, per-thread ones, and destroyed
  // ones until they drain (cuCtxSynchronize must wait for those too).
  std::vector<std::shared_ptr<Stream>> all_;
  std::unordered_map<CUstream, std::shared_ptr<Stream>> handles_;
  std::unordered_map<CUevent, std::shared_ptr<Event>> events_;
};

}  // namespace cudasim
