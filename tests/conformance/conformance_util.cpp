/* Implementation of the shared helpers and the test binaries' main(), which also runs the
 * child modes (see conformance_util.h). Portable: only the real CUDA API. */
#include "conformance_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace conformance {

std::string CuName(CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) {
    return "CUresult(" + std::to_string(static_cast<int>(r)) + ")";
  }
  return std::string(name) + " (" + std::to_string(static_cast<int>(r)) + ")";
}

std::string RtName(cudaError_t r) {
  const char* name = cudaGetErrorName(r);
  return std::string(name ? name : "?") + " (" + std::to_string(static_cast<int>(r)) + ")";
}

::testing::AssertionResult CuEq(const char*, const char* call_expr, CUresult expected,
                                CUresult got) {
  if (expected == got) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << call_expr << " returned " << CuName(got) << ", expected " << CuName(expected);
}

::testing::AssertionResult RtEq(const char*, const char* call_expr, cudaError_t expected,
                                cudaError_t got) {
  if (expected == got) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << call_expr << " returned " << RtName(got) << ", expected " << RtName(expected);
}

void Gate::Open() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = true;
  cv_.notify_all();
}

bool Gate::Wait(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, limit, [this] { return open_; })) {
    timed_out_ = true;
    return false;
  }
  return true;
}

void CUDA_CB Gate::BlockHostFn(void* gate) { static_cast<Gate*>(gate)->Wait(); }

CUresult StreamGate::Hold(CUstream stream) {
  if (word_ == nullptr) {
    void* host = nullptr;
    if (CUresult r = cuMemHostAlloc(&host, sizeof(uint32_t), CU_MEMHOSTALLOC_DEVICEMAP)) return r;
    word_ = static_cast<uint32_t*>(host);
    __atomic_store_n(word_, 0u, __ATOMIC_RELEASE);
    if (CUresult r = cuMemHostGetDevicePointer(&device_, host, 0)) return r;
  }
  return cuStreamWaitValue32(stream, device_, 1, CU_STREAM_WAIT_VALUE_GEQ);
}

void StreamGate::Open() {
  if (word_ != nullptr) __atomic_store_n(word_, 1u, __ATOMIC_RELEASE);
}

void StreamGate::Close() {
  if (word_ == nullptr) return;
  Open();
  cuCtxSynchronize();  // no stream may still read the word
  cuMemFreeHost(word_);
  word_ = nullptr;
  device_ = 0;
}

void OrderLog::Mark(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  marks_.push_back(what);
  cv_.notify_all();
}

bool OrderLog::WaitFor(const std::string& what, std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, limit, [&] {
    for (const auto& m : marks_) {
      if (m == what) return true;
    }
    return false;
  });
}

bool OrderLog::Has(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& m : marks_) {
    if (m == what) return true;
  }
  return false;
}

std::vector<std::string> OrderLog::Marks() {
  std::lock_guard<std::mutex> lock(mutex_);
  return marks_;
}

void CUDA_CB Marker::HostFn(void* marker) {
  auto* m = static_cast<Marker*>(marker);
  m->log->Mark(m->what);
}

void CUDA_CB GatedMarker::HostFn(void* marker) {
  auto* m = static_cast<GatedMarker*>(marker);
  m->gate->Wait();
  m->log->Mark(m->what);
}

void DriverTest::SetUp() {
  ASSERT_CU(cuInit(0));
  ASSERT_CU(cuDeviceGet(&dev_, 0));
  ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev_));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
}

void DriverTest::TearDown() {
  if (ctx_ != nullptr) {
    EXPECT_CU(cuCtxSynchronize());
    EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
  }
}

PinnedBuffer::PinnedBuffer(size_t bytes) {
  if (cuMemHostAlloc(&p_, bytes, 0) != CUDA_SUCCESS) p_ = nullptr;
}

PinnedBuffer::~PinnedBuffer() {
  if (p_ != nullptr) cuMemFreeHost(p_);
}

namespace {

std::map<std::string, ChildFn>& Children() {
  static std::map<std::string, ChildFn> children;
  return children;
}

}  // namespace

bool RegisterChild(const char* name, ChildFn fn) {
  Children()[name] = fn;
  return true;
}

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = '\0';
  return buf;
}

int ChildFail(const char* what, long long got, long long expected) {
  std::fprintf(stderr, "child: %s: got %lld, expected %lld\n", what, got, expected);
  return 1;
}

ChildResult RunChild(const std::string& name, const ChildOptions& options) {
  ChildResult result;
  std::string exe = options.executable.empty() ? SelfExe() : options.executable;
  std::vector<std::string> argv_s;
  argv_s.push_back(exe);
  if (options.executable.empty()) {
    argv_s.push_back("--conformance-child");
    argv_s.push_back(name);
  }
  for (const auto& a : options.args) argv_s.push_back(a);

  // Build the environment before forking (no allocation after fork in a threaded parent).
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    bool drop = false;
    for (const auto& u : options.unset_env) drop = drop || key == u;
    for (const auto& kv : options.set_env) drop = drop || key == kv.first;
    if (!drop) env_s.push_back(entry);
  }
  for (const auto& kv : options.set_env) env_s.push_back(kv.first + "=" + kv.second);
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    result.output = "pipe failed";
    return result;
  }
  pid_t pid = fork();
  if (pid < 0) {
    result.output = "fork failed";
    close(out[0]);
    close(out[1]);
    return result;
  }
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    for (int fd : options.keep_fds) {
      int flags = fcntl(fd, F_GETFD);
      if (flags >= 0) fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
    }
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  auto deadline = std::chrono::steady_clock::now() + options.limit;
  char buf[4096];
  bool eof = false;
  while (!eof) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) {
      eof = true;
    } else {
      result.output.append(buf, static_cast<size_t>(n));
    }
  }
  close(out[0]);
  // The output closed; the child is exiting (or was killed). Reap it, bounded.
  int status = 0;
  for (int i = 0;; ++i) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (i == 5000) {  // 5 s after EOF: kill it
      result.timed_out = true;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (WIFEXITED(status)) {
    result.exited = true;
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

}  // namespace conformance

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--conformance-child") == 0) {
    auto& children = conformance::Children();
    auto it = children.find(argv[2]);
    if (it == children.end()) {
      std::fprintf(stderr, "unknown child mode %s\n", argv[2]);
      return 126;
    }
    std::vector<std::string> args(argv + 3, argv + argc);
    int rc = it->second(args);
    std::fflush(stdout);
    std::fflush(stderr);
    return rc;
  }
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  return RUN_ALL_TESTS();
}
