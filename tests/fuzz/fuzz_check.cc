#include "tests/fuzz/fuzz_check.h"

#include <cstdio>
#include <cstdlib>

namespace flce::fuzz {

void InvariantBroken(const char* file, int line, const char* condition,
                     const std::string& message) {
  std::fprintf(stderr, "\nflce fuzz: invariant broken at %s:%d: %s\n  %s\n", file, line, condition,
               message.c_str());
  std::abort();
}

}  // namespace flce::fuzz
