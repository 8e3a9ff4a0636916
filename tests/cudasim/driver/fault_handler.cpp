#include "fault_handler.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "device_memory.h"

namespace cudasim {
namespace {

std::atomic<const DeviceMemory*> gMemory{nullptr};
struct sigaction gPreviousSegv;
struct sigaction gPreviousBus;
thread_local const WorkLabel* tCurrentWork = nullptr;

// Async-signal-safe formatting into a fixed buffer.
class Message {
 public:
  Message& text(const char* s) {
    while (s && *s && length_ < sizeof(buffer_) - 1) buffer_[length_++] = *s++;
    return *this;
  }
  Message& hex(uint64_t value) {
    char digits[17];
    int n = 0;
    do {
      digits[n++] = "0123456789abcdef"[value & 15];
      value >>= 4;
    } while (value != 0);
    text("0x");
    while (n > 0 && length_ < sizeof(buffer_) - 1) buffer_[length_++] = digits[--n];
    return *this;
  }
  Message& decimal(uint64_t value) {
    char digits[21];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0);
    while (n > 0 && length_ < sizeof(buffer_) - 1) buffer_[length_++] = digits[--n];
    return *this;
  }
  void write() const {
    ssize_t ignored = ::write(STDERR_FILENO, buffer_, length_);
    (void)ignored;
  }

 private:
  char buffer_[512];
  size_t length_ = 0;
};

void chain(const struct sigaction& previous, int signal, siginfo_t* info, void* context) {
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) return previous.sa_sigaction(signal, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    return previous.sa_handler(signal);
  }
  // Default action: put it back and return, so the faulting instruction faults again.
  struct sigaction fallback{};
  fallback.sa_handler = SIG_DFL;
  sigaction(signal, &fallback, nullptr);
}

// Async-signal-safe: it runs in the fault handler.
[[noreturn]] void report(uint64_t address) {
  Message message;
  message.text("cudasim: illegal address ").hex(address).text(": ");
  if (const WorkLabel* work = tCurrentWork) {
    if (work->kernel) message.text("kernel '").text(work->kernel).text("' launched by ");
    message.text(work->call).text(" on stream ").decimal(work->stream);
  } else {
    message.text("host code (not a kernel or copy) dereferenced a device address");
  }
  message.text(" touched device memory that is not mapped or has no access\n");
  message.write();
  struct sigaction abortDefault{};
  abortDefault.sa_handler = SIG_DFL;
  sigaction(SIGABRT, &abortDefault, nullptr);
  abort();
}

void onFault(int signal, siginfo_t* info, void* context) {
  const uint64_t address = reinterpret_cast<uint64_t>(info->si_addr);
  const DeviceMemory* memory = gMemory.load(std::memory_order_acquire);
  if (memory == nullptr || !memory->inAddressSpace(address, 1)) {
    chain(signal == SIGBUS ? gPreviousBus : gPreviousSegv, signal, info, context);
    return;
  }
  report(address);
}

}  // namespace

void installFaultHandler(const DeviceMemory* memory) {
  static std::once_flag once;
  std::call_once(once, [memory] {
    gMemory.store(memory, std::memory_order_release);
    struct sigaction action{};
    action.sa_sigaction = onFault;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &gPreviousSegv);
    sigaction(SIGBUS, &action, &gPreviousBus);
  });
}

void setCurrentWork(const WorkLabel* label) { tCurrentWork = label; }

void reportIllegalAddress(uint64_t address) { report(address); }

}  // namespace cudasim
