// A tiny test harness (no gtest offline): TEST registers a function, EXPECT_* macros count
// passes and failures and print file:line with the expected and the actual value, and
// RunAllTests() prints "N passed, N failed" and returns nonzero when anything failed.
#ifndef SPLITKV_TESTS_CC_TEST_CHECK_H_
#define SPLITKV_TESTS_CC_TEST_CHECK_H_

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

// The sanitizer a test binary runs under (GCC's __SANITIZE_*__, Clang's __has_feature), for
// tests that must skip or shorten what a sanitizer cannot run: 1 or 0.
#if defined(__SANITIZE_THREAD__)
#define SPLITKV_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SPLITKV_TEST_TSAN 1
#endif
#endif
#ifndef SPLITKV_TEST_TSAN
#define SPLITKV_TEST_TSAN 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SPLITKV_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPLITKV_TEST_ASAN 1
#endif
#endif
#ifndef SPLITKV_TEST_ASAN
#define SPLITKV_TEST_ASAN 0
#endif

namespace splitkv_test {

struct Tally {
  int64_t passed = 0;
  int64_t failed = 0;
};

inline Tally& Counts() {
  static Tally tally;
  return tally;
}

inline void Pass() { ++Counts().passed; }

inline void Fail(const char* file, int line, const std::string& what) {
  ++Counts().failed;
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
}

template <typename T>
std::string Show(const T& value) {
  std::ostringstream os;
  os.precision(10);
  os << value;
  return os.str();
}

inline std::string Show(const std::string& value) { return "\"" + value + "\""; }
inline std::string Show(const char* value) { return Show(std::string(value)); }

template <typename A, typename B, typename Cmp>
void ExpectCompare(const char* file, int line, const char* expr_a, const char* expr_b, const char* relation,
                   const A& a, const B& b, Cmp cmp) {
  if (cmp(a, b)) return Pass();
  Fail(file, line, std::string("expected ") + expr_a + " " + relation + " " + expr_b + ", got " + Show(a) + " and " +
                       Show(b));
}

template <typename E, typename G>
void ExpectEq(const char* file, int line, const char* expr_got, const E& expected, const G& got) {
  if (expected == got) return Pass();
  Fail(file, line, std::string(expr_got) + ": expected " + Show(expected) + ", got " + Show(got));
}

inline void ExpectNear(const char* file, int line, const char* expr_got, double expected, double got, double tol) {
  if (std::fabs(expected - got) <= tol) return Pass();
  Fail(file, line, std::string(expr_got) + ": expected " + Show(expected) + " (+/- " + Show(tol) + "), got " +
                       Show(got));
}

// One pass or one failure for a whole array: |got - expected| <= atol + rtol * |expected|
// everywhere; -inf must match -inf exactly; NaN never matches.
inline void ExpectAllClose(const char* file, int line, const std::string& what, const std::vector<double>& expected,
                           const std::vector<double>& got, double atol, double rtol) {
  if (expected.size() != got.size()) {
    return Fail(file, line, what + ": size: expected " + Show(expected.size()) + ", got " + Show(got.size()));
  }
  int64_t bad = 0, first_bad = -1;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = expected[i], g = got[i];
    bool ok;
    if (std::isinf(e) || std::isinf(g)) {
      ok = e == g;
    } else {
      const double err = std::fabs(e - g);
      ok = err <= atol + rtol * std::fabs(e);  // false for NaN
      if (!(err <= worst)) worst = err;
    }
    if (!ok) {
      if (first_bad < 0) first_bad = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return Pass();
  Fail(file, line, what + ": " + Show(bad) + " of " + Show(got.size()) + " elements differ (atol " + Show(atol) +
                       ", rtol " + Show(rtol) + "); first at index " + Show(first_bad) + ": expected " +
                       Show(expected[first_bad]) + ", got " + Show(got[first_bad]) + "; max abs error " + Show(worst));
}

// Runs `statement`; passes when it throws E whose what() contains every substring.
// Returns the message (empty when nothing of type E was thrown).
template <typename E>
std::string ExpectThrows(const char* file, int line, const char* expr, const std::function<void()>& statement,
                         const std::vector<std::string>& substrings) {
  try {
    statement();
  } catch (const E& error) {
    const std::string message = error.what();
    for (const std::string& s : substrings) {
      if (message.find(s) == std::string::npos) {
        Fail(file, line, std::string(expr) + ": message lacks " + Show(s) + ": got " + Show(message));
        return message;
      }
    }
    Pass();
    return message;
  } catch (const std::exception& other) {
    Fail(file, line, std::string(expr) + ": expected " + typeid(E).name() + ", got " + typeid(other).name() +
                         ": " + other.what());
    return "";
  }
  Fail(file, line, std::string(expr) + ": expected an exception " + typeid(E).name() + ", got none");
  return "";
}

// Test registry.
struct TestCase {
  const char* name;
  void (*run)();
};

inline std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* name, void (*run)()) { Registry().push_back({name, run}); }
};

// Runs every registered test (an exception escaping a test counts as one failure) and
// prints the tally. Returns the process exit code.
inline int RunAllTests() {
  for (const TestCase& test : Registry()) {
    const int64_t failed_before = Counts().failed;
    const auto start = std::chrono::steady_clock::now();
    std::fprintf(stderr, "[ RUN  ] %s\n", test.name);
    try {
      test.run();
    } catch (const std::exception& error) {
      Fail(test.name, 0, std::string("unexpected exception: ") + error.what());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "[ %s ] %s (%.0f ms)\n", Counts().failed == failed_before ? " OK " : "FAIL", test.name, ms);
  }
  std::printf("%lld passed, %lld failed\n", static_cast<long long>(Counts().passed),
              static_cast<long long>(Counts().failed));
  return Counts().failed == 0 ? 0 : 1;
}

}  // namespace splitkv_test

#define TEST(name)                                                                     \
  static void name();                                                                  \
  static const ::splitkv_test::Registrar name##_registrar(#name, &name); /* NOLINT */ \
  static void name()

#define EXPECT_TRUE(cond) \
  ((cond) ? ::splitkv_test::Pass() : ::splitkv_test::Fail(__FILE__, __LINE__, "expected true: " #cond ", got false"))
#define EXPECT_EQ(expected, got) ::splitkv_test::ExpectEq(__FILE__, __LINE__, #got, (expected), (got))
#define EXPECT_NEAR(expected, got, tol) ::splitkv_test::ExpectNear(__FILE__, __LINE__, #got, (expected), (got), (tol))
#define EXPECT_LE(a, b) \
  ::splitkv_test::ExpectCompare(__FILE__, __LINE__, #a, #b, "<=", (a), (b), [](const auto& x, const auto& y) { return x <= y; })
#define EXPECT_LT(a, b) \
  ::splitkv_test::ExpectCompare(__FILE__, __LINE__, #a, #b, "<", (a), (b), [](const auto& x, const auto& y) { return x < y; })
#define EXPECT_GT(a, b) \
  ::splitkv_test::ExpectCompare(__FILE__, __LINE__, #a, #b, ">", (a), (b), [](const auto& x, const auto& y) { return x > y; })
#define EXPECT_GE(a, b) \
  ::splitkv_test::ExpectCompare(__FILE__, __LINE__, #a, #b, ">=", (a), (b), [](const auto& x, const auto& y) { return x >= y; })
#define EXPECT_ALLCLOSE(what, expected, got, atol, rtol) \
  ::splitkv_test::ExpectAllClose(__FILE__, __LINE__, (what), (expected), (got), (atol), (rtol))
// EXPECT_THROWS(Type, statement, "substring", ...): evaluates to the message.
#define EXPECT_THROWS(Type, statement, ...) \
  ::splitkv_test::ExpectThrows<Type>(__FILE__, __LINE__, #statement, [&] { statement; }, \
                                     std::vector<std::string>{__VA_ARGS__})

#endif  // SPLITKV_TESTS_CC_TEST_CHECK_H_
