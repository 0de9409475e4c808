// A Compute call's hidden rows and grad_input on the server's data plane
// (servers 0.18+ by default, 0.16+ with --data-port; docs/API.md, "The data plane"):
// raw bytes on a TCP connection of their own beside the call's gRPC stream,
// which keeps the header, the end message, the token outputs and the status.
// Connected when the call's PiecesOpened brings its token: the server closes a
// connection that does not name its call within 10 s, and a call may wait
// longer than that for staging memory.
#ifndef FLCE_CLIENT_CPP_DATA_PLANE_LINK_H_
#define FLCE_CLIENT_CPP_DATA_PLANE_LINK_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cpp/row_assembler.h"

namespace flce {

struct DataPlaneAddress {
  std::string host;
  int port = 0;
};

class DataPlaneLink {
 public:
  // UNAVAILABLE naming the address when no connection can be made within
  // `timeout` (a data port behind a firewall that drops SYNs must not hold a
  // call for the kernel's minutes of retries before it falls back to messages).
  static absl::StatusOr<std::unique_ptr<DataPlaneLink>> Connect(
      const DataPlaneAddress& address, absl::Duration timeout = kConnectTimeout);
  static constexpr absl::Duration kConnectTimeout = absl::Seconds(5);
  ~DataPlaneLink();
  DataPlaneLink(const DataPlaneLink&) = delete;
  DataPlaneLink& operator=(const DataPlaneLink&) = delete;

  // Sends the hello with `token`, `hidden`'s rows in frames of rows_per_chunk
  // and the end frame; receives grad_input into *grad (null: none asked for)
  // until every row is in. `hidden` and *grad outlive Finish() or Close().
  void Start(const std::string& token, absl::string_view hidden, int64_t row_bytes,
             int64_t rows_per_chunk, RowAssembler* grad);
  // After the call's stream ended well: waits for the last grad_input row;
  // what went wrong receiving it, if anything.
  absl::Status Finish();
  // Ends the connection (its threads stop) and waits for them.
  void Close();

 private:
  explicit DataPlaneLink(int fd) : fd_(fd) {}
  void Send(std::string token, absl::string_view hidden, int64_t row_bytes,
            int64_t rows_per_chunk);
  void Receive(RowAssembler* grad);
  void Join();

  const int fd_;
  std::thread sender_;
  std::thread receiver_;
  absl::Status received_;  // the receiver's, read after it joined
  bool closed_ = false;
};

// The host of a gRPC target that names one TCP address ("host:port",
// "[v6]:port", "dns:///host:port", "ipv4:addr:port"); nullopt for a Unix
// socket, another scheme or a list of addresses.
std::optional<std::string> TcpHostOf(absl::string_view target);

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_DATA_PLANE_LINK_H_
