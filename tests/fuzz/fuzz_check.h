// FUZZ_CHECK(cond, message parts...): an invariant of the code under test.
// When it does not hold, the input is a finding: the message goes to stderr
// and the process aborts, so that libFuzzer saves the input as a crash.
#ifndef FLCE_TESTS_FUZZ_FUZZ_CHECK_H_
#define FLCE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace flce::fuzz {

[[noreturn]] void InvariantBroken(const char* file, int line, const char* condition,
                                  const std::string& message);

}  // namespace flce::fuzz

#define FUZZ_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      ::flce::fuzz::InvariantBroken(__FILE__, __LINE__, #cond, ::absl::StrCat(__VA_ARGS__)); \
    }                                                                                        \
  } while (0)

#endif  // FLCE_TESTS_FUZZ_FUZZ_CHECK_H_
