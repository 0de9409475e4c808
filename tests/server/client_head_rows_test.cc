// The C++ client's DownloadHead, Embed and EmbedGrad (flce::Client) against
// an in-process server on the CPU engine: what comes back is the uploaded
// weight and bias byte for byte, rows of ids are the weight's rows in the
// order asked (several messages), an embedding gradient lands where its ids
// say, and bad input is refused with the server's or the client's reason.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace flce::server::test {
namespace {

using ::testing::HasSubstr;

class ClientHeadRowsTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer(TestConfig());
    ProblemSpec ps = TinyF32Spec();
    ps.has_bias = true;
    problem_ = MakeProblem(ps);
    ASSERT_TRUE(UploadHead(stub(), "h", problem_).ok());
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", server().port());
    options.timeout = absl::Seconds(20);
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  std::string WeightRow(int64_t row) const {
    const int64_t bytes = problem_.spec.hidden_size * 4;
    return problem_.weight_bytes.substr(row * bytes, bytes);
  }

  Problem problem_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientHeadRowsTest, DownloadHeadGivesBackTheUploadedBytes) {
  auto head = client_->DownloadHead("h", /*master=*/false, /*chunk_rows=*/7);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->header.head().vocab_size(), problem_.spec.vocab_size);
  EXPECT_EQ(head->header.dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(head->weight, problem_.weight_bytes);
  EXPECT_EQ(head->bias, problem_.bias_bytes);
  EXPECT_EQ(client_->DownloadHead("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientHeadRowsTest, EmbedReturnsTheRowsOfTheIdsInOrder) {
  const int32_t last = static_cast<int32_t>(problem_.spec.vocab_size - 1);
  EmbedArgs args;
  args.head_id = "h";
  args.token_ids = {3, 0, 3, last};
  args.chunk_rows = 1;  // one message per row
  auto rows = client_->Embed(args);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->header.hidden_size(), problem_.spec.hidden_size);
  EXPECT_EQ(rows->rows, WeightRow(3) + WeightRow(0) + WeightRow(3) + WeightRow(last));
  args.token_ids = {1, static_cast<int32_t>(problem_.spec.vocab_size)};
  auto outside = client_->Embed(args);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument) << outside.status();
}

TEST_F(ClientHeadRowsTest, EmbedGradLandsWhereItsIdsSay) {
  const int64_t h = problem_.spec.hidden_size;
  std::vector<float> grad(3 * h);
  for (int64_t i = 0; i < 3 * h; ++i) grad[i] = 0.25f * static_cast<float>(i % 7 + 1);
  EmbedGradArgs args;
  args.header.set_head_id("h");
  args.header.set_session_id("s");
  args.header.set_dtype(v1::DTYPE_FP32);
  args.header.set_deterministic(true);
  args.token_ids = {2, 5, 2};
  args.rows = absl::string_view(reinterpret_cast<const char*>(grad.data()), grad.size() * 4);
  args.chunk_bytes = h * 4;  // one row per message
  auto summary = client_->EmbedGrad(args);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->committed());
  EXPECT_EQ(summary->rows_applied(), 3);

  FetchGradArgs fetch;
  fetch.head_id = "h";
  fetch.session_id = "s";
  auto fetched = client_->FetchGrad(fetch);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  std::vector<float> w(problem_.spec.vocab_size * h);
  std::memcpy(w.data(), fetched->weight.data(), fetched->weight.size());
  for (int64_t v = 0; v < problem_.spec.vocab_size; ++v) {
    for (int64_t j = 0; j < h; ++j) {
      const float want = v == 2 ? grad[j] + grad[2 * h + j] : v == 5 ? grad[h + j] : 0.0f;
      ASSERT_EQ(w[v * h + j], want) << "row " << v << " column " << j;
    }
  }

  args.rows = args.rows.substr(0, args.rows.size() - 4);  // not whole rows
  auto ragged = client_->EmbedGrad(args);
  EXPECT_EQ(ragged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ragged.status().message()), HasSubstr("not whole rows"));
}

}  // namespace
}  // namespace flce::server::test
