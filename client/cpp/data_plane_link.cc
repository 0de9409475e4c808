#include "client/cpp/data_plane_link.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "core/data_plane_frame.h"
#include "core/tcp_socket.h"

namespace flce {
namespace {

bool SendAll(int fd, const void* data, size_t n) {
  const char* at = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = send(fd, at, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    at += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

absl::Status ReadAll(int fd, void* out, size_t n) {
  char* at = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = recv(fd, at, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) return absl::UnavailableError("data plane: the server closed the connection");
    if (got < 0) return absl::UnavailableError(absl::StrCat("data plane: ", std::strerror(errno)));
    at += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<std::string> TcpHostOf(absl::string_view target) {
  bool schemed = false;
  for (absl::string_view prefix : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, prefix)) {
      schemed = true;
      break;
    }
  }
  if (!schemed && (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:") ||
                   absl::StartsWith(target, "vsock:") || absl::StrContains(target, "://"))) {
    return std::nullopt;
  }
  if (target.empty() || absl::StrContains(target, ",")) return std::nullopt;
  if (target.front() == '[') {
    const size_t end = target.find(']');
    if (end == absl::string_view::npos || end < 2) return std::nullopt;
    return std::string(target.substr(1, end - 1));
  }
  const size_t colon = target.rfind(':');
  return std::string(colon == absl::string_view::npos ? target : target.substr(0, colon));
}

absl::StatusOr<std::unique_ptr<DataPlaneLink>> DataPlaneLink::Connect(
    const DataPlaneAddress& address, absl::Duration timeout) {
  const std::string& host = address.host;
  const int port = address.port;
  const int timeout_ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  const TcpOpened opened = OpenTcpSocket(
      host, port, /*passive=*/false, [timeout_ms](int fd, const sockaddr* a, socklen_t length) {
        return ConnectWithin(fd, a, length, timeout_ms);
      });
  if (opened.resolve_error != 0) {
    return absl::UnavailableError(absl::StrCat("data plane: cannot resolve ", host, ": ",
                                               gai_strerror(opened.resolve_error)));
  }
  const int fd = opened.fd;
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("data plane: cannot connect to ", host, ":", port,
                                               ": ", std::strerror(opened.error)));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::unique_ptr<DataPlaneLink>(new DataPlaneLink(fd));
}

DataPlaneLink::~DataPlaneLink() {
  Close();
  close(fd_);
}

void DataPlaneLink::Start(const std::string& token, absl::string_view hidden, int64_t row_bytes,
                          int64_t rows_per_chunk, RowAssembler* grad) {
  sender_ = std::thread([this, token, hidden, row_bytes, rows_per_chunk] {
    Send(token, hidden, row_bytes, rows_per_chunk);
  });
  if (grad != nullptr) receiver_ = std::thread([this, grad] { Receive(grad); });
}

void DataPlaneLink::Send(std::string token, absl::string_view hidden, int64_t row_bytes,
                         int64_t rows_per_chunk) {
  // A failed send needs no report here: the server fails the call, whose
  // status says why.
  std::string hello(data_plane::kMagic, sizeof(data_plane::kMagic));
  hello += token;
  if (!SendAll(fd_, hello.data(), hello.size())) return;
  const int64_t rows = static_cast<int64_t>(hidden.size()) / row_bytes;
  unsigned char frame[data_plane::kFrameHeaderBytes];
  for (int64_t row = 0; row < rows; row += rows_per_chunk) {
    const int64_t n = std::min(rows_per_chunk, rows - row);
    data_plane::EncodeFrameHeader({row, n * row_bytes}, frame);
    if (!SendAll(fd_, frame, sizeof(frame)) ||
        !SendAll(fd_, hidden.data() + row * row_bytes, static_cast<size_t>(n * row_bytes))) {
      return;
    }
  }
  data_plane::EncodeFrameHeader({data_plane::kEndOffset, rows}, frame);
  if (SendAll(fd_, frame, sizeof(frame))) shutdown(fd_, SHUT_WR);
}

void DataPlaneLink::Receive(RowAssembler* grad) {
  while (!grad->complete()) {
    unsigned char raw[data_plane::kFrameHeaderBytes];
    received_ = ReadAll(fd_, raw, sizeof(raw));
    if (!received_.ok()) return;
    const data_plane::FrameHeader frame = data_plane::DecodeFrameHeader(raw);
    if (frame.count <= 0 || frame.count % grad->row_bytes() != 0) {
      received_ = absl::InternalError(absl::StrCat(
          "data plane: a grad_input frame of ", frame.count, " bytes is not whole rows of ",
          grad->row_bytes()));
      return;
    }
    absl::StatusOr<char*> at = grad->Reserve(frame.token_offset, frame.count / grad->row_bytes());
    if (!at.ok()) {
      received_ = at.status();
      return;
    }
    received_ = ReadAll(fd_, *at, static_cast<size_t>(frame.count));
    if (!received_.ok()) return;
  }
}

void DataPlaneLink::Join() {
  if (sender_.joinable()) sender_.join();
  if (receiver_.joinable()) receiver_.join();
}

absl::Status DataPlaneLink::Finish() {
  Join();
  return received_;
}

void DataPlaneLink::Close() {
  if (closed_) return;
  closed_ = true;
  shutdown(fd_, SHUT_RDWR);
  Join();
}

}  // namespace flce
