// An in-process flce server on 127.0.0.1 (CPU engine, free port) and blocking
// client helpers over the generated stubs, shared by the server suites.
//
// Usage:
//   class MyTest : public ServerTest {};
//   TEST_F(MyTest, X) {
//     StartServer(TestConfig());
//     Problem p = MakeProblem(ps);
//     ASSERT_TRUE(UploadHead(stub(), "h", p).ok());
//     ComputeOutcome out = Compute(stub(), MakeHeader(p, "h", "s", "r1"), p);
//   }
#ifndef FLCE_TESTS_SERVER_SERVER_TEST_UTIL_H_
#define FLCE_TESTS_SERVER_SERVER_TEST_UTIL_H_

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flce/v1/flce.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/base/server_config.h"
#include "server/flce_server.h"
#include "tests/support/problem.h"

namespace flce::server::test {

using ::flce::test::Problem;
using ::flce::test::ProblemSpec;

// 127.0.0.1:0, no metrics port, no demo head, 2 engine threads.
ServerConfig TestConfig();

class ServerTest : public ::testing::Test {
 protected:
  void StartServer(const ServerConfig& config);
  // With an engine made by the test (nullptr: config.device's engine).
  void StartServer(const ServerConfig& config, std::unique_ptr<Engine> engine);
  void TearDown() override;
  v1::Flce::Stub& stub() { return *stub_; }
  FlceServer& server() { return *server_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

 private:
  std::unique_ptr<FlceServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Flce::Stub> stub_;
};

// Uploads a problem's weight (and bias) in `chunks` messages.
// token: a bearer token to send (servers with --auth-token-file).
grpc::Status UploadHead(v1::Flce::Stub& stub, const std::string& head_id, const Problem& problem,
                        int chunks = 3, v1::HeadInfo* info = nullptr,
                        const std::string& token = "");

// A header for the whole problem: targets, hidden dtype, sum reduction.
v1::ComputeHeader MakeHeader(const Problem& problem, const std::string& head_id,
                             const std::string& session_id, const std::string& request_id);

struct ComputeOutcome {
  grpc::Status status;
  v1::ComputeSummary summary;
  bool has_summary = false;
  std::vector<float> grad_input;  // fp32 hidden only: BT x H (NaN where not sent)
  int grad_messages = 0;
  int64_t grad_rows = 0;
  std::vector<v1::TokenOutputsChunk> token_outputs;
};

struct ComputeOptions {
  int64_t rows_per_chunk = 7;
  bool shuffle = true;
  // Called after this many chunks were written (-1: never); the rest follow.
  int pause_after_chunks = -1;
  std::function<void()> on_pause;
  // Stop after the pause instead of sending the rest (no WritesDone).
  bool cancel_at_pause = false;
  // The end-of-input message after the last chunk (without it nothing lands).
  bool send_end = true;
  std::chrono::milliseconds deadline{30000};
};

// Sends the header and the problem's hidden bytes in chunks, reads
// everything back on a second thread.
ComputeOutcome Compute(v1::Flce::Stub& stub, const v1::ComputeHeader& header,
                       const Problem& problem, const ComputeOptions& options = {});

// Sends exactly these messages (an end-of-input message only if one is
// among them), then closes; reads everything back.
ComputeOutcome ComputeMessages(v1::Flce::Stub& stub,
                               const std::vector<v1::ComputeRequest>& messages);

v1::ComputeRequest HeaderMessage(const v1::ComputeHeader& header);
v1::ComputeRequest HiddenMessage(int64_t token_offset, std::string data);
v1::ComputeRequest EndMessage(int64_t num_tokens);

struct FetchedGrad {
  grpc::Status status;
  v1::GradHeader header;
  std::vector<float> weight;  // V x H
  std::vector<float> bias;    // V, when the head has one
  int chunks = 0;
};

FetchedGrad FetchGrad(v1::Flce::Stub& stub, const std::string& head_id,
                      const std::string& session_id, bool reset = false,
                      const std::string& request_id = "", v1::DType dtype = v1::DTYPE_FP32,
                      int64_t chunk_rows = 0);

// DownloadHead: the weight (and bias) as floats, widened from the chunks' dtype.
struct DownloadedHead {
  grpc::Status status;
  v1::DownloadHeader header;
  std::vector<float> weight;  // V x H (NaN where no chunk arrived)
  std::vector<float> bias;    // V, when the head has one
  int chunks = 0;
};

DownloadedHead DownloadHead(v1::Flce::Stub& stub, const std::string& head_id, bool master = false,
                            int64_t chunk_rows = 0);

// Step with the given learning rate and nothing else set.
grpc::Status StepHead(v1::Flce::Stub& stub, const std::string& head_id,
                      const std::string& session_id, const std::string& request_id, double lr,
                      v1::StepResponse* response);

grpc::Status CreateOptimizer(v1::Flce::Stub& stub, const v1::CreateOptimizerRequest& request,
                             v1::OptimizerInfo* info = nullptr);

grpc::Status Commit(v1::Flce::Stub& stub, const std::string& head_id, const std::string& session_id,
                    const std::string& request_id, float scale, bool discard,
                    v1::CommitResponse* response = nullptr);

// Waits (up to 5 s) until the session shows `pending` staged contributions:
// proof that the server holds a call, not just the client's buffers.
bool WaitForPending(v1::Flce::Stub& stub, const std::string& session_id, int64_t pending);
// Until the server lists the session (5 s at most).
bool WaitForSession(v1::Flce::Stub& stub, const std::string& session_id);

std::vector<double> Doubles(const std::vector<float>& values);
std::vector<double> Scaled(const std::vector<double>& values, double scale);

// Raw request messages on a (possibly streaming) method through the generic
// stub, then a half-close; every response message concatenated into
// *response. Bytes need not parse: that is what it is for.
grpc::Status RawStream(grpc::Channel* channel, const std::string& method,
                       const std::vector<std::string>& requests, std::string* response);

// V=97, H=16, 20 tokens, fp32 head and hidden: the small problem of the
// suites that check what a call leaves behind.
ProblemSpec TinyF32Spec();

// A free TCP port on 127.0.0.1 (bound and released).
int FreePort();

// Nothing of any call landed in (head_id, session): no session, or one
// with no contribution.
void ExpectNoContribution(v1::Flce::Stub& stub, const std::string& head_id,
                          const std::string& session_id);

// The value of the sample whose name-and-labels text in the Prometheus text
// `text` is exactly `series` (as exported, e.g. `flce_heads_loaded` or
// `flce_region_refusals_total{reason="tcp"}`), -1 when absent.
double Sample(const std::string& text, const std::string& series);

// A Compute call whose header asks for a token (hidden_pieces or data_plane):
// the header goes out and the server's first answer (the token, or the call's
// failure) is read; End sends the end message and reads everything back.
class TokenCall {
 public:
  TokenCall(v1::Flce::Stub& stub, const v1::ComputeHeader& header, const std::string& bearer = "") {
    if (!bearer.empty()) context_.AddMetadata("authorization", "Bearer " + bearer);
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream_ = stub.Compute(&context_);
    stream_->Write(HeaderMessage(header));
    v1::ComputeResponse first;
    if (stream_->Read(&first) && first.has_pieces()) token_ = first.pieces().token();
  }
  const std::string& token() const { return token_; }

  void SendRows(const Problem& p, int64_t begin, int64_t end) {
    const int64_t row = p.spec.hidden_size * 4;
    stream_->Write(HiddenMessage(begin, p.hidden_bytes.substr(begin * row, (end - begin) * row)));
  }

  // The end message, the half-close, and everything the server sends back.
  grpc::Status End(int64_t num_tokens, int64_t hidden_size) {
    stream_->Write(EndMessage(num_tokens));
    stream_->WritesDone();
    grad_input_.assign(num_tokens * hidden_size, std::nanf(""));
    v1::ComputeResponse response;
    while (stream_->Read(&response)) {
      if (response.has_grad_input()) {
        const v1::GradInputChunk& g = response.grad_input();
        std::memcpy(grad_input_.data() + g.token_offset() * hidden_size, g.data().data(),
                    g.data().size());
      } else if (response.has_summary()) {
        summary_ = response.summary();
      }
    }
    return stream_->Finish();
  }
  const v1::ComputeSummary& summary() const { return summary_; }
  const std::vector<float>& grad_input() const { return grad_input_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ComputeRequest, v1::ComputeResponse>> stream_;
  std::string token_;
  v1::ComputeSummary summary_;
  std::vector<float> grad_input_;
};

}  // namespace flce::server::test

#endif  // FLCE_TESTS_SERVER_SERVER_TEST_UTIL_H_
