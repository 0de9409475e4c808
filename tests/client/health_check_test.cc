#include "client/cpp/health_check.h"

#include <string>

#include "gtest/gtest.h"

namespace flce {
namespace {

TEST(HealthCheckTest, EncodesTheServiceAsField1) {
  EXPECT_EQ(EncodeHealthCheckRequest(""), "");
  EXPECT_EQ(EncodeHealthCheckRequest("flce.v1.Flce"), std::string("\x0a\x0c") + "flce.v1.Flce");
  const std::string long_name(200, 's');  // length needs a two-byte varint
  EXPECT_EQ(EncodeHealthCheckRequest(long_name), std::string("\x0a\xc8\x01") + long_name);
}

TEST(HealthCheckTest, DecodesTheStatus) {
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x01", 2)), HealthStatus::kServing);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x02", 2)), HealthStatus::kNotServing);
  EXPECT_EQ(*DecodeHealthCheckResponse(""), HealthStatus::kUnknown);  // proto3 default
}

TEST(HealthCheckTest, SkipsUnknownFields) {
  // field 2 string "ab", field 3 fixed32, field 4 fixed64, then status.
  std::string bytes(
      "\x12\x02"
      "ab"
      "\x1d\x01\x02\x03\x04"
      "\x21",
      10);
  bytes += std::string(8, '\x07');
  bytes += std::string("\x08\x02", 2);
  absl::StatusOr<HealthStatus> status = DecodeHealthCheckResponse(bytes);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, HealthStatus::kNotServing);
}

TEST(HealthCheckTest, RejectsMalformedBytes) {
  EXPECT_FALSE(DecodeHealthCheckResponse(std::string("\x08", 1)).ok());  // no value
  EXPECT_FALSE(DecodeHealthCheckResponse(std::string("\x12\x05"
                                                     "ab",
                                                     4))
                   .ok());                                                   // short
  EXPECT_FALSE(DecodeHealthCheckResponse(std::string("\x0b\x00", 2)).ok());  // group
}

TEST(HealthCheckTest, NamesStatuses) {
  EXPECT_STREQ(HealthStatusName(HealthStatus::kServing), "SERVING");
  EXPECT_STREQ(HealthStatusName(HealthStatus::kNotServing), "NOT_SERVING");
}

}  // namespace
}  // namespace flce
