// flce::Client against an in-process fake of the service that can break the
// protocol on purpose: the client must place chunks by offset, refuse
// repeated or missing rows instead of passing zeros on, cut uploads to fit
// a message, keep the server's status code and message, and speak
// grpc.health.v1 to gRPC's own health service.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/cpp/client.h"
#include "flce/v1/message_size.h"
#include "gtest/gtest.h"

namespace flce {
namespace {

enum class Mode { kGood, kDuplicateRow, kMissingRows, kNoSummary, kReject };

class FakeFlce final : public v1::Flce::Service {
 public:
  Mode mode = Mode::kGood;
  std::mutex mu;
  v1::ComputeHeader last_header;
  std::vector<int64_t> hidden_offsets;
  int64_t end_tokens = -1;  // what the end message said
  std::vector<v1::UploadHeadRequest> uploads;
  int64_t max_message_bytes = 0;  // GetServerInfo's; 0 = UNIMPLEMENTED
  int server_info_calls = 0;

  grpc::Status GetServerInfo(grpc::ServerContext*, const v1::ServerInfoRequest*,
                             v1::ServerInfo* info) override {
    std::lock_guard<std::mutex> lock(mu);
    ++server_info_calls;
    if (max_message_bytes == 0) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "");
    info->set_max_message_bytes(max_message_bytes);
    return grpc::Status::OK;
  }

  grpc::Status Compute(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ComputeResponse, v1::ComputeRequest>* stream) override {
    v1::ComputeRequest request;
    if (!stream->Read(&request) || !request.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no header");
    }
    const v1::ComputeHeader header = request.header();
    {
      std::lock_guard<std::mutex> lock(mu);
      last_header = header;
      hidden_offsets.clear();
    }
    if (mode == Mode::kReject) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "targets[3] = 99 is outside [0, 7)");
    }
    const int64_t tokens = header.num_tokens();
    std::string hidden;
    bool ended = false;
    while (stream->Read(&request)) {
      std::lock_guard<std::mutex> lock(mu);
      if (ended) {  // as the real server: the end message is the last one
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "a message after the end message: nothing landed");
      }
      if (request.has_end()) {
        ended = true;
        end_tokens = request.end().num_tokens();
        continue;
      }
      hidden_offsets.push_back(request.hidden().token_offset());
      hidden += request.hidden().data();  // the client sends in order
    }
    if (!ended) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no end message");
    }
    const int64_t row = hidden.size() / tokens;
    // grad_input := hidden, second half first: placement must go by offset.
    const int64_t half = tokens / 2;
    auto send_rows = [&](int64_t begin, int64_t count) {
      v1::ComputeResponse response;
      v1::GradInputChunk* chunk = response.mutable_grad_input();
      chunk->set_token_offset(begin);
      chunk->set_num_tokens(count);
      chunk->set_data(hidden.substr(begin * row, count * row));
      stream->Write(response);
    };
    send_rows(half, tokens - half);
    if (mode != Mode::kMissingRows) send_rows(0, half);
    if (mode == Mode::kDuplicateRow) send_rows(0, 1);
    if (header.outputs().per_token_loss()) {
      v1::ComputeResponse response;
      v1::TokenOutputsChunk* chunk = response.mutable_token_outputs();
      chunk->set_token_offset(0);
      chunk->set_num_tokens(tokens);
      std::vector<float> loss(tokens);
      for (int64_t t = 0; t < tokens; ++t) loss[t] = 0.5f * t;
      chunk->set_loss(loss.data(), tokens * 4);
      stream->Write(response);
    }
    if (mode != Mode::kNoSummary) {
      v1::ComputeResponse response;
      response.mutable_summary()->set_loss(1.25);
      response.mutable_summary()->set_n_valid(tokens);
      stream->Write(response);
    }
    return grpc::Status::OK;
  }

  grpc::Status UploadHead(grpc::ServerContext*, grpc::ServerReader<v1::UploadHeadRequest>* reader,
                          v1::HeadInfo* info) override {
    v1::UploadHeadRequest request;
    int64_t bytes = 0;
    std::lock_guard<std::mutex> lock(mu);
    uploads.clear();
    while (reader->Read(&request)) {
      uploads.push_back(request);
      if (request.has_chunk()) bytes += request.chunk().data().size();
    }
    info->set_head_id(uploads.empty() ? "" : uploads[0].header().head_id());
    info->set_weight_bytes(bytes);
    return grpc::Status::OK;
  }

  grpc::Status FetchGrad(grpc::ServerContext*, const v1::FetchGradRequest* request,
                         grpc::ServerWriter<v1::FetchGradResponse>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      last_fetch = *request;
    }
    v1::FetchGradResponse response;
    v1::GradHeader* header = response.mutable_header();
    header->set_vocab_size(3);
    header->set_hidden_size(2);
    header->set_dtype(v1::DTYPE_FP32);
    header->set_has_bias(true);
    writer->Write(response);
    // Rows 2, then 0..1; bias in one piece. Values: row r, column c = 10r + c.
    for (auto [begin, count] : {std::pair<int, int>{2, 1}, {0, 2}}) {
      if (mode == Mode::kMissingRows && begin == 0) continue;
      v1::FetchGradResponse chunk_response;
      v1::GradChunk* chunk = chunk_response.mutable_chunk();
      chunk->set_role(v1::TENSOR_WEIGHT);
      chunk->set_row_offset(begin);
      chunk->set_rows(count);
      std::vector<float> values;
      for (int r = begin; r < begin + count; ++r) {
        for (int c = 0; c < 2; ++c) values.push_back(10.0f * r + c);
      }
      chunk->set_data(values.data(), values.size() * 4);
      writer->Write(chunk_response);
    }
    v1::FetchGradResponse bias_response;
    v1::GradChunk* bias = bias_response.mutable_chunk();
    bias->set_role(v1::TENSOR_BIAS);
    bias->set_row_offset(0);
    bias->set_rows(3);
    const float b[3] = {-1.0f, -2.0f, -3.0f};
    bias->set_data(b, sizeof(b));
    writer->Write(bias_response);
    return grpc::Status::OK;
  }

  grpc::Status DescribeHead(grpc::ServerContext*, const v1::DescribeHeadRequest* request,
                            v1::HeadInfo*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "head '" + request->head_id() + "' is not loaded");
  }

  v1::FetchGradRequest last_fetch;
};

class ClientProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ClientOptions options;
    options.target = "127.0.0.1:" + std::to_string(port);
    options.timeout = absl::Seconds(20);
    options.chunk_bytes = 1000;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  void TearDown() override { server_->Shutdown(); }

  ComputeArgs Args(int64_t tokens, int64_t hidden_size) {
    hidden_.resize(tokens * hidden_size * 2);
    for (size_t i = 0; i < hidden_.size(); ++i) hidden_[i] = static_cast<char>(i * 7 + 3);
    ComputeArgs args;
    args.header.set_head_id("h");
    args.header.set_session_id("s");
    args.header.set_hidden_dtype(v1::DTYPE_BF16);
    args.targets.assign(tokens, 1);
    args.hidden = hidden_;
    return args;
  }

  FakeFlce fake_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
  std::string hidden_;
};

TEST_F(ClientProtocolTest, ComputePlacesChunksByOffsetAndChunksHidden) {
  ComputeArgs args = Args(/*tokens=*/37, /*hidden_size=*/24);  // 48-byte rows
  args.header.mutable_outputs()->set_per_token_loss(true);
  int64_t progress_calls = 0, last_done = 0;
  args.progress = [&](int64_t done, int64_t total) {
    ++progress_calls;
    last_done = done;
    EXPECT_EQ(total, static_cast<int64_t>(hidden_.size()));
  };
  absl::StatusOr<ComputeOutcome> out = client_->Compute(args);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->grad_input, hidden_);
  EXPECT_DOUBLE_EQ(out->summary.loss(), 1.25);
  ASSERT_EQ(out->per_token_loss.size(), 37u);
  EXPECT_FLOAT_EQ(out->per_token_loss[36], 18.0f);
  // 1000-byte chunks hold 20 rows of 48 bytes.
  EXPECT_EQ(fake_.hidden_offsets, (std::vector<int64_t>{0, 20}));
  EXPECT_EQ(fake_.end_tokens, 37) << "the end message closes every call";
  EXPECT_EQ(progress_calls, 2);
  EXPECT_EQ(last_done, static_cast<int64_t>(hidden_.size()));
  // Targets and count travel in the header; a fresh 32-hex-digit id is made.
  EXPECT_EQ(fake_.last_header.num_tokens(), 37);
  EXPECT_EQ(fake_.last_header.targets().size(), 37u * 4);
  EXPECT_EQ(fake_.last_header.request_id().size(), 32u);
  EXPECT_EQ(out->request_id, fake_.last_header.request_id());
}

// A caller's storage (any contents, any length within its capacity) becomes
// the outcome's grad_input: the same heap buffer, filled with exactly the
// server's rows.
TEST_F(ClientProtocolTest, ComputeReusesTheCallersGradInputStorage) {
  ComputeArgs args = Args(/*tokens=*/37, /*hidden_size=*/24);
  for (size_t garbage : {hidden_.size() + 100, size_t{10}}) {
    std::string storage(hidden_.size() + 100, 'x');
    storage.resize(garbage);
    const char* buffer = storage.data();
    args.grad_input_storage = &storage;
    absl::StatusOr<ComputeOutcome> out = client_->Compute(args);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->grad_input, hidden_);
    EXPECT_EQ(out->grad_input.data(), buffer);
    EXPECT_TRUE(storage.empty());
  }
}

TEST_F(ClientProtocolTest, ComputeSendsHiddenSize) {
  ASSERT_TRUE(client_->Compute(Args(/*tokens=*/5, /*hidden_size=*/24)).ok());
  EXPECT_EQ(fake_.last_header.hidden_size(), 24);
}

// A server whose --max-message-mb is below the client's chunk size would
// refuse the chunks with gRPC's own message: the client cuts to fit it.
TEST_F(ClientProtocolTest, ChunksFitTheServersMessageLimitAskedOnce) {
  fake_.max_message_bytes = kMessageOverhead + 96000;  // 2000 rows of 48 bytes
  // The first call asks whether the server offers shared memory; that one
  // answer also gives the message limit.
  ASSERT_TRUE(client_->Compute(Args(/*tokens=*/37, /*hidden_size=*/24)).ok());
  EXPECT_EQ(fake_.server_info_calls, 1);
  ComputeArgs args = Args(/*tokens=*/5000, /*hidden_size=*/24);  // 48-byte rows
  args.chunk_bytes = 200000;
  ASSERT_TRUE(client_->Compute(args).ok());
  EXPECT_EQ(fake_.hidden_offsets, (std::vector<int64_t>{0, 2000, 4000}));
  ASSERT_TRUE(client_->Compute(args).ok());
  EXPECT_EQ(fake_.server_info_calls, 1);
}

TEST_F(ClientProtocolTest, ComputeKeepsTheCallersRequestIdAndMakesFreshOnes) {
  ComputeArgs args = Args(4, 8);
  args.header.set_request_id("mine");
  ASSERT_TRUE(client_->Compute(args).ok());
  EXPECT_EQ(fake_.last_header.request_id(), "mine");
  args.header.clear_request_id();
  absl::StatusOr<ComputeOutcome> a = client_->Compute(args);
  absl::StatusOr<ComputeOutcome> b = client_->Compute(args);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->request_id, b->request_id);
}

TEST_F(ClientProtocolTest, ComputeRefusesARepeatedRow) {
  fake_.mode = Mode::kDuplicateRow;
  absl::StatusOr<ComputeOutcome> out = client_->Compute(Args(10, 8));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal) << out.status();
  EXPECT_NE(out.status().message().find("twice"), absl::string_view::npos);
}

TEST_F(ClientProtocolTest, ComputeRefusesMissingRowsAndAMissingSummary) {
  fake_.mode = Mode::kMissingRows;
  absl::StatusOr<ComputeOutcome> out = client_->Compute(Args(10, 8));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
  EXPECT_NE(out.status().message().find("first missing: 0"), absl::string_view::npos)
      << out.status();
  fake_.mode = Mode::kNoSummary;
  out = client_->Compute(Args(10, 8));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
}

TEST_F(ClientProtocolTest, ServerErrorsKeepTheirCodeAndMessage) {
  fake_.mode = Mode::kReject;
  // Big enough that the writer is still sending when the server answers.
  absl::StatusOr<ComputeOutcome> out = client_->Compute(Args(20000, 64));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "targets[3] = 99 is outside [0, 7)");
  absl::StatusOr<v1::HeadInfo> head = client_->DescribeHead("nope");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(head.status().message(), "head 'nope' is not loaded");
}

TEST_F(ClientProtocolTest, ComputeRejectsHiddenThatIsNotWholeRows) {
  ComputeArgs args = Args(4, 8);
  args.hidden = absl::string_view(hidden_).substr(1);
  EXPECT_EQ(client_->Compute(args).status().code(), absl::StatusCode::kInvalidArgument);
  args.targets.clear();
  EXPECT_EQ(client_->Compute(args).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientProtocolTest, UploadCutsChunksThatFitAndSendsThemInOrder) {
  std::string weight(5003 * 2 * 2, '\0');  // V=5003, H=2, bf16: 20012 bytes
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = static_cast<char>(i);
  const std::string bias(5003 * 2, 'b');
  HeadUpload upload{"h1", 5003, 2, v1::DTYPE_BF16, weight, bias};
  int64_t last_done = 0;
  absl::StatusOr<v1::HeadInfo> info =
      client_->UploadHead(upload, [&](int64_t done, int64_t) { last_done = done; });
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->head_id(), "h1");
  EXPECT_EQ(info->weight_bytes(), static_cast<int64_t>(weight.size() + bias.size()));
  EXPECT_EQ(last_done, info->weight_bytes());
  ASSERT_TRUE(fake_.uploads[0].has_header());
  EXPECT_TRUE(fake_.uploads[0].header().has_bias());
  std::string weight_back, bias_back;
  for (size_t i = 1; i < fake_.uploads.size(); ++i) {
    const v1::TensorChunk& chunk = fake_.uploads[i].chunk();
    EXPECT_LE(chunk.data().size(), 1000u);
    std::string& back = chunk.role() == v1::TENSOR_WEIGHT ? weight_back : bias_back;
    EXPECT_EQ(chunk.byte_offset(), static_cast<int64_t>(back.size()));  // in order, no gaps
    back += chunk.data();
  }
  EXPECT_EQ(weight_back, weight);
  EXPECT_EQ(bias_back, bias);
}

TEST_F(ClientProtocolTest, UploadRejectsBytesThatDoNotMatchTheShape) {
  const std::string weight(10, '\0');
  HeadUpload upload{"h1", 3, 2, v1::DTYPE_FP32, weight, {}};
  absl::StatusOr<v1::HeadInfo> info = client_->UploadHead(upload);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(fake_.uploads.empty());  // nothing travelled
}

TEST_F(ClientProtocolTest, FetchGradAssemblesRowsAndBias) {
  FetchGradArgs args;
  args.head_id = "h";
  args.session_id = "s";
  args.reset = true;
  absl::StatusOr<FetchedGrad> grad = client_->FetchGrad(args);
  ASSERT_TRUE(grad.ok()) << grad.status();
  std::vector<float> w(6), b(3);
  ASSERT_EQ(grad->weight.size(), 24u);
  std::memcpy(w.data(), grad->weight.data(), 24);
  std::memcpy(b.data(), grad->bias.data(), 12);
  EXPECT_EQ(w, (std::vector<float>{0, 1, 10, 11, 20, 21}));
  EXPECT_EQ(b, (std::vector<float>{-1, -2, -3}));
  // A reset without an id gets one, so that a retry cannot reset twice.
  EXPECT_EQ(fake_.last_fetch.request_id().size(), 32u);
  EXPECT_EQ(grad->request_id, fake_.last_fetch.request_id());
}

TEST_F(ClientProtocolTest, FetchGradRefusesMissingRows) {
  fake_.mode = Mode::kMissingRows;
  absl::StatusOr<FetchedGrad> grad = client_->FetchGrad({"h", "s"});
  EXPECT_EQ(grad.status().code(), absl::StatusCode::kDataLoss) << grad.status();
}

TEST_F(ClientProtocolTest, HealthSpeaksToGrpcsOwnHealthService) {
  absl::StatusOr<HealthStatus> status = client_->Health();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, HealthStatus::kServing);
  server_->GetHealthCheckService()->SetServingStatus("flce.v1.Flce", false);
  status = client_->Health("flce.v1.Flce");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, HealthStatus::kNotServing);
  EXPECT_EQ(client_->Health("unknown.Service").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace flce
