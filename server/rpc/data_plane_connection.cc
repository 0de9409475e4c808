#include "server/rpc/data_plane_connection.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/data_plane_frame.h"
#include "flce/v1/flce.pb.h"
#include "server/base/receive_buffers.h"

namespace flce::server {
namespace {

void SetReceiveTimeout(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

absl::Status Broken(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("data plane: ", what));
}

}  // namespace

DataPlaneConnection::DataPlaneConnection(int fd, ComputePieces* pieces, Metrics* metrics,
                                         int64_t max_frame_bytes, absl::Duration hello_time)
    : fd_(fd),
      pieces_(pieces),
      metrics_(metrics),
      max_frame_bytes_(max_frame_bytes),
      hello_time_(hello_time) {}

DataPlaneConnection::~DataPlaneConnection() { close(fd_); }

void DataPlaneConnection::Serve() {
  unsigned char hello[data_plane::kHelloBytes];
  SetReceiveTimeout(fd_, hello_time_);
  if (!ReadFully(hello, sizeof(hello)).ok() ||
      std::memcmp(hello, data_plane::kMagic, sizeof(data_plane::kMagic)) != 0) {
    return;
  }
  SetReceiveTimeout(fd_, absl::ZeroDuration());  // from here the call's deadline governs
  const std::string token(reinterpret_cast<const char*>(hello) + sizeof(data_plane::kMagic),
                          data_plane::kTokenBytes);
  absl::StatusOr<std::shared_ptr<PieceTarget>> target =
      pieces_->AttachDataPlane(token, shared_from_this());
  if (!target.ok()) return;
  std::weak_ptr<DataPlaneConnection> self = weak_from_this();
  absl::StatusOr<int> piece = (*target)->JoinPiece([self](absl::StatusOr<int64_t> rows) {
    // Taken: grad_input may still follow. Refused: nothing more of it is read.
    if (rows.ok()) return;
    if (auto held = self.lock()) held->Close();
  });
  if (!piece.ok()) {
    Close();
    return;
  }
  Feed(**target, *piece);
}

void DataPlaneConnection::Feed(PieceTarget& target, int piece) {
  auto fail = [&](absl::Status why) {
    target.OfferPiece(piece, std::move(why), nullptr);
  };
  const std::function<void()> resume = [self = weak_from_this()] {
    if (auto held = self.lock()) {
      absl::MutexLock lock(&held->room_mu_);
      held->room_ = true;
    }
  };
  for (;;) {
    unsigned char raw[data_plane::kFrameHeaderBytes];
    if (absl::Status read = ReadFully(raw, sizeof(raw)); !read.ok()) {
      fail(Broken(absl::StrCat("the connection ended before its end frame (", read.message(), ")")));
      return;
    }
    const data_plane::FrameHeader frame = data_plane::DecodeFrameHeader(raw);
    v1::ComputePieceRequest message;
    if (frame.token_offset == data_plane::kEndOffset) {
      message.mutable_end()->set_num_tokens(frame.count);
      target.OfferPiece(piece, std::move(message), nullptr);
      // Nothing may follow the end frame; the client may close its side.
      unsigned char stray;
      const ssize_t got = recv(fd_, &stray, 1, 0);
      if (got > 0) fail(Broken("bytes after the end frame"));
      return;
    }
    if (frame.token_offset < 0 || frame.count <= 0 || frame.count > max_frame_bytes_) {
      fail(absl::InvalidArgumentError(absl::StrCat(
          "data plane: a frame at token ", frame.token_offset, " of ", frame.count,
          " bytes; frames carry 1 to ", max_frame_bytes_,
          " bytes (--max-message-bytes) at a token offset >= 0")));
      return;
    }
    v1::HiddenChunk* chunk = message.mutable_hidden();
    chunk->set_token_offset(frame.token_offset);
    std::string* data = chunk->mutable_data();
    *data = ReceiveBuffers::Shared().Take(static_cast<size_t>(frame.count));
    if (absl::Status read = ReadFully(data->data(), data->size()); !read.ok()) {
      fail(Broken(absl::StrCat("the connection ended inside a frame (", read.message(), ")")));
      return;
    }
    if (metrics_ != nullptr) metrics_->AddDataPlaneBytes("in", frame.count);
    {
      absl::MutexLock lock(&room_mu_);
      room_ = false;
    }
    if (!target.OfferPiece(piece, std::move(message), resume)) WaitForRoom();
    if (closed_.load()) return;
  }
}

void DataPlaneConnection::WaitForRoom() {
  absl::MutexLock lock(&room_mu_);
  room_mu_.Await(absl::Condition(
      +[](DataPlaneConnection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->room_mu_) {
        return c->room_ || c->closed_.load();
      },
      this));
}

absl::Status DataPlaneConnection::ReadFully(void* out, size_t n) {
  auto* at = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ssize_t got = recv(fd_, at, n, 0);
    if (got > 0) {
      at += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) return absl::UnavailableError("closed by the peer");
    return absl::UnavailableError(std::strerror(errno));
  }
  return absl::OkStatus();
}

absl::Status DataPlaneConnection::Write(int64_t token_offset, absl::string_view data) {
  unsigned char header[data_plane::kFrameHeaderBytes];
  data_plane::EncodeFrameHeader({token_offset, static_cast<int64_t>(data.size())}, header);
  iovec parts[2] = {{header, sizeof(header)},
                    {const_cast<char*>(data.data()), data.size()}};
  iovec* next = parts;
  int left = 2;
  absl::MutexLock lock(&write_mu_);
  while (left > 0) {
    if (closed_.load()) return Broken("the connection was closed before grad_input was sent");
    msghdr message{};
    message.msg_iov = next;
    message.msg_iovlen = static_cast<size_t>(left);
    const ssize_t sent = sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return Broken(absl::StrCat("grad_input could not be sent: ", std::strerror(errno)));
    }
    size_t done = static_cast<size_t>(sent);
    while (left > 0 && done >= next->iov_len) {
      done -= next->iov_len;
      ++next;
      --left;
    }
    if (left > 0) {
      next->iov_base = static_cast<char*>(next->iov_base) + done;
      next->iov_len -= done;
    }
  }
  return absl::OkStatus();
}

void DataPlaneConnection::Close() {
  if (closed_.exchange(true)) return;
  shutdown(fd_, SHUT_RDWR);  // wakes a read or write blocked on it
  absl::MutexLock lock(&room_mu_);
  room_ = true;
}

}  // namespace flce::server
