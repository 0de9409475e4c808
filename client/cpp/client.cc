// The unary calls and the channel. The streaming calls live in
// client_upload.cc, client_compute.cc and client_fetch_grad.cc.
#include "client/cpp/client.h"

#include <grpc/grpc.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/grpc_status.h"
#include "flce/v1/message_size.h"

namespace flce {
namespace {

// The smallest message limit a client accepts: below it, chunks would be tiny.
constexpr int64_t kMinMessageBytes = 64 << 10;
// The smallest --max-message-mb a server accepts (server/flce_server.cc).
constexpr int64_t kMinServerMessageBytes = 64 << 10;

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every channel of a client sends and accepts messages up to its limit.
grpc::ChannelArguments MessageSizeArguments(int64_t max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  return args;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const ClientOptions& options) {
  if (!options.uses_tls()) return grpc::InsecureChannelCredentials();
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its key: give tls_cert_file and tls_key_file together");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(options.tls_ca_file, "the TLS CA file");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(options.tls_cert_file, "the TLS certificate");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(options.tls_key_file, "the TLS key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("target is empty");
  if (options.max_message_bytes <= kMinMessageBytes ||
      options.max_message_bytes > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("max_message_bytes must be in (",
                                                   kMinMessageBytes, ", 2 GiB); got ",
                                                   options.max_message_bytes));
  }
  if (options.chunk_bytes <= 0) return absl::InvalidArgumentError("chunk_bytes must be > 0");
  if (options.connections < 1 || options.connections > 9) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections must be in [1, 9]; got ", options.connections));
  }
  grpc::ChannelArguments args = MessageSizeArguments(options.max_message_bytes);
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentialsFor(options);
  if (!credentials.ok()) return credentials.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.target, *credentials, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", options.target));
  }
  auto client = std::make_unique<Client>(std::move(channel), options);
  client->made_channel_ = true;
  client->credentials_ = *std::move(credentials);
  return client;
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      stub_(v1::Flce::NewStub(channel_)),
      options_(std::move(options)) {}

void Client::Authorize(grpc::ClientContext& context) const {
  if (!options_.auth_token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.auth_token));
  }
}

void Client::Prepare(grpc::ClientContext& context) const {
  Authorize(context);
  if (options_.timeout != absl::InfiniteDuration()) {
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(options_.timeout));
  }
}

v1::Flce::Stub& Client::BulkStub() {
  std::lock_guard<std::mutex> lock(bulk_mu_);
  if (bulk_settled_) return unix_stub_ != nullptr ? *unix_stub_ : *stub_;
  if (!options_.unix_socket || !made_channel_ || options_.uses_tls() ||
      options_.target.rfind("unix:", 0) == 0) {
    bulk_settled_ = true;
    return *stub_;
  }
  absl::StatusOr<v1::ServerInfo> info = ServerInfoOnce();
  if (!info.ok()) return *stub_;  // asked again with the next call
  bulk_settled_ = true;
  // The path as the server sees it: absent here (another mount namespace) or
  // another host's, it is not this server's socket.
  if (info->unix_socket().empty() || !OnThisHost(*info) ||
      access(info->unix_socket().c_str(), F_OK) != 0) {
    return *stub_;
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel("unix:" + info->unix_socket(), grpc::InsecureChannelCredentials(),
                                MessageSizeArguments(options_.max_message_bytes));
  auto stub = v1::Flce::NewStub(channel);
  grpc::ClientContext context;
  Authorize(context);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ServerInfo there;
  // Another server may hold the path now: only the same instance will do.
  if (!stub->GetServerInfo(&context, v1::ServerInfoRequest(), &there).ok() ||
      there.instance_id() != info->instance_id()) {
    return *stub_;
  }
  unix_channel_ = std::move(channel);
  unix_stub_ = std::move(stub);
  unix_local_transports_.assign(there.local_transports().begin(), there.local_transports().end());
  messages_target_ = "unix:" + info->unix_socket();
  return *unix_stub_;
}

int Client::HiddenStreams(int64_t chunks) {
  if (options_.connections <= 1 || chunks <= 1 || !made_channel_) return 1;
  absl::StatusOr<v1::ServerInfo> info = ServerInfoOnce();
  if (!info.ok() || !absl::c_linear_search(info->capabilities(), "hidden_pieces")) return 1;
  const int streams = static_cast<int>(std::min<int64_t>(options_.connections, chunks));
  const std::string target = messages_target();
  std::lock_guard<std::mutex> lock(pieces_mu_);
  while (static_cast<int>(piece_stubs_.size()) < streams - 1) {
    grpc::ChannelArguments args = MessageSizeArguments(options_.max_message_bytes);
    // A connection of its own: gRPC shares one subchannel between channels of
    // equal arguments unless told not to.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // The Unix socket the calls moved to is plaintext; the target as Connect reached it.
    const bool unix_socket = target.rfind("unix:", 0) == 0;
    if (!unix_socket && !options_.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls_server_name);
    }
    piece_stubs_.push_back(v1::Flce::NewStub(grpc::CreateCustomChannel(
        target, unix_socket ? grpc::InsecureChannelCredentials() : credentials_, args)));
  }
  return streams;
}

absl::StatusOr<std::optional<DataPlaneAddress>> Client::DataPlaneFor() {
  using Mode = ClientOptions::DataPlane;
  if (options_.data_plane == Mode::kOff) return std::nullopt;
  {
    std::lock_guard<std::mutex> lock(local_mu_);
    if (!data_plane_off_.empty() && options_.data_plane == Mode::kAuto) return std::nullopt;
  }
  absl::StatusOr<v1::ServerInfo> info = ServerInfoOnce();
  const std::optional<std::string> host =
      made_channel_ ? TcpHostOf(options_.target) : std::nullopt;
  std::string why;
  if (!info.ok()) {
    why = absl::StrCat("the server does not answer GetServerInfo (", info.status().message(), ")");
  } else if (!absl::c_linear_search(info->capabilities(), "data_plane") ||
             info->data_plane_port() == 0) {
    why = absl::StrCat("the server (", info->version(), ") has no data plane (--data-port)");
  } else if (options_.uses_tls()) {
    why = "this client uses TLS, which the data plane does not carry";
  } else if (!host.has_value()) {
    why = made_channel_ ? absl::StrCat("the target ", options_.target, " is not a TCP address")
                        : "the client was given a channel, not a target";
  }
  if (!why.empty()) {
    if (options_.data_plane == Mode::kOn) {
      return absl::FailedPreconditionError(absl::StrCat("data plane asked for, but ", why));
    }
    return std::nullopt;
  }
  DataPlaneAddress address{*host, info->data_plane_port()};
  {
    std::lock_guard<std::mutex> lock(local_mu_);
    if (data_plane_reached_) return address;
  }
  absl::StatusOr<std::unique_ptr<DataPlaneLink>> probe = DataPlaneLink::Connect(address);
  std::lock_guard<std::mutex> lock(local_mu_);
  if (probe.ok()) {
    data_plane_reached_ = true;
    return address;
  }
  if (options_.data_plane == Mode::kOn) return probe.status();
  if (data_plane_off_.empty()) {
    data_plane_off_ = std::string(probe.status().message());
    std::fprintf(stderr, "flce: not using the server's data plane (%s); Compute calls send "
                 "hidden in messages\n", data_plane_off_.c_str());
  }
  return std::nullopt;
}

std::vector<v1::Flce::Stub*> Client::PieceStubs(int pieces) {
  std::lock_guard<std::mutex> lock(pieces_mu_);
  std::vector<v1::Flce::Stub*> stubs;
  for (int i = 0; i < pieces; ++i) stubs.push_back(piece_stubs_[i].get());
  return stubs;
}

std::string Client::messages_target() {
  std::lock_guard<std::mutex> lock(bulk_mu_);
  return messages_target_.empty() ? options_.target : messages_target_;
}

absl::StatusOr<v1::ServerInfo> Client::ServerInfoOnce() {
  std::lock_guard<std::mutex> lock(info_mu_);
  if (!server_info_.has_value()) {
    absl::StatusOr<v1::ServerInfo> info = GetServerInfo();
    if (!info.ok()) return info.status();
    server_info_ = *std::move(info);
  }
  return *server_info_;
}

absl::StatusOr<std::shared_ptr<SharedMemoryTransport>> Client::SharedTransport() {
  if (options_.transport == ClientOptions::Transport::kGrpc) return nullptr;
  // Regions go where the tensors go: through the Unix socket once the calls
  // moved there, which is where a server offers them by default.
  v1::Flce::Stub& bulk = BulkStub();
  std::lock_guard<std::mutex> lock(local_mu_);
  if (!local_asked_) {
    absl::StatusOr<v1::ServerInfo> info = ServerInfoOnce();
    if (!info.ok()) {
      // The call itself will say what is wrong; ask again next time.
      if (options_.transport == ClientOptions::Transport::kShm) return info.status();
      return nullptr;
    }
    local_asked_ = true;
    std::vector<std::string> offered(info->local_transports().begin(),
                                     info->local_transports().end());
    {
      std::lock_guard<std::mutex> bulk_lock(bulk_mu_);
      if (unix_stub_ != nullptr) offered = unix_local_transports_;
    }
    if (!OnThisHost(*info)) {
      local_refusal_ = "it runs on another host (its boot id is not this one's)";
      messages_reason_ = v1::MESSAGES_REASON_NOT_LOCAL;
    } else if (!absl::c_linear_search(offered, "shm")) {
      // This client sends hidden from host memory: CUDA IPC alone does not fit it.
      messages_reason_ =
          offered.empty() ? v1::MESSAGES_REASON_NOT_OFFERED : v1::MESSAGES_REASON_UNSUITABLE;
      local_refusal_ = absl::StrCat(
          "it does not offer shared memory to this client through ", messages_target(),
          " (by default a client on its Unix socket running as its user; every client on its "
          "host with --local-transports=shm)");
    } else {
      shm_ = std::make_shared<SharedMemoryTransport>(
          &bulk, [this](grpc::ClientContext& context) { Authorize(context); });
    }
  }
  if (shm_ == nullptr && options_.transport == ClientOptions::Transport::kShm) {
    return absl::FailedPreconditionError(
        absl::StrCat("transport is shm but the server at ", options_.target, ": ",
                     local_refusal_));
  }
  return shm_;
}

void Client::DropSharedTransport(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(local_mu_);
  shm_.reset();
  local_refusal_ = absl::StrCat("it refused a shared-memory region (", why.ToString(), ")");
  messages_reason_ = absl::StartsWith(why.message(), kShmNoRoom) ? v1::MESSAGES_REASON_NO_ROOM
                                                                 : v1::MESSAGES_REASON_REFUSED;
}

v1::MessagesReason Client::WhyMessages() {
  if (options_.transport == ClientOptions::Transport::kGrpc) return v1::MESSAGES_REASON_ASKED;
  std::lock_guard<std::mutex> lock(local_mu_);
  return messages_reason_;
}

int64_t Client::ChunkBytes(int64_t requested) {
  const int64_t want = std::min(requested > 0 ? requested : options_.chunk_bytes,
                                PayloadBytesPerMessage(options_.max_message_bytes));
  // Every server takes messages of kMinServerMessageBytes: smaller chunks
  // need not ask it for its limit.
  if (want <= PayloadBytesPerMessage(kMinServerMessageBytes)) return std::max<int64_t>(1, want);
  return std::max<int64_t>(1, std::min(want, PayloadBytesPerMessage(MessageLimit())));
}

int64_t Client::MessageLimit() {
  // A server with a smaller --max-message-mb would refuse our chunks with
  // gRPC's own message; asked once, and a server that cannot say (an older
  // one, or a failure) leaves our own limit.
  std::lock_guard<std::mutex> lock(limit_mu_);
  if (message_limit_ == 0) {
    message_limit_ = options_.max_message_bytes;
    absl::StatusOr<v1::ServerInfo> info = ServerInfoOnce();
    if (info.ok() && info->max_message_bytes() > 0) {
      message_limit_ = std::min(message_limit_, info->max_message_bytes());
    }
  }
  return message_limit_;
}

absl::StatusOr<v1::HeadInfo> Client::LoadHeadFromFile(const v1::LoadHeadFromFileRequest& request) {
  grpc::ClientContext context;
  Prepare(context);
  v1::HeadInfo info;
  absl::Status status = FromGrpcStatus(stub_->LoadHeadFromFile(&context, request, &info));
  if (!status.ok()) return status;
  return info;
}

absl::StatusOr<v1::HeadInfo> Client::DescribeHead(const std::string& head_id) {
  grpc::ClientContext context;
  Prepare(context);
  v1::DescribeHeadRequest request;
  request.set_head_id(head_id);
  v1::HeadInfo info;
  absl::Status status = FromGrpcStatus(stub_->DescribeHead(&context, request, &info));
  if (!status.ok()) return status;
  return info;
}

absl::StatusOr<std::vector<v1::HeadInfo>> Client::ListHeads() {
  grpc::ClientContext context;
  Prepare(context);
  v1::ListHeadsResponse response;
  absl::Status status =
      FromGrpcStatus(stub_->ListHeads(&context, v1::ListHeadsRequest(), &response));
  if (!status.ok()) return status;
  return std::vector<v1::HeadInfo>(response.heads().begin(), response.heads().end());
}

absl::StatusOr<v1::UnloadHeadResponse> Client::UnloadHead(const std::string& head_id) {
  grpc::ClientContext context;
  Prepare(context);
  v1::UnloadHeadRequest request;
  request.set_head_id(head_id);
  v1::UnloadHeadResponse response;
  absl::Status status = FromGrpcStatus(stub_->UnloadHead(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::CommitResponse> Client::Commit(const v1::CommitRequest& request) {
  grpc::ClientContext context;
  Prepare(context);
  v1::CommitResponse response;
  absl::Status status = FromGrpcStatus(stub_->Commit(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::Status Client::ZeroGrad(const std::string& head_id, const std::string& session_id) {
  grpc::ClientContext context;
  Prepare(context);
  v1::ZeroGradRequest request;
  request.set_head_id(head_id);
  request.set_session_id(session_id);
  v1::ZeroGradResponse response;
  return FromGrpcStatus(stub_->ZeroGrad(&context, request, &response));
}

absl::StatusOr<std::vector<v1::SessionInfo>> Client::ListSessions(const std::string& head_id) {
  grpc::ClientContext context;
  Prepare(context);
  v1::ListSessionsRequest request;
  request.set_head_id(head_id);
  v1::ListSessionsResponse response;
  absl::Status status = FromGrpcStatus(stub_->ListSessions(&context, request, &response));
  if (!status.ok()) return status;
  return std::vector<v1::SessionInfo>(response.sessions().begin(), response.sessions().end());
}

absl::Status Client::DeleteSession(const std::string& head_id, const std::string& session_id) {
  grpc::ClientContext context;
  Prepare(context);
  v1::DeleteSessionRequest request;
  request.set_head_id(head_id);
  request.set_session_id(session_id);
  v1::DeleteSessionResponse response;
  return FromGrpcStatus(stub_->DeleteSession(&context, request, &response));
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  grpc::ClientContext context;
  Prepare(context);
  v1::ServerInfo info;
  absl::Status status =
      FromGrpcStatus(stub_->GetServerInfo(&context, v1::ServerInfoRequest(), &info));
  if (!status.ok()) return status;
  return info;
}

absl::StatusOr<HealthStatus> Client::Health(const std::string& service) {
  return CheckHealth(channel_, service, options_.timeout);
}

}  // namespace flce
