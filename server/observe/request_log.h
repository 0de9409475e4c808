// The one structured log line each RPC leaves when it ends, as key=value
// pairs an operator can grep or a log shipper can split:
//   request id=r1 rpc=Compute tenant=a head=demo session=s1 tokens=48
//     strategy=chunked kernels="logits=stats_pingpong192_pairs rows=row_reference ..."
//     header_ms=0.5 setup_ms=1.2 input_ms=98.9 finish_ms=13.0 land_ms=0.9
//     input_wait_ms=4.2 duration_ms=114.512 code=OK
// A Compute's phases (each only when the call reached its end) say where its
// time went: waiting for the header, checks, session and engine set-up,
// taking hidden in, the engine's remaining work, and landing (or staging) the
// contribution; what duration_ms has beyond their sum went to the summary.
// input_wait_ms (the CUDA engine's chunked calls) is the part of input_ms the
// input waited for the engine to free an upload slot: the GPU's pace, not
// the wire's.
// Values with spaces, quotes or '=' are quoted; fields not known for the RPC
// are left out; a failed call adds message="...". Never holds a token.
#ifndef FLCE_SERVER_OBSERVE_REQUEST_LOG_H_
#define FLCE_SERVER_OBSERVE_REQUEST_LOG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace flce::server {

struct RequestLogLine {
  std::string id;  // the client's request id, else "#<call number>"
  std::string rpc;
  std::string tenant;  // "" = anonymous (no auth) or not yet known
  std::string head;
  std::string session;
  int64_t tokens = -1;  // -1 = not a compute
  std::string strategy;
  std::string kernels;    // Compute: ComputeSummary.kernels (the CUDA engine's)
  std::string transport;  // Compute: how hidden came ("messages_tcp", "shm", ...)
  std::vector<std::pair<std::string, double>> phases_ms;  // in order; "<name>_ms" keys
  // Compute: of input_ms, the engine's wait for a free upload slot
  // (ComputeResult::input_wait_ms); -1 = not reported.
  double input_wait_ms = -1.0;
  double seconds = 0.0;
  std::string code;  // "OK", "INVALID_ARGUMENT", ...
  std::string message;
};

// The key=value line of --log-format=text.
std::string FormatRequestLog(const RequestLogLine& line);

// The fields of --log-format=json, in order: request_id, rpc, tenant, head,
// session, tokens, strategy, kernels, transport (each only when known), the phases,
// input_wait_ms (when reported), duration_ms, code,
// message (not for OK); string values cut as QuoteLogValue cuts them.
std::vector<std::pair<std::string, nlohmann::json>> RequestLogFields(const RequestLogLine& line);

// Values are what clients sent, validated or not: beyond this many bytes one
// is cut, quoted, and says how much was left out.
inline constexpr size_t kMaxLogValueBytes = 512;

// value as is when it is a plain word, else in double quotes with `"` and `\`
// escaped and control bytes as \xNN.
std::string QuoteLogValue(absl::string_view value);

}  // namespace flce::server

#endif  // FLCE_SERVER_OBSERVE_REQUEST_LOG_H_
