#include "stream_engine.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <system_error>

#include "faults.h"

namespace cudasim {
namespace {

thread_local int64_t tItemReadyNs = 0;

// Completions remembered for cross-stream waits; older ones ended long before anything waits.
constexpr size_t kRememberedEnds = 4096;

}  // namespace

int64_t currentItemReadyNs() { return tItemReadyNs; }

bool Stream::start() {
  // The worker keeps the stream alive until it has drained after retire().
  try {
    std::thread([self = shared_from_this()] { self->work(); }).detach();
  } catch (const std::system_error&) {
    return false;  // no memory for its stack: the real driver answers out-of-memory
  }
  return true;
}

uint64_t Stream::submit(WorkItem item) {
  item.submitNs = monotonicNs();
  std::lock_guard lock(mutex_);
  queue_.push_back(std::move(item));
  changed_.notify_all();
  return ++submitted_;
}

uint64_t Stream::lastSubmitted() {
  std::lock_guard lock(mutex_);
  return submitted_;
}

bool Stream::reached(uint64_t position) {
  std::lock_guard lock(mutex_);
  return completed_ >= position;
}

int64_t Stream::endOf(uint64_t position) {
  std::lock_guard lock(mutex_);
  for (auto it = ends_.rbegin(); it != ends_.rend(); ++it)
    if (it->first <= position) return it->second;
  return 0;
}

void Stream::waitUntil(uint64_t position) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return completed_ >= position; });
}

void Stream::retire() {
  std::lock_guard lock(mutex_);
  retiring_ = true;
  changed_.notify_all();
}

void Stream::work() {
  // Modeled deadlines are slept to with this thread's timer slack at its least: the default
  // (50 us) would make every timed item late by that much.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  for (;;) {
    WorkItem item;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return !queue_.empty() || retiring_; });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    // Ready on the modeled clock: submitted, the predecessor ended, what it waits for ended.
    int64_t readyNs = std::max(item.submitNs, lastEndNs_);
    ReadyBy readyBy = item.submitNs >= lastEndNs_ ? ReadyBy::kSubmission : lastEndBy_;
    if (item.after) {
      item.after->waitUntil(item.afterPosition);
      const int64_t afterEndNs = item.after->endOf(item.afterPosition);
      if (afterEndNs > readyNs) readyBy = ReadyBy::kOtherStream;
      readyNs = std::max(readyNs, afterEndNs);
    }
    if (item.run && item.delayUs > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(item.delayUs));
      readyNs = std::max(readyNs, monotonicNs());
    }
    int64_t endNs = readyNs;
    ReadyBy endBy = readyBy;
    if (item.run) {
      tItemReadyNs = readyNs;
      const int64_t hostStartNs = monotonicNs();
      WorkLabel label{item.call, item.kernel, id_};
      setCurrentWork(&label);
      item.run();
      setCurrentWork(nullptr);
      const int64_t duration = item.engine == Engine::kNone ? 0
                               : item.durationNs == WorkItem::kDeclared ? takeDeclaredKernelTime()
                                                                        : item.durationNs;
      if (duration > 0) {
        // The engine is busy for the modeled time from when the item could start; the stream
        // reaches the next item only then.
        endNs = timing().finish(item.engine, readyNs, hostStartNs, duration, readyBy);
        endBy = ReadyBy::kPredecessor;
      } else if (!item.instant) {
        endNs = std::max(readyNs, monotonicNs());  // untimed work ends when its host work does
      }
    }
    item = WorkItem{};  // release captured state before announcing completion
    std::lock_guard lock(mutex_);
    lastEndNs_ = endNs;
    lastEndBy_ = endBy;
    ends_.emplace_back(completed_ + 1, endNs);
    if (ends_.size() > kRememberedEnds) ends_.pop_front();
    ++completed_;
    changed_.notify_all();
  }
}

StreamEngine::StreamEngine() {
  legacy_ = newStream(0, true);
  if (!legacy_) throw std::bad_alloc();  // cuInit cannot go on without its default stream
}

std::shared_ptr<Stream> StreamEngine::newStream(unsigned flags, bool legacy) {
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard lock(mutex_);
    stream = std::make_shared<Stream>(nextStreamId_++, flags, legacy);
    all_.push_back(stream);
  }
  if (stream->start()) return stream;
  std::lock_guard lock(mutex_);
  std::erase(all_, stream);
  return nullptr;
}

std::shared_ptr<Stream> StreamEngine::perThreadStream() {
  // Retired when its thread exits; its queued work still runs.
  struct Holder {
    std::shared_ptr<Stream> stream;
    ~Holder() {
      if (stream) stream->retire();
    }
  };
  thread_local Holder holder;
  if (!holder.stream) holder.stream = newStream(0, false);
  return holder.stream;  // nullptr when its worker could not be started
}

CUresult StreamEngine::resolve(CUstream handle, bool perThreadDefault,
                               std::shared_ptr<Stream>* out) {
  if (handle == CU_STREAM_PER_THREAD || (handle == nullptr && perThreadDefault)) {
    *out = perThreadStream();
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (handle == nullptr || handle == CU_STREAM_LEGACY) {
    *out = legacy_;
    return CUDA_SUCCESS;
  }
  std::lock_guard lock(mutex_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return CUDA_ERROR_INVALID_HANDLE;
  *out = it->second;
  return CUDA_SUCCESS;
}

CUresult StreamEngine::create(unsigned flags, CUstream* out) {
  if (flags & ~unsigned(CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  auto stream = newStream(flags, false);
  if (!stream) return CUDA_ERROR_OUT_OF_MEMORY;
  // The handle is an opaque pointer-sized value; the Stream's address serves.
  auto handle = reinterpret_cast<CUstream>(stream.get());
  std::lock_guard lock(mutex_);
  handles_[handle] = stream;
  *out = handle;
  return CUDA_SUCCESS;
}

CUresult StreamEngine::destroy(CUstream handle) {
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard lock(mutex_);
    auto it = handles_.find(handle);
    if (it == handles_.end()) return CUDA_ERROR_INVALID_HANDLE;
    stream = it->second;
    handles_.erase(it);
  }
  // As in CUDA: returns at once; work already queued still completes.
  stream->retire();
  return CUDA_SUCCESS;
}

uint64_t StreamEngine::submit(const std::shared_ptr<Stream>& stream, WorkItem item) {
  if (item.run) item.delayUs += faults().slowStreamUs.load(std::memory_order_relaxed);
  if (stream->legacy()) {
    std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> earlier;
    {
      std::lock_guard lock(mutex_);
      for (const auto& other : all_) {
        if (other == stream || !other->blocking()) continue;
        uint64_t last = other->lastSubmitted();
        if (!other->reached(last)) earlier.emplace_back(other, last);
      }
    }
    for (auto& [other, position] : earlier)
      stream->submit(WorkItem{{}, item.call, nullptr, other, position});
  } else if (stream->blocking()) {
    uint64_t last = legacy_->lastSubmitted();
    if (!legacy_->reached(last)) stream->submit(WorkItem{{}, item.call, nullptr, legacy_, last});
  }
  return stream->submit(std::move(item));
}

void StreamEngine::submitAndWait(const std::shared_ptr<Stream>& stream, WorkItem item) {
  stream->waitUntil(submit(stream, std::move(item)));
}

void StreamEngine::synchronizeAll() {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lock(mutex_);
    streams = all_;
  }
  for (const auto& stream : streams) stream->waitUntil(stream->lastSubmitted());
  streams.clear();
  // Forget retired streams that have drained (their workers have let go of them).
  std::lock_guard lock(mutex_);
  std::erase_if(all_, [](const std::shared_ptr<Stream>& s) { return s.use_count() == 1; });
}

CUresult StreamEngine::query(const std::shared_ptr<Stream>& stream) {
  return stream->reached(stream->lastSubmitted()) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult StreamEngine::createEvent(unsigned flags, CUevent* out) {
  constexpr unsigned kKnown = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
    return CUDA_ERROR_INVALID_VALUE;
  auto event = std::make_shared<Event>();
  event->flags = flags;
  auto handle = reinterpret_cast<CUevent>(event.get());
  std::lock_guard lock(mutex_);
  events_[handle] = std::move(event);
  *out = handle;
  return CUDA_SUCCESS;
}

std::shared_ptr<Event> StreamEngine::findEvent(CUevent handle) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(handle);
  return it == events_.end() ? nullptr : it->second;
}

CUresult StreamEngine::destroyEvent(CUevent handle) {
  std::lock_guard lock(mutex_);
  return events_.erase(handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult StreamEngine::record(CUevent handle, const std::shared_ptr<Stream>& stream) {
  auto event = findEvent(handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t generation;
  {
    std::lock_guard lock(event->mutex);
    generation = ++event->generation;
  }
  WorkItem stamp;
  stamp.call = "cuEventRecord";
  stamp.instant = true;
  // The time the stream reached the event on the modeled clock (with GPU time, what the
  // engines' deadlines say; without, when the work before it ended).
  stamp.run = [event, generation] {
    std::lock_guard lock(event->mutex);
    if (event->generation == generation) event->timeNs = currentItemReadyNs();
  };
  uint64_t position = submit(stream, std::move(stamp));
  std::lock_guard lock(event->mutex);
  if (event->generation == generation) {
    event->stream = stream;
    event->position = position;
    event->recorded = true;
  }
  return CUDA_SUCCESS;
}

CUresult StreamEngine::queryEvent(CUevent handle) {
  auto event = findEvent(handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard lock(event->mutex);
  if (!event->recorded) return CUDA_SUCCESS;
  return event->stream->reached(event->position) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult StreamEngine::synchronizeEvent(CUevent handle) {
  auto event = findEvent(handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<Stream> stream;
  uint64_t position;
  {
    std::lock_guard lock(event->mutex);
    if (!event->recorded) return CUDA_SUCCESS;
    stream = event->stream;
    position = event->position;
  }
  stream->waitUntil(position);
  return CUDA_SUCCESS;
}

CUresult StreamEngine::elapsed(float* milliseconds, CUevent startHandle, CUevent endHandle) {
  if (milliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto start = findEvent(startHandle);
  auto end = findEvent(endHandle);
  if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
  int64_t times[2];
  Event* events[2] = {start.get(), end.get()};
  for (int i = 0; i < 2; ++i) {
    std::lock_guard lock(events[i]->mutex);
    if (!events[i]->recorded || (events[i]->flags & CU_EVENT_DISABLE_TIMING))
      return CUDA_ERROR_INVALID_HANDLE;
    if (!events[i]->stream->reached(events[i]->position)) return CUDA_ERROR_NOT_READY;
    times[i] = events[i]->timeNs;
  }
  *milliseconds = static_cast<float>(times[1] - times[0]) / 1e6f;
  return CUDA_SUCCESS;
}

CUresult StreamEngine::waitEvent(const std::shared_ptr<Stream>& stream, CUevent handle) {
  auto event = findEvent(handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<Stream> source;
  uint64_t position;
  {
    std::lock_guard lock(event->mutex);
    if (!event->recorded) return CUDA_SUCCESS;
    source = event->stream;
    position = event->position;
  }
  if (source != stream) stream->submit(WorkItem{{}, "cuStreamWaitEvent", nullptr, source, position});
  return CUDA_SUCCESS;
}

}  // namespace cudasim
