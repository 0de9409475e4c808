// flce_fuzz_compute: libFuzzer entry point. The first byte of an input picks
// the target (fuzz_input.h): Compute calls through ComputeJob, or the
// validation functions on their own. scripts/fuzz.sh builds and runs it over
// tests/fuzz/corpus.
#include <cstddef>
#include <cstdint>

#include "server/observe/log.h"
#include "tests/fuzz/compute_job_target.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_server.h"
#include "tests/fuzz/validation_targets.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Request lines are info; libprotobuf's complaints about the fuzzer's
  // non-UTF-8 strings stay rate-limited like the server's.
  flce::server::SetLogQuiet(true);
  flce::server::InstallProtobufLogHandler();
  flce::fuzz::FuzzServer::Get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using flce::fuzz::FuzzTarget;
  flce::fuzz::FuzzInput input = flce::fuzz::ParseFuzzInput(data, size);
  switch (flce::fuzz::TargetOf(input.flags)) {
    case FuzzTarget::kComputeJob:
      flce::fuzz::RunComputeJobs(input);
      break;
    case FuzzTarget::kComputeSpec:
      flce::fuzz::RunComputeSpecChecks(input);
      break;
    case FuzzTarget::kRowTracker:
      flce::fuzz::RunRowTrackerChecks(input);
      break;
  }
  return 0;
}
