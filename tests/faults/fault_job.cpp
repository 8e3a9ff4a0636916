// fault-job: a small, deterministic CUDA program for the fault, process and signal tests of
// libdelta.so (tests/faults). It holds more device memory than the budgets the tests give
// the shim, touches every buffer every round from two streams, and checks every byte against
// a host shadow at the end, so an evicted buffer that came back wrong, or not at all, shows.
//
// What it does, in order:
//  1. with --own-pinned, allocates its own pinned staging buffer with cudaHostAlloc and says
//     whether it got one (`own_pinned: ok` or the error's name); it goes on with pageable
//     memory when not, as careful programs do;
//  2. allocates --buffers buffers of --mib MiB with cudaMalloc and fills each from the host
//     (one synchronous host-to-device copy each, in order: the tests count on that);
//  3. applies --faults-after-setup SPEC (cudasimSetFaults) and --host-memory-left MIB (limits
//     the process's data segment, RLIMIT_DATA, to what it uses now plus MIB: host memory then
//     runs out for whoever asks next, the shim included);
//  4. runs --rounds rounds; in each, buffer i is mixed with buffer i+1 by a kernel, on the
//     two streams in turn, each launch ordered after the previous one with an event (so the
//     result is defined while the streams differ); prints `round: R` after each;
//  5. after round --fork-after-round, forks: with --fork plain the child tries cudaMalloc and
//     reports what it got (a child of a CUDA process cannot use CUDA); with --fork exec the
//     child runs this program again as `fault-job --probe`, a fresh CUDA process that
//     allocates, fills and frees one buffer; the parent waits and prints `child: STATUS`;
//  6. copies every buffer back (one synchronous device-to-host copy each, in order) and
//     compares it with the shadow: `verify: ok` and `checksum: HEX`, or `verify: MISMATCH ...`
//     and exit status 3;
//  7. frees everything, unless --no-free (the program then just returns from main).
//
// Signals: --on-signal exit installs SIGINT/SIGTERM handlers that call exit(130) at once (common
// in C programs, though exit is not async-signal-safe); --on-signal flag makes them set a flag
// that the rounds check, and the program then ends normally with status 130, as Python does
// with KeyboardInterrupt. Without it, the signals keep their default action.
//
// Exit status: 0 done, 1 a CUDA call failed (its name and CUDA's error on stderr), 2 bad
// arguments, 3 a buffer's contents are wrong, 130 ended by a signal it handled.
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/mix.h"

namespace {

using delta::testing::kGolden;
using delta::testing::rotl;
using delta::testing::splitmix;

// The one data function, shared by the kernel and the shadow.
void mixWords(uint64_t* dst, const uint64_t* src, uint64_t words, uint64_t salt) {
  for (uint64_t w = 0; w < words; ++w) dst[w] = rotl(dst[w], 7) ^ (src[w] + salt * kGolden + w);
}

[[noreturn]] void stubCalled() {
  std::fprintf(stderr, "fault-job: the kernel was called directly instead of launched\n");
  std::abort();
}
void mixKernel(uint64_t*, const uint64_t*, uint64_t, uint64_t) { stubCalled(); }

void mixBody(void** params, dim3, dim3) {
  mixWords(*static_cast<uint64_t**>(params[0]), *static_cast<const uint64_t**>(params[1]),
           *static_cast<uint64_t*>(params[2]), *static_cast<uint64_t*>(params[3]));
}

[[maybe_unused]] const bool kRegistered = [] {
  static const size_t sizes[] = {8, 8, 8, 8};
  cudasimRegisterKernel(reinterpret_cast<const void*>(&mixKernel), "fault_job_mix", mixBody, 4,
                        sizes);
  return true;
}();

void check(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return;
  std::fflush(stdout);
  std::fprintf(stderr, "fault-job: error: %s failed: %s (%s)\n", call, cudaGetErrorString(error),
               cudaGetErrorName(error));
  std::exit(1);
}

struct Options {
  int buffers = 10;
  int mib = 4;
  int rounds = 3;
  uint64_t seed = 1;
  bool ownPinned = false;
  bool noFree = false;
  std::string fork;  // "", "plain" or "exec"
  int forkAfterRound = 0;
  std::string onSignal;  // "", "exit" or "flag"
  std::string faultsAfterSetup;
  bool faultsAfterSetupGiven = false;
  long hostMemoryLeftMib = -1;
  int roundDelayMs = 0;
};

[[noreturn]] void badArgument(const std::string& what) {
  std::fprintf(stderr, "fault-job: bad argument: %s\n", what.c_str());
  std::exit(2);
}

long number(const char* text, const char* name, long low, long high) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < low || value > high)
    badArgument(std::string(name) + " '" + text + "'");
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) badArgument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--buffers") o.buffers = static_cast<int>(number(value(), "--buffers", 2, 1000));
    else if (arg == "--mib") o.mib = static_cast<int>(number(value(), "--mib", 1, 1024));
    else if (arg == "--rounds") o.rounds = static_cast<int>(number(value(), "--rounds", 1, 100000));
    else if (arg == "--seed") o.seed = static_cast<uint64_t>(number(value(), "--seed", 0, 1L << 40));
    else if (arg == "--own-pinned") o.ownPinned = true;
    else if (arg == "--no-free") o.noFree = true;
    else if (arg == "--fork") o.fork = value();
    else if (arg == "--fork-after-round")
      o.forkAfterRound = static_cast<int>(number(value(), "--fork-after-round", 0, 100000));
    else if (arg == "--on-signal") o.onSignal = value();
    else if (arg == "--faults-after-setup") o.faultsAfterSetup = value(), o.faultsAfterSetupGiven = true;
    else if (arg == "--host-memory-left") o.hostMemoryLeftMib = number(value(), "--host-memory-left", 0, 1 << 20);
    else if (arg == "--round-delay-ms") o.roundDelayMs = static_cast<int>(number(value(), "--round-delay-ms", 0, 60000));
    else badArgument(arg);
  }
  if (!o.fork.empty() && o.fork != "plain" && o.fork != "exec") badArgument("--fork " + o.fork);
  if (!o.onSignal.empty() && o.onSignal != "exit" && o.onSignal != "flag")
    badArgument("--on-signal " + o.onSignal);
  return o;
}

// A fresh CUDA process (the exec'd child): allocate, fill, check and free one buffer.
int probe() {
  const size_t bytes = 4u << 20;
  void* device = nullptr;
  check(cudaMalloc(&device, bytes), "cudaMalloc (probe)");
  check(cudaMemset(device, 0x5a, bytes), "cudaMemset (probe)");
  std::vector<unsigned char> host(bytes);
  check(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (probe)");
  for (unsigned char b : host)
    if (b != 0x5a) {
      std::printf("probe: MISMATCH\n");
      return 3;
    }
  check(cudaFree(device), "cudaFree (probe)");
  std::printf("probe: ok\n");
  return 0;
}

std::atomic<bool> gInterrupted{false};

void exitAtOnce(int) { std::exit(130); }
void raiseFlag(int) { gInterrupted.store(true); }

void installHandlers(const std::string& mode) {
  if (mode.empty()) return;
  struct sigaction action {};
  action.sa_handler = mode == "exit" ? exitAtOnce : raiseFlag;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// Data segment in use (VmData of /proc/self/status), in bytes; what RLIMIT_DATA limits.
uint64_t dataSegmentBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmData:", 0) == 0) return std::stoull(line.substr(7)) << 10;
  return 0;
}

void forkChild(const Options& o, char** argv) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fault-job: fork");
    std::exit(1);
  }
  if (pid == 0) {
    if (o.fork == "exec") {
      execl(argv[0], argv[0], "--probe", static_cast<char*>(nullptr));
      std::perror("fault-job: exec");
      _exit(127);
    }
    // The child of a CUDA process cannot use CUDA: the runtime says so, and that is all.
    void* device = nullptr;
    const cudaError_t error = cudaMalloc(&device, 4u << 20);
    std::printf("child_malloc: %s\n", cudaGetErrorName(error));
    std::exit(0);  // atexit handlers run here, the shim's included
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("child: %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--probe") == 0) return probe();
  const Options o = parse(argc, argv);
  installHandlers(o.onSignal);
  const uint64_t bytes = uint64_t(o.mib) << 20;
  const uint64_t words = bytes / 8;

  void* staging = nullptr;
  bool stagingPinned = false;
  if (o.ownPinned) {
    const cudaError_t error = cudaHostAlloc(&staging, bytes, cudaHostAllocDefault);
    std::printf("own_pinned: %s\n", error == cudaSuccess ? "ok" : cudaGetErrorName(error));
    stagingPinned = error == cudaSuccess;
    if (!stagingPinned) cudaGetLastError();  // handled: pageable memory will do
  }
  if (!stagingPinned) staging = std::malloc(bytes);
  auto* host = static_cast<uint64_t*>(staging);

  cudaStream_t streams[2];
  check(cudaStreamCreate(&streams[0]), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t previous;
  check(cudaEventCreateWithFlags(&previous, cudaEventDisableTiming), "cudaEventCreateWithFlags");

  std::vector<uint64_t*> device(o.buffers, nullptr);
  std::vector<std::vector<uint64_t>> shadow(o.buffers, std::vector<uint64_t>(words));
  for (int i = 0; i < o.buffers; ++i) {
    check(cudaMalloc(reinterpret_cast<void**>(&device[i]), bytes), "cudaMalloc");
    for (uint64_t w = 0; w < words; ++w) shadow[i][w] = splitmix(o.seed * 1000003 + i * words + w);
    std::memcpy(host, shadow[i].data(), bytes);
    check(cudaMemcpy(device[i], host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (fill)");
  }

  if (o.faultsAfterSetupGiven) {
    if (const char* error = cudasimSetFaults(o.faultsAfterSetup.c_str())) {
      std::fprintf(stderr, "fault-job: --faults-after-setup: %s\n", error);
      return 2;
    }
  }
  if (o.hostMemoryLeftMib >= 0) {
    rlimit limit{};
    getrlimit(RLIMIT_DATA, &limit);
    limit.rlim_cur = dataSegmentBytes() + (uint64_t(o.hostMemoryLeftMib) << 20);
    if (setrlimit(RLIMIT_DATA, &limit) != 0) std::perror("fault-job: setrlimit");
  }

  bool launched = false;
  for (int round = 0; round < o.rounds && !gInterrupted.load(); ++round) {
    for (int i = 0; i < o.buffers && !gInterrupted.load(); ++i) {
      const int j = (i + 1) % o.buffers;
      cudaStream_t stream = streams[i % 2];
      if (launched) check(cudaStreamWaitEvent(stream, previous, 0), "cudaStreamWaitEvent");
      uint64_t* dst = device[i];
      const uint64_t* src = device[j];
      uint64_t count = words;
      uint64_t salt = uint64_t(round) * o.buffers + i;
      void* args[] = {&dst, &src, &count, &salt};
      check(cudaLaunchKernel(reinterpret_cast<const void*>(&mixKernel), dim3(1), dim3(1), args, 0,
                             stream),
            "cudaLaunchKernel");
      check(cudaEventRecord(previous, stream), "cudaEventRecord");
      launched = true;
      mixWords(shadow[i].data(), shadow[j].data(), words, salt);
    }
    if (gInterrupted.load()) break;
    std::printf("round: %d\n", round);
    std::fflush(stdout);
    if (o.roundDelayMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.roundDelayMs));
    if (!o.fork.empty() && round == o.forkAfterRound) forkChild(o, argv);
  }
  if (gInterrupted.load()) {
    std::printf("interrupted\n");
    return 130;  // an ordinary exit: atexit handlers and static destructors run
  }

  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  uint64_t checksum = 0xCBF29CE484222325ull;
  for (int i = 0; i < o.buffers; ++i) {
    check(cudaMemcpy(host, device[i], bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (verify)");
    for (uint64_t w = 0; w < words; ++w) {
      if (host[w] != shadow[i][w]) {
        std::printf("verify: MISMATCH buffer %d word %llu: expected %016llx, got %016llx\n", i,
                    (unsigned long long)w, (unsigned long long)shadow[i][w],
                    (unsigned long long)host[w]);
        return 3;
      }
      checksum = (checksum ^ host[w]) * 0x100000001B3ull;
    }
  }
  std::printf("verify: ok\nchecksum: %016llx\n", (unsigned long long)checksum);
  if (o.noFree) return 0;  // leaves buffers, streams and events to the process's end
  for (uint64_t* buffer : device) check(cudaFree(buffer), "cudaFree");
  check(cudaEventDestroy(previous), "cudaEventDestroy");
  for (cudaStream_t stream : streams) check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  if (stagingPinned)
    check(cudaFreeHost(staging), "cudaFreeHost");
  else
    std::free(staging);
  return 0;
}
