#include "tests/server/server_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "flce/v1/convert.h"
#include "grpcpp/generic/generic_stub.h"
#include "kernels/engine_factory.h"
#include "server/observe/log.h"

namespace flce::server::test {

ServerConfig TestConfig() {
  ServerConfig config;
  config.address = "127.0.0.1:0";
  config.metrics_port = 0;
  config.device = "cpu";
  config.embedded_demo_head = false;
  config.threads = 2;
  config.rpc_threads = 2;
  config.workspace_bytes = int64_t{64} << 20;
  config.drain = absl::Seconds(5);
  return config;
}

void ServerTest::StartServer(const ServerConfig& config) { StartServer(config, nullptr); }

void ServerTest::StartServer(const ServerConfig& config, std::unique_ptr<Engine> engine) {
  SetLogQuiet(true);
  absl::StatusOr<std::unique_ptr<FlceServer>> server =
      engine != nullptr ? FlceServer::Create(config, std::move(engine))
                        : FlceServer::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Each test gets its own connection (the global subchannel pool would
  // share one with a server of an earlier test on a reused port).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                       grpc::InsecureChannelCredentials(), args);
  stub_ = v1::Flce::NewStub(channel_);
}

void ServerTest::TearDown() {
  stub_.reset();
  channel_.reset();
  if (server_ != nullptr) {
    server_->Shutdown();
    server_.reset();
  }
}

grpc::Status UploadHead(v1::Flce::Stub& stub, const std::string& head_id, const Problem& problem,
                        int chunks, v1::HeadInfo* info, const std::string& token) {
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  v1::HeadInfo local;
  auto writer = stub.UploadHead(&context, info != nullptr ? info : &local);
  v1::UploadHeadRequest header;
  header.mutable_header()->set_head_id(head_id);
  header.mutable_header()->set_vocab_size(problem.spec.vocab_size);
  header.mutable_header()->set_hidden_size(problem.spec.hidden_size);
  header.mutable_header()->set_dtype(problem.spec.head_dtype == DType::kF32   ? v1::DTYPE_FP32
                                     : problem.spec.head_dtype == DType::kF16 ? v1::DTYPE_FP16
                                                                              : v1::DTYPE_BF16);
  header.mutable_header()->set_has_bias(problem.spec.has_bias);
  writer->Write(header);
  auto send = [&](v1::TensorRole role, const std::string& bytes) {
    int64_t total = static_cast<int64_t>(bytes.size());
    int64_t step = std::max<int64_t>(1, (total + chunks - 1) / chunks);
    for (int64_t offset = 0; offset < total; offset += step) {
      v1::UploadHeadRequest chunk;
      chunk.mutable_chunk()->set_role(role);
      chunk.mutable_chunk()->set_byte_offset(offset);
      chunk.mutable_chunk()->set_data(bytes.substr(offset, step));
      if (!writer->Write(chunk)) return;
    }
  };
  send(v1::TENSOR_WEIGHT, problem.weight_bytes);
  if (problem.spec.has_bias) send(v1::TENSOR_BIAS, problem.bias_bytes);
  writer->WritesDone();
  return writer->Finish();
}

v1::ComputeHeader MakeHeader(const Problem& problem, const std::string& head_id,
                             const std::string& session_id, const std::string& request_id) {
  v1::ComputeHeader header;
  header.set_request_id(request_id);
  header.set_head_id(head_id);
  header.set_session_id(session_id);
  header.set_reduction(v1::REDUCTION_SUM);
  header.set_num_tokens(problem.spec.num_tokens);
  header.set_targets(std::string(reinterpret_cast<const char*>(problem.targets.data()),
                                 problem.targets.size() * sizeof(int32_t)));
  header.set_hidden_dtype(problem.spec.hidden_dtype == DType::kF32   ? v1::DTYPE_FP32
                          : problem.spec.hidden_dtype == DType::kF16 ? v1::DTYPE_FP16
                                                                     : v1::DTYPE_BF16);
  if (problem.spec.ignore_index != -100) header.set_ignore_index(problem.spec.ignore_index);
  return header;
}

v1::ComputeRequest HeaderMessage(const v1::ComputeHeader& header) {
  v1::ComputeRequest request;
  *request.mutable_header() = header;
  return request;
}

v1::ComputeRequest HiddenMessage(int64_t token_offset, std::string data) {
  v1::ComputeRequest request;
  request.mutable_hidden()->set_token_offset(token_offset);
  request.mutable_hidden()->set_data(std::move(data));
  return request;
}

v1::ComputeRequest EndMessage(int64_t num_tokens) {
  v1::ComputeRequest request;
  request.mutable_end()->set_num_tokens(num_tokens);
  return request;
}

namespace {

// Reads every response of a Compute stream into `out`.
void ReadAll(grpc::ClientReaderWriter<v1::ComputeRequest, v1::ComputeResponse>* stream,
             int64_t hidden_size, int64_t num_tokens, bool fp32, ComputeOutcome* out) {
  if (fp32) {
    out->grad_input.assign(num_tokens * hidden_size, std::numeric_limits<float>::quiet_NaN());
  }
  v1::ComputeResponse response;
  while (stream->Read(&response)) {
    if (response.has_grad_input()) {
      const v1::GradInputChunk& g = response.grad_input();
      ++out->grad_messages;
      out->grad_rows += g.num_tokens();
      if (fp32 && g.token_offset() >= 0 && g.token_offset() + g.num_tokens() <= num_tokens &&
          static_cast<int64_t>(g.data().size()) == g.num_tokens() * hidden_size * 4) {
        std::memcpy(out->grad_input.data() + g.token_offset() * hidden_size, g.data().data(),
                    g.data().size());
      }
    } else if (response.has_token_outputs()) {
      out->token_outputs.push_back(response.token_outputs());
    } else if (response.has_summary()) {
      out->summary = response.summary();
      out->has_summary = true;
    }
  }
}

}  // namespace

ComputeOutcome Compute(v1::Flce::Stub& stub, const v1::ComputeHeader& header,
                       const Problem& problem, const ComputeOptions& options) {
  ComputeOutcome out;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.deadline);
  auto stream = stub.Compute(&context);
  int64_t hidden_size = problem.spec.hidden_size;
  int64_t num_tokens = problem.spec.num_tokens;
  std::thread reader([&] {
    ReadAll(stream.get(), hidden_size, num_tokens, problem.spec.hidden_dtype == DType::kF32, &out);
  });
  stream->Write(HeaderMessage(header));
  int64_t row_bytes = hidden_size * DTypeSize(problem.spec.hidden_dtype);
  std::vector<int64_t> offsets;
  for (int64_t t = 0; t < num_tokens; t += options.rows_per_chunk) offsets.push_back(t);
  if (options.shuffle) std::shuffle(offsets.begin(), offsets.end(), std::mt19937(17));
  bool cancelled = false;
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (static_cast<int>(i) == options.pause_after_chunks) {
      if (options.on_pause) options.on_pause();
      if (options.cancel_at_pause) {
        cancelled = true;
        break;
      }
    }
    int64_t rows = std::min(options.rows_per_chunk, num_tokens - offsets[i]);
    if (!stream->Write(HiddenMessage(
            offsets[i], problem.hidden_bytes.substr(offsets[i] * row_bytes, rows * row_bytes)))) {
      break;
    }
  }
  if (cancelled) {
    context.TryCancel();
  } else {
    if (options.send_end) stream->Write(EndMessage(num_tokens));
    stream->WritesDone();
  }
  reader.join();
  out.status = stream->Finish();
  return out;
}

ComputeOutcome ComputeMessages(v1::Flce::Stub& stub,
                               const std::vector<v1::ComputeRequest>& messages) {
  ComputeOutcome out;
  grpc::ClientContext context;
  // No deadline here: calls without one must work too.
  auto stream = stub.Compute(&context);
  std::thread reader([&] { ReadAll(stream.get(), 0, 0, false, &out); });
  for (const v1::ComputeRequest& m : messages) {
    if (!stream->Write(m)) break;
  }
  stream->WritesDone();
  reader.join();
  out.status = stream->Finish();
  return out;
}

DownloadedHead DownloadHead(v1::Flce::Stub& stub, const std::string& head_id, bool master,
                            int64_t chunk_rows) {
  DownloadedHead out;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::DownloadHeadRequest request;
  request.set_head_id(head_id);
  request.set_master(master);
  request.set_chunk_rows(chunk_rows);
  auto reader = stub.DownloadHead(&context, request);
  v1::DownloadHeadResponse response;
  DType dtype = DType::kF32;
  while (reader->Read(&response)) {
    if (response.has_header()) {
      out.header = response.header();
      dtype = *DTypeFromProto(out.header.dtype());
      const int64_t v = out.header.head().vocab_size();
      out.weight.assign(v * out.header.head().hidden_size(),
                        std::numeric_limits<float>::quiet_NaN());
      if (out.header.head().has_bias()) out.bias.assign(v, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const v1::GradChunk& chunk = response.chunk();
    ++out.chunks;
    const int64_t width = chunk.role() == v1::TENSOR_WEIGHT ? out.header.head().hidden_size() : 1;
    std::vector<float>& dst = chunk.role() == v1::TENSOR_WEIGHT ? out.weight : out.bias;
    const int64_t count = chunk.rows() * width;
    if ((chunk.row_offset() + chunk.rows()) * width > static_cast<int64_t>(dst.size()) ||
        static_cast<int64_t>(chunk.data().size()) != count * DTypeSize(dtype)) {
      ADD_FAILURE() << "malformed download chunk at row " << chunk.row_offset();
      continue;
    }
    ToFloat(dtype, chunk.data().data(), dst.data() + chunk.row_offset() * width, count);
  }
  out.status = reader->Finish();
  return out;
}

grpc::Status StepHead(v1::Flce::Stub& stub, const std::string& head_id,
                      const std::string& session_id, const std::string& request_id, double lr,
                      v1::StepResponse* response) {
  v1::StepRequest request;
  request.set_head_id(head_id);
  request.set_session_id(session_id);
  request.set_request_id(request_id);
  request.set_lr(lr);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return stub.Step(&context, request, response);
}

grpc::Status CreateOptimizer(v1::Flce::Stub& stub, const v1::CreateOptimizerRequest& request,
                             v1::OptimizerInfo* info) {
  v1::OptimizerInfo ignored;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return stub.CreateOptimizer(&context, request, info != nullptr ? info : &ignored);
}

FetchedGrad FetchGrad(v1::Flce::Stub& stub, const std::string& head_id,
                      const std::string& session_id, bool reset, const std::string& request_id,
                      v1::DType dtype, int64_t chunk_rows) {
  FetchedGrad out;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::FetchGradRequest request;
  request.set_head_id(head_id);
  request.set_session_id(session_id);
  request.set_reset(reset);
  request.set_request_id(request_id);
  request.set_dtype(dtype);
  request.set_chunk_rows(chunk_rows);
  auto reader = stub.FetchGrad(&context, request);
  v1::FetchGradResponse response;
  while (reader->Read(&response)) {
    if (response.has_header()) {
      out.header = response.header();
      int64_t v = out.header.vocab_size();
      out.weight.assign(v * out.header.hidden_size(), std::numeric_limits<float>::quiet_NaN());
      if (out.header.has_bias()) out.bias.assign(v, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const v1::GradChunk& chunk = response.chunk();
    ++out.chunks;
    bool bf16 = out.header.dtype() == v1::DTYPE_BF16;
    int64_t width = chunk.role() == v1::TENSOR_WEIGHT ? out.header.hidden_size() : 1;
    std::vector<float>& dst = chunk.role() == v1::TENSOR_WEIGHT ? out.weight : out.bias;
    int64_t count = chunk.rows() * width;
    if ((chunk.row_offset() + chunk.rows()) * width > static_cast<int64_t>(dst.size()) ||
        static_cast<int64_t>(chunk.data().size()) != count * (bf16 ? 2 : 4)) {
      ADD_FAILURE() << "malformed grad chunk at row " << chunk.row_offset();
      continue;
    }
    ToFloat(bf16 ? DType::kBF16 : DType::kF32, chunk.data().data(),
            dst.data() + chunk.row_offset() * width, count);
  }
  out.status = reader->Finish();
  return out;
}

grpc::Status Commit(v1::Flce::Stub& stub, const std::string& head_id, const std::string& session_id,
                    const std::string& request_id, float scale, bool discard,
                    v1::CommitResponse* response) {
  grpc::ClientContext context;
  v1::CommitRequest request;
  request.set_head_id(head_id);
  request.set_session_id(session_id);
  request.set_request_id(request_id);
  request.set_scale(scale);
  request.set_discard(discard);
  v1::CommitResponse local;
  return stub.Commit(&context, request, response != nullptr ? response : &local);
}

namespace {

// Polls ListSessions (every 10 ms, 5 s at most) until a session matches.
bool WaitForSessionWhere(v1::Flce::Stub& stub,
                         const std::function<bool(const v1::SessionInfo&)>& match) {
  for (int i = 0; i < 500; ++i) {
    grpc::ClientContext context;
    v1::ListSessionsResponse sessions;
    if (stub.ListSessions(&context, v1::ListSessionsRequest(), &sessions).ok()) {
      for (const auto& s : sessions.sessions()) {
        if (match(s)) return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

bool WaitForPending(v1::Flce::Stub& stub, const std::string& session_id, int64_t pending) {
  return WaitForSessionWhere(stub, [&](const v1::SessionInfo& s) {
    return s.session_id() == session_id && s.pending() == pending;
  });
}

bool WaitForSession(v1::Flce::Stub& stub, const std::string& session_id) {
  return WaitForSessionWhere(
      stub, [&](const v1::SessionInfo& s) { return s.session_id() == session_id; });
}

std::vector<double> Doubles(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

std::vector<double> Scaled(const std::vector<double>& values, double scale) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i] * scale;
  return out;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

grpc::Status RawStream(grpc::Channel* channel, const std::string& method,
                       const std::vector<std::string>& requests, std::string* response) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  void* tag;
  bool ok;
  auto call = stub.PrepareCall(&context, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  for (const std::string& request : requests) {
    grpc::Slice slice(request.data(), request.size());
    grpc::ByteBuffer out(&slice, 1);
    call->Write(out, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
  }
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  while (true) {
    grpc::ByteBuffer in;
    call->Read(&in, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
    std::vector<grpc::Slice> slices;
    in.Dump(&slices);
    for (const auto& s : slices)
      response->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  return status;
}

void ExpectNoContribution(v1::Flce::Stub& stub, const std::string& head_id,
                          const std::string& session_id) {
  FetchedGrad grad = FetchGrad(stub, head_id, session_id);
  if (grad.status.error_code() == grpc::StatusCode::NOT_FOUND) return;
  ASSERT_TRUE(grad.status.ok()) << grad.status.error_message();
  EXPECT_EQ(grad.header.contributions(), 0);
}

double Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.size() > series.size() && line.substr(0, series.size()) == series &&
        line[series.size()] == ' ') {
      double value = -1;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
    }
  }
  return -1;
}

ProblemSpec TinyF32Spec() {
  ProblemSpec ps;
  ps.vocab_size = 97;
  ps.hidden_size = 16;
  ps.num_tokens = 20;
  ps.head_dtype = DType::kF32;
  ps.hidden_dtype = DType::kF32;
  return ps;
}

}  // namespace flce::server::test
