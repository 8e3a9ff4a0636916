// minigtest: the small part of GoogleTest's API that the portable conformance tests use
// (TEST, TEST_F, the EXPECT_/ASSERT_ comparisons, EXPECT_PRED_FORMAT2, AssertionResult,
// --gtest_filter), in one header, written for this project.
//
// Why: the GPU machines the check kit runs on (scripts/gpu-check) have a compiler, meson, ninja
// and nvcc but no GoogleTest, and no network to fetch it. The meson build uses this header in
// place of GoogleTest for conformance-portable-real when GoogleTest is not installed, so that
// the conformance tests build and run there from source against the real driver. Where
// GoogleTest is installed the real one is used and this header is never seen.
//
// Not here (a test that needs them does not build with this header, which is the point):
// death tests, parameterised and typed tests, SCOPED_TRACE, GTEST_SKIP, matchers, XML output.
// Output follows GoogleTest's ([ RUN      ], [       OK ], [  FAILED  ], [  PASSED  ]).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace testing {

// A message to add to a failure: `ASSERT_EQ(a, b) << "context"`.
class Message {
 public:
  template <class T>
  Message& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  std::string str() const { return stream_.str(); }

 private:
  std::ostringstream stream_;
};

class AssertionResult {
 public:
  explicit AssertionResult(bool success) : success_(success) {}
  explicit operator bool() const { return success_; }
  template <class T>
  AssertionResult& operator<<(const T& value) {
    std::ostringstream stream;
    stream << value;
    message_ += stream.str();
    return *this;
  }
  const std::string& message() const { return message_; }

 private:
  bool success_;
  std::string message_;
};

inline AssertionResult AssertionSuccess() { return AssertionResult(true); }
inline AssertionResult AssertionFailure() { return AssertionResult(false); }

class Test {
 public:
  virtual ~Test() = default;
  virtual void SetUp() {}
  virtual void TearDown() {}
  virtual void TestBody() = 0;
  static bool HasFatalFailure();
  static bool HasFailure();
};

// Accepted and ignored (no death tests here); GoogleTest's spelling of flags.
inline std::string FLAGS_gtest_death_test_style;
#define GTEST_FLAG(name) FLAGS_gtest_##name

namespace internal {

struct Registered {
  std::string suite;
  std::string name;
  std::function<Test*()> make;
};

inline std::vector<Registered>& registry() {
  static std::vector<Registered> tests;
  return tests;
}

// The state of the test running now; failures may be reported from other threads.
struct Current {
  std::mutex mutex;
  bool failed = false;
  bool fatal = false;
};
inline Current& current() {
  static Current state;
  return state;
}

inline bool registerTest(const char* suite, const char* name, std::function<Test*()> make) {
  registry().push_back({suite, name, std::move(make)});
  return true;
}

// Values as failure messages show them: streamable ones as they stream, ranges element by
// element, anything else by its size.
template <class T, class = void>
struct Streamable : std::false_type {};
template <class T>
struct Streamable<T, std::void_t<decltype(std::declval<std::ostream&>() << std::declval<const T&>())>>
    : std::true_type {};
template <class T, class = void>
struct Iterable : std::false_type {};
template <class T>
struct Iterable<T, std::void_t<decltype(std::begin(std::declval<const T&>()))>> : std::true_type {};

template <class T>
std::string show(const T& value) {
  std::ostringstream out;
  if constexpr (std::is_same_v<T, unsigned char> || std::is_same_v<T, signed char> ||
                std::is_same_v<T, char>) {
    out << static_cast<int>(value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    out << '"' << value << '"';
  } else if constexpr (Streamable<T>::value) {
    out << value;
  } else if constexpr (Iterable<T>::value) {
    out << "{ ";
    size_t shown = 0;
    for (const auto& element : value) {
      if (shown == 32) {
        out << "... ";
        break;
      }
      out << show(element) << ' ';
      ++shown;
    }
    out << '}';
  } else {
    out << sizeof(T) << "-byte object";
  }
  return out.str();
}

template <class A, class B, class Compare>
AssertionResult compare(const char* op, const char* aText, const char* bText, const A& a,
                        const B& b, Compare holds) {
  if (holds(a, b)) return AssertionSuccess();
  return AssertionFailure() << "Expected: (" << aText << ") " << op << " (" << bText
                            << "), actual: " << show(a) << " vs " << show(b);
}

inline AssertionResult compareStrings(const char* aText, const char* bText, const char* a,
                                      const char* b, bool equal) {
  const bool same = (a == nullptr || b == nullptr) ? a == b : std::strcmp(a, b) == 0;
  if (same == equal) return AssertionSuccess();
  return AssertionFailure() << "Expected: (" << aText << ") " << (equal ? "==" : "!=") << " ("
                            << bText << "), actual: \"" << (a ? a : "(null)") << "\" vs \""
                            << (b ? b : "(null)") << "\"";
}

inline AssertionResult isTrue(bool value, const char* text, bool expected) {
  if (value == expected) return AssertionSuccess();
  return AssertionFailure() << "Value of: " << text << "\n  Actual: " << (value ? "true" : "false")
                            << "\nExpected: " << (expected ? "true" : "false");
}

// Records a failure when assigned the user's message (the `= Message() << ...` of the macros).
class AssertHelper {
 public:
  AssertHelper(const char* file, int line, std::string text, bool fatal)
      : file_(file), line_(line), text_(std::move(text)), fatal_(fatal) {}
  void operator=(const Message& message) const {
    Current& state = current();
    std::lock_guard lock(state.mutex);
    state.failed = true;
    state.fatal = state.fatal || fatal_;
    std::string extra = message.str();
    std::fprintf(stdout, "%s:%d: Failure\n%s%s%s\n", file_, line_, text_.c_str(),
                 extra.empty() ? "" : "\n", extra.c_str());
    std::fflush(stdout);
  }

 private:
  const char* file_;
  int line_;
  std::string text_;
  bool fatal_;
};

// `--gtest_filter`: ':'-separated patterns with '*' and '?', then optionally '-' and patterns
// to leave out.
inline bool globMatch(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*') return globMatch(pattern + 1, text) || (*text && globMatch(pattern, text + 1));
  if (*text == '\0') return false;
  return (*pattern == '?' || *pattern == *text) && globMatch(pattern + 1, text + 1);
}
inline bool anyMatch(const std::string& patterns, const std::string& name) {
  std::stringstream list(patterns);
  for (std::string pattern; std::getline(list, pattern, ':');)
    if (!pattern.empty() && globMatch(pattern.c_str(), name.c_str())) return true;
  return false;
}
inline std::string& filter() {
  static std::string value = "*";
  return value;
}
inline bool& listOnly() {
  static bool value = false;
  return value;
}
inline bool selected(const std::string& name) {
  const std::string& f = filter();
  const size_t dash = f.find('-');
  const std::string positive = dash == std::string::npos ? f : f.substr(0, dash);
  const std::string negative = dash == std::string::npos ? "" : f.substr(dash + 1);
  return anyMatch(positive.empty() ? "*" : positive, name) && !anyMatch(negative, name);
}

}  // namespace internal

inline bool Test::HasFatalFailure() {
  std::lock_guard lock(internal::current().mutex);
  return internal::current().fatal;
}
inline bool Test::HasFailure() {
  std::lock_guard lock(internal::current().mutex);
  return internal::current().failed;
}

inline void InitGoogleTest(int* argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const char* arg = argv[i];
    if (std::strncmp(arg, "--gtest_filter=", 15) == 0) {
      internal::filter() = arg + 15;
    } else if (std::strcmp(arg, "--gtest_list_tests") == 0) {
      internal::listOnly() = true;
    } else if (std::strncmp(arg, "--gtest_", 8) != 0) {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
}

inline int RunAllTests() {
  using Clock = std::chrono::steady_clock;
  std::vector<const internal::Registered*> chosen;
  for (const auto& test : internal::registry())
    if (internal::selected(test.suite + "." + test.name)) chosen.push_back(&test);
  if (internal::listOnly()) {
    for (const auto* test : chosen) std::printf("%s.\n  %s\n", test->suite.c_str(), test->name.c_str());
    return 0;
  }
  std::printf("[==========] Running %zu tests (minigtest).\n", chosen.size());
  std::vector<std::string> failures;
  const auto start = Clock::now();
  for (const auto* test : chosen) {
    const std::string name = test->suite + "." + test->name;
    std::printf("[ RUN      ] %s\n", name.c_str());
    std::fflush(stdout);
    {
      std::lock_guard lock(internal::current().mutex);
      internal::current().failed = internal::current().fatal = false;
    }
    const auto began = Clock::now();
    std::unique_ptr<Test> instance(test->make());
    instance->SetUp();
    if (!Test::HasFatalFailure()) instance->TestBody();
    instance->TearDown();
    instance.reset();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began);
    const bool failed = Test::HasFailure();
    std::printf("%s %s (%lld ms)\n", failed ? "[  FAILED  ]" : "[       OK ]", name.c_str(),
                static_cast<long long>(ms.count()));
    std::fflush(stdout);
    if (failed) failures.push_back(name);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  std::printf("[==========] %zu tests ran. (%lld ms total)\n", chosen.size(),
              static_cast<long long>(ms.count()));
  std::printf("[  PASSED  ] %zu tests.\n", chosen.size() - failures.size());
  if (!failures.empty()) {
    std::printf("[  FAILED  ] %zu tests, listed below:\n", failures.size());
    for (const auto& name : failures) std::printf("[  FAILED  ] %s\n", name.c_str());
  }
  std::fflush(stdout);
  return failures.empty() ? 0 : 1;
}

}  // namespace testing

#define RUN_ALL_TESTS() ::testing::RunAllTests()

#define MINIGTEST_CLASS_(suite, name) suite##_##name##_Test
#define MINIGTEST_DEFINE_(suite, name, base)                                                  \
  class MINIGTEST_CLASS_(suite, name) : public base {                                         \
   public:                                                                                     \
    void TestBody() override;                                                                  \
  };                                                                                           \
  [[maybe_unused]] static const bool minigtest_registered_##suite##_##name =                   \
      ::testing::internal::registerTest(#suite, #name,                                         \
                                        [] { return new MINIGTEST_CLASS_(suite, name); });     \
  void MINIGTEST_CLASS_(suite, name)::TestBody()
#define TEST(suite, name) MINIGTEST_DEFINE_(suite, name, ::testing::Test)
#define TEST_F(fixture, name) MINIGTEST_DEFINE_(fixture, name, fixture)

// `switch (0) case 0: default:` keeps a user's `if (...) EXPECT_...; else ...` unambiguous.
#define MINIGTEST_CHECK_(result, fatal, on_failure)                                           \
  switch (0)                                                                                   \
  case 0:                                                                                      \
  default:                                                                                     \
    if (const ::testing::AssertionResult minigtest_result_ = (result))                        \
      ;                                                                                        \
    else                                                                                       \
      on_failure ::testing::internal::AssertHelper(__FILE__, __LINE__,                         \
                                                   minigtest_result_.message(), fatal) =       \
          ::testing::Message()
#define MINIGTEST_EXPECT_(result) MINIGTEST_CHECK_(result, false, )
#define MINIGTEST_ASSERT_(result) MINIGTEST_CHECK_(result, true, return)

#define MINIGTEST_CMP_(op, a, b)                                                     \
  ::testing::internal::compare(#op, #a, #b, a, b,                                    \
                               [](const auto& x, const auto& y) { return x op y; })

#define EXPECT_EQ(a, b) MINIGTEST_EXPECT_(MINIGTEST_CMP_(==, a, b))
#define EXPECT_NE(a, b) MINIGTEST_EXPECT_(MINIGTEST_CMP_(!=, a, b))
#define EXPECT_LT(a, b) MINIGTEST_EXPECT_(MINIGTEST_CMP_(<, a, b))
#define EXPECT_LE(a, b) MINIGTEST_EXPECT_(MINIGTEST_CMP_(<=, a, b))
#define EXPECT_GT(a, b) MINIGTEST_EXPECT_(MINIGTEST_CMP_(>, a, b))
#define EXPECT_GE(a, b) MINIGTEST_EXPECT_(MINIGTEST_CMP_(>=, a, b))
#define ASSERT_EQ(a, b) MINIGTEST_ASSERT_(MINIGTEST_CMP_(==, a, b))
#define ASSERT_NE(a, b) MINIGTEST_ASSERT_(MINIGTEST_CMP_(!=, a, b))
#define ASSERT_LT(a, b) MINIGTEST_ASSERT_(MINIGTEST_CMP_(<, a, b))
#define ASSERT_LE(a, b) MINIGTEST_ASSERT_(MINIGTEST_CMP_(<=, a, b))
#define ASSERT_GT(a, b) MINIGTEST_ASSERT_(MINIGTEST_CMP_(>, a, b))
#define ASSERT_GE(a, b) MINIGTEST_ASSERT_(MINIGTEST_CMP_(>=, a, b))
#define EXPECT_TRUE(c) MINIGTEST_EXPECT_(::testing::internal::isTrue(static_cast<bool>(c), #c, true))
#define EXPECT_FALSE(c) MINIGTEST_EXPECT_(::testing::internal::isTrue(static_cast<bool>(c), #c, false))
#define ASSERT_TRUE(c) MINIGTEST_ASSERT_(::testing::internal::isTrue(static_cast<bool>(c), #c, true))
#define ASSERT_FALSE(c) MINIGTEST_ASSERT_(::testing::internal::isTrue(static_cast<bool>(c), #c, false))
#define EXPECT_STREQ(a, b) MINIGTEST_EXPECT_(::testing::internal::compareStrings(#a, #b, a, b, true))
#define EXPECT_STRNE(a, b) MINIGTEST_EXPECT_(::testing::internal::compareStrings(#a, #b, a, b, false))
#define ASSERT_STREQ(a, b) MINIGTEST_ASSERT_(::testing::internal::compareStrings(#a, #b, a, b, true))
#define EXPECT_PRED_FORMAT2(pred, a, b) MINIGTEST_EXPECT_(pred(#a, #b, a, b))
#define ASSERT_PRED_FORMAT2(pred, a, b) MINIGTEST_ASSERT_(pred(#a, #b, a, b))
#define ADD_FAILURE() MINIGTEST_EXPECT_(::testing::AssertionFailure() << "Failed")
#define FAIL() MINIGTEST_ASSERT_(::testing::AssertionFailure() << "Failed")
