// Pieces of the server on their own: the outcome log's bound, hidden-row
// bookkeeping, --head-root resolution, and the status mapping.
#include <limits>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/wire_dtype.h"
#include "flce/v1/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/base/receive_buffers.h"
#include "server/base/status_mapping.h"
#include "server/flce_server.h"
#include "server/state/session_store.h"
#include "server/storage/head_loader.h"
#include "server/validate/hidden_rows_check.h"
#include "server/validate/request_fingerprint.h"
#include "server/validate/validation.h"

namespace flce::server {
namespace {

using ::testing::HasSubstr;

// One mapping for the server and the client: each wire dtype round-trips and
// its size is the engine's.
TEST(ProtoConvertTest, DTypesRoundTripAndUnspecifiedNamesTheField) {
  for (v1::DType wire : {v1::DTYPE_FP32, v1::DTYPE_FP16, v1::DTYPE_BF16}) {
    absl::StatusOr<DType> host = DTypeFromProto(wire, "dtype");
    ASSERT_TRUE(host.ok());
    EXPECT_EQ(DTypeToProto(*host), wire);
    EXPECT_EQ(WireDTypeSize(wire), DTypeSize(*host));
  }
  absl::StatusOr<DType> none = DTypeFromProto(v1::DTYPE_UNSPECIFIED, "hidden_dtype");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()), ::testing::HasSubstr("hidden_dtype"));
}

TEST(ParseGpusTest, CountsListsAndAll) {
  EngineConfig one;
  ASSERT_TRUE(ParseGpus("1", one).ok());
  EXPECT_TRUE(one.devices.empty());
  EXPECT_FALSE(one.all_devices);
  EngineConfig two;
  ASSERT_TRUE(ParseGpus("2", two).ok());
  EXPECT_EQ(two.devices, (std::vector<int>{0, 1}));
  EngineConfig list;
  ASSERT_TRUE(ParseGpus("1,3", list).ok());
  EXPECT_EQ(list.devices, (std::vector<int>{1, 3}));
  EngineConfig same;
  ASSERT_TRUE(ParseGpus("0,0", same).ok());
  EXPECT_EQ(same.devices, (std::vector<int>{0, 0}));
  EngineConfig single;
  EXPECT_FALSE(ParseGpus("2,", single).ok());
  EngineConfig all;
  ASSERT_TRUE(ParseGpus("all", all).ok());
  EXPECT_TRUE(all.all_devices);
  for (const char* bad : {"0", "-1", "", "two", "0,x", "1.5"}) {
    EngineConfig c;
    absl::Status st = ParseGpus(bad, c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("--gpus")) << bad;
  }
}

TEST(ParseGpusTest, SeveralGpusRefuseTheCpuEngine) {
  ServerConfig config;
  config.device = "cpu";
  config.gpus = "2";
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateEngine(config);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(engine.status().message()), HasSubstr("needs the CUDA engine"));
}

TEST(OutcomeLogTest, ForgetsOldestFinishedOutcomesButKeepsStagedOnes) {
  OutcomeLog log(3);
  log.Set("staged", Outcome{ContributionState::kStaged, 0.0f});
  log.Set("a", Outcome{ContributionState::kCommitted, 1.0f});
  log.Set("b", Outcome{ContributionState::kDiscarded, 0.0f});
  log.Set("c", Outcome{ContributionState::kCommitted, 2.0f});  // evicts "a", not "staged"
  EXPECT_NE(log.Find("staged"), nullptr);
  EXPECT_EQ(log.Find("a"), nullptr);
  ASSERT_NE(log.Find("c"), nullptr);
  EXPECT_EQ(log.Find("c")->scale, 2.0f);
  EXPECT_EQ(log.size(), 3u);
  // Updating an entry in place does not grow the log.
  log.Set("staged", Outcome{ContributionState::kCommitted, 0.5f});
  EXPECT_EQ(log.size(), 3u);
  log.Set("d", Outcome{ContributionState::kCommitted, 1.0f});  // now "staged" is the oldest
  EXPECT_EQ(log.Find("staged"), nullptr);
  EXPECT_NE(log.Find("b"), nullptr);
  log.Erase("b");
  EXPECT_EQ(log.Find("b"), nullptr);
  EXPECT_EQ(log.size(), 2u);
}

// An offset a client chose near INT64_MAX: refused, and its message computes no
// overflowing end (UBSan in the fuzz run caught the old one).
TEST(RowTrackerTest, HugeOffsetIsRefusedWithoutOverflow) {
  RowTracker rows(10, "hidden");
  absl::StatusOr<int64_t> n = rows.Accept(std::numeric_limits<int64_t>::max(), 8, 4);
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()),
              ::testing::HasSubstr("9223372036854775807 + 2) are outside [0, num_tokens = 10)"));
}

TEST(RowTrackerTest, AcceptsAnyOrderAndRejectsOverlapsAndGaps) {
  RowTracker rows(10, "hidden");
  EXPECT_EQ(*rows.Accept(6, 4 * 8, 8), 4);
  EXPECT_EQ(*rows.Accept(0, 3 * 8, 8), 3);
  absl::StatusOr<int64_t> overlap = rows.Accept(2, 2 * 8, 8);
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(overlap.status().message(), HasSubstr("rows [2, 4) overlap rows [0, 3)"));
  absl::StatusOr<int64_t> overlap_next = rows.Accept(5, 2 * 8, 8);
  EXPECT_THAT(overlap_next.status().message(), HasSubstr("overlap rows [6, 10)"));
  EXPECT_THAT(rows.CheckComplete().message(), HasSubstr("first missing row 3"));
  EXPECT_EQ(*rows.Accept(3, 3 * 8, 8), 3);
  EXPECT_TRUE(rows.CheckComplete().ok());
  EXPECT_FALSE(rows.Accept(-1, 8, 8).ok());
  EXPECT_FALSE(rows.Accept(0, 0, 8).ok());
}

// An id is echoed in the status message with its control characters escaped:
// a newline in it must not start a new line in a client's log.
// The one-pass check of arriving rows finds what the whole-message scan
// finds and sums the fingerprint HiddenFingerprint gives, in every dtype; a
// bad value stops it at its row.
TEST(HiddenRowsCheckTest, MatchesTheScanAndTheFingerprint) {
  constexpr int64_t kRows = 7, kHidden = 33;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t row_bytes = kHidden * DTypeSize(dtype);
    std::vector<float> values(kRows * kHidden);
    for (float& v : values) v = normal(rng);
    std::string bytes(kRows * row_bytes, '\0');
    FromFloat(dtype, values.data(), bytes.data(), kRows * kHidden);
    const HiddenRowsCheck clean = CheckHiddenRows(dtype, bytes.data(), kRows, kHidden, 40, true);
    EXPECT_EQ(clean.first_non_finite, -1);
    EXPECT_EQ(clean.fingerprint, HiddenFingerprint(bytes.data(), kRows, row_bytes, 40));
    EXPECT_NE(clean.fingerprint, HiddenFingerprint(bytes.data(), kRows, row_bytes, 41));
    EXPECT_EQ(CheckHiddenRows(dtype, bytes.data(), kRows, kHidden, 40, false).fingerprint, 0u);

    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> spoiled = values;
      spoiled[4 * kHidden + 29] = bad;
      spoiled[5 * kHidden + 2] = bad;  // a later one is not the first
      FromFloat(dtype, spoiled.data(), bytes.data(), kRows * kHidden);
      const HiddenRowsCheck check = CheckHiddenRows(dtype, bytes.data(), kRows, kHidden, 40, true);
      EXPECT_EQ(check.first_non_finite, 4 * kHidden + 29);
      EXPECT_EQ(check.first_non_finite, FirstNonFinite(dtype, bytes.data(), kRows * kHidden));
    }
  }
}

// A returned buffer serves the next frame of its size without a new
// allocation; small ones are not kept, nor any beyond the cap.
TEST(ReceiveBuffersTest, KeepsFramesForTheNextOnesWithinTheCap) {
  constexpr size_t kFrame = size_t{1} << 20;
  ReceiveBuffers buffers(3 * kFrame);
  std::string first = buffers.Take(kFrame);
  ASSERT_EQ(first.size(), kFrame);
  first[kFrame - 1] = 'x';
  const char* at = first.data();
  buffers.Return(std::move(first));
  EXPECT_EQ(buffers.kept_bytes(), kFrame);
  std::string again = buffers.Take(kFrame);
  EXPECT_EQ(again.data(), at);  // the same memory, not zero-filled anew
  EXPECT_EQ(again[kFrame - 1], 'x');
  EXPECT_EQ(buffers.kept_bytes(), 0u);

  std::string shorter = buffers.Take(kFrame / 2);  // nothing kept: a new one
  EXPECT_EQ(shorter.size(), kFrame / 2);
  buffers.Return(std::move(again));
  std::string cut = buffers.Take(kFrame / 2);  // a larger kept one serves a shorter frame
  EXPECT_EQ(cut.size(), kFrame / 2);
  EXPECT_EQ(cut.data(), at);

  buffers.Return(std::string(ReceiveBuffers::kMinBytes - 1, 'a'));
  EXPECT_EQ(buffers.kept_bytes(), 0u);  // too small to keep
  for (int i = 0; i < 4; ++i) buffers.Return(std::string(kFrame, 'b'));
  EXPECT_LE(buffers.kept_bytes(), 3 * kFrame);
  EXPECT_GE(buffers.kept_bytes(), 2 * kFrame);
}

TEST(ValidateIdTest, EchoesAControlCharacterEscaped) {
  absl::Status status = ValidateId("step-1\nINFO forged", "request_id");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "request_id \"step-1\\nINFO forged\" holds a control character");
}

TEST(ResolveUnderRootTest, AcceptsInsideAndRefusesOutside) {
  namespace fs = std::filesystem;
  fs::path base = fs::temp_directory_path() / absl::StrCat("flce-root-", getpid());
  fs::create_directories(base / "root" / "d");
  std::ofstream(base / "root" / "d" / "x") << "x";
  std::ofstream(base / "secret") << "s";
  std::string root = (base / "root").string();
  absl::StatusOr<std::string> inside = ResolveUnderRoot(root, "d/../d/x");
  ASSERT_TRUE(inside.ok()) << inside.status();
  EXPECT_EQ(*inside, fs::canonical(base / "root" / "d" / "x").string());
  EXPECT_EQ(ResolveUnderRoot(root, "../secret").status().code(),
            absl::StatusCode::kPermissionDenied);
  // A sibling whose name starts with the root's is still outside.
  fs::create_directories(base / "rootx");
  std::ofstream(base / "rootx" / "y") << "y";
  EXPECT_EQ(ResolveUnderRoot(root, (base / "rootx" / "y").string()).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ResolveUnderRoot(root, "d/missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ResolveUnderRoot("", "d/x").status().code(), absl::StatusCode::kFailedPrecondition);
  // A link out of the root: refused without saying where it leads.
  fs::create_symlink(base / "secret", base / "root" / "link");
  absl::Status linked = ResolveUnderRoot(root, "link").status();
  EXPECT_EQ(linked.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(linked.message()), ::testing::HasSubstr("\"link\""));
  EXPECT_THAT(std::string(linked.message()),
              ::testing::Not(::testing::HasSubstr(fs::canonical(base).string())));
  fs::remove_all(base);
}

TEST(StatusMappingTest, KeepsCodeAndMessage) {
  grpc::Status s = ToGrpcStatus(absl::ResourceExhaustedError("--max-pending=2"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "--max-pending=2");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(absl::PermissionDeniedError("x")).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::INVALID_ARGUMENT), "INVALID_ARGUMENT");
}

}  // namespace
}  // namespace flce::server
