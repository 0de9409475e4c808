// The pieces of auth and request logging on their own: the token file's
// grammar, constant-time comparison, the loopback test behind the clear-text
// warning, and the request log line's format and quoting.
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/support/string_ref.h"
#include "gtest/gtest.h"
#include "server/observe/request_log.h"
#include "server/rpc/transport_security.h"
#include "server/state/auth.h"

namespace flce::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TokenFileTest, ParsesTenantsAdminsCommentsAndBlankLines) {
  absl::StatusOr<std::vector<TokenEntry>> entries =
      ParseTokenFile("# header\n\n  tok1 alice\ntok2\tbob admin  # trailing\r\n   \n", "tokens");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].token, "tok1");
  EXPECT_EQ((*entries)[0].principal.tenant, "alice");
  EXPECT_FALSE((*entries)[0].principal.admin);
  EXPECT_EQ((*entries)[1].token, "tok2");
  EXPECT_EQ((*entries)[1].principal.tenant, "bob");
  EXPECT_TRUE((*entries)[1].principal.admin);
}

TEST(TokenFileTest, MalformedLinesAreNamedWithoutTheirToken) {
  for (const char* text : {"ok alice\nsecret-only\n", "ok alice\nsecret-x bob root\n",
                           "ok alice\nsecret-x bob admin extra\n", "ok alice\nok bob\n"}) {
    absl::StatusOr<std::vector<TokenEntry>> entries = ParseTokenFile(text, "/etc/tokens");
    ASSERT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument) << text;
    std::string message(entries.status().message());
    EXPECT_THAT(message, HasSubstr("/etc/tokens:2:"));
    EXPECT_THAT(message, Not(HasSubstr("secret")));
    EXPECT_THAT(message, Not(HasSubstr("ok ")));
  }
}

TEST(TokenFileTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0", 2), "a"));
}

TEST(AuthenticatorTest, WithoutAFileEveryCallIsTheAnonymousAdmin) {
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create("");
  ASSERT_TRUE(auth.ok());
  std::multimap<grpc::string_ref, grpc::string_ref> none;
  absl::StatusOr<Principal> who = (*auth)->Authenticate(none);
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(who->tenant, "");
  EXPECT_TRUE(who->admin);
}

TEST(TransportSecurityTest, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3:0"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:50051"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.5:50051"));
}

TEST(RequestLogTest, OneKeyValueLineWithQuotedValues) {
  RequestLogLine line;
  line.id = "r1";
  line.rpc = "Compute";
  line.tenant = "alice";
  line.head = "demo";
  line.session = "run 1";
  line.tokens = 48;
  line.strategy = "chunked";
  line.kernels = "logits=stats_pingpong192_pairs rows=row_reference";
  line.transport = "messages_unix_socket";
  line.phases_ms = {{"setup", 0.25}, {"finish", 11.5}};
  line.input_wait_ms = 4.25;
  line.seconds = 0.0123456;
  line.code = "OK";
  EXPECT_EQ(FormatRequestLog(line),
            "request id=r1 rpc=Compute tenant=alice head=demo session=\"run 1\" tokens=48 "
            "strategy=chunked kernels=\"logits=stats_pingpong192_pairs rows=row_reference\" "
            "transport=messages_unix_socket setup_ms=0.250 finish_ms=11.500 "
            "input_wait_ms=4.250 duration_ms=12.346 code=OK");
  const auto fields = RequestLogFields(line);
  ASSERT_EQ(fields.size(), 14u);
  EXPECT_EQ(fields[7].first, "kernels");
  EXPECT_EQ(fields[8].first, "transport");
  EXPECT_EQ(fields[9].first, "setup_ms");
  EXPECT_EQ(fields[10].first, "finish_ms");
  EXPECT_DOUBLE_EQ(fields[10].second.get<double>(), 11.5);
  EXPECT_EQ(fields[11].first, "input_wait_ms");
  EXPECT_DOUBLE_EQ(fields[11].second.get<double>(), 4.25);
  EXPECT_EQ(fields[12].first, "duration_ms");
  line.input_wait_ms = -1.0;  // an engine that does not report it: no field
  EXPECT_EQ(FormatRequestLog(line).find("input_wait_ms"), std::string::npos);
  EXPECT_EQ(RequestLogFields(line).size(), 13u);
  RequestLogLine failed;
  failed.id = "#7";
  failed.rpc = "DescribeHead";
  failed.code = "NOT_FOUND";
  failed.message = "head_id \"x\" is not loaded\n";
  EXPECT_EQ(FormatRequestLog(failed),
            "request id=#7 rpc=DescribeHead duration_ms=0.000 code=NOT_FOUND "
            "message=\"head_id \\\"x\\\" is not loaded\\x0a\"");
  EXPECT_EQ(QuoteLogValue("a=b"), "\"a=b\"");
  EXPECT_EQ(QuoteLogValue(""), "\"\"");
}

}  // namespace
}  // namespace flce::server
