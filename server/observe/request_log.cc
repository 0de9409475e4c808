#include "server/observe/request_log.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flce::server {

std::string QuoteLogValue(absl::string_view value) {
  const size_t left_out = value.size() > kMaxLogValueBytes ? value.size() - kMaxLogValueBytes : 0;
  value = value.substr(0, kMaxLogValueBytes);
  bool plain = !value.empty() && left_out == 0;
  for (char c : value) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == '"' || c == '\\' || c == '=') plain = false;
  }
  if (plain) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    } else {
      out += c;
    }
  }
  if (left_out > 0) absl::StrAppend(&out, "...(", left_out, " more bytes)");
  out += '"';
  return out;
}

std::string FormatRequestLog(const RequestLogLine& line) {
  std::string out = absl::StrCat("request id=", QuoteLogValue(line.id), " rpc=", line.rpc);
  if (!line.tenant.empty()) absl::StrAppend(&out, " tenant=", QuoteLogValue(line.tenant));
  if (!line.head.empty()) absl::StrAppend(&out, " head=", QuoteLogValue(line.head));
  if (!line.session.empty()) absl::StrAppend(&out, " session=", QuoteLogValue(line.session));
  if (line.tokens >= 0) absl::StrAppend(&out, " tokens=", line.tokens);
  if (!line.strategy.empty()) absl::StrAppend(&out, " strategy=", QuoteLogValue(line.strategy));
  if (!line.kernels.empty()) absl::StrAppend(&out, " kernels=", QuoteLogValue(line.kernels));
  if (!line.transport.empty()) absl::StrAppend(&out, " transport=", line.transport);
  for (const auto& [name, ms] : line.phases_ms) {
    absl::StrAppendFormat(&out, " %s_ms=%.3f", name, ms);
  }
  if (line.input_wait_ms >= 0) {
    absl::StrAppendFormat(&out, " input_wait_ms=%.3f", line.input_wait_ms);
  }
  absl::StrAppendFormat(&out, " duration_ms=%.3f code=%s", line.seconds * 1000.0, line.code);
  if (line.code != "OK" && !line.message.empty()) {
    absl::StrAppend(&out, " message=", QuoteLogValue(line.message));
  }
  return out;
}

std::vector<std::pair<std::string, nlohmann::json>> RequestLogFields(const RequestLogLine& line) {
  auto cut = [](const std::string& value) {
    if (value.size() <= kMaxLogValueBytes) return value;
    return absl::StrCat(value.substr(0, kMaxLogValueBytes), "...(",
                        value.size() - kMaxLogValueBytes, " more bytes)");
  };
  std::vector<std::pair<std::string, nlohmann::json>> fields;
  fields.emplace_back("request_id", cut(line.id));
  fields.emplace_back("rpc", line.rpc);
  if (!line.tenant.empty()) fields.emplace_back("tenant", cut(line.tenant));
  if (!line.head.empty()) fields.emplace_back("head", cut(line.head));
  if (!line.session.empty()) fields.emplace_back("session", cut(line.session));
  if (line.tokens >= 0) fields.emplace_back("tokens", line.tokens);
  if (!line.strategy.empty()) fields.emplace_back("strategy", cut(line.strategy));
  if (!line.kernels.empty()) fields.emplace_back("kernels", cut(line.kernels));
  if (!line.transport.empty()) fields.emplace_back("transport", line.transport);
  for (const auto& [name, ms] : line.phases_ms) fields.emplace_back(absl::StrCat(name, "_ms"), ms);
  if (line.input_wait_ms >= 0) fields.emplace_back("input_wait_ms", line.input_wait_ms);
  fields.emplace_back("duration_ms", line.seconds * 1000.0);
  fields.emplace_back("code", line.code);
  if (line.code != "OK" && !line.message.empty()) fields.emplace_back("message", cut(line.message));
  return fields;
}

}  // namespace flce::server
