#include "client/cli/json_views.h"

#include "client/cpp/wire_dtype.h"

namespace flce::cli {

nlohmann::json HeadInfoJson(const v1::HeadInfo& head) {
  return {{"head_id", head.head_id()},           {"vocab_size", head.vocab_size()},
          {"hidden_size", head.hidden_size()},   {"dtype", WireDTypeName(head.dtype())},
          {"has_bias", head.has_bias()},         {"version", head.version()},
          {"weight_bytes", head.weight_bytes()}, {"source", head.source()},
          {"sessions", head.sessions()}};
}

nlohmann::json SessionInfoJson(const v1::SessionInfo& session) {
  return {{"head_id", session.head_id()},
          {"session_id", session.session_id()},
          {"contributions", session.contributions()},
          {"pending", session.pending()},
          {"tokens", session.tokens()},
          {"idle_seconds", session.idle_seconds()},
          {"grad_bytes", session.grad_bytes()}};
}

nlohmann::json ServerInfoJson(const v1::ServerInfo& info) {
  return {{"instance_id", info.instance_id()},
          {"version", info.version()},
          {"engine", info.engine()},
          {"workspace_budget_bytes", info.workspace_budget_bytes()},
          {"max_request_tokens", info.max_request_tokens()},
          {"max_message_bytes", info.max_message_bytes()}};
}

nlohmann::json SummaryJson(const v1::ComputeSummary& summary, bool with_accuracy) {
  nlohmann::json json = {{"loss", summary.loss()},
                         {"n_valid", summary.n_valid()},
                         {"z_loss", summary.z_loss()},
                         {"entropy_sum", summary.entropy_sum()},
                         {"strategy_used", summary.strategy_used()},
                         {"engine", summary.engine()},
                         {"head_version", summary.head_version()},
                         {"server_instance_id", summary.server_instance_id()},
                         {"replayed", summary.replayed()},
                         {"staged", summary.staged()},
                         {"committed", summary.committed()},
                         {"timings",
                          {{"total_ms", summary.timings().total_ms()},
                           {"engine_ms", summary.timings().engine_ms()},
                           {"wait_ms", summary.timings().wait_ms()}}}};
  if (with_accuracy) {
    json["accuracy"] = summary.accuracy();
    json["n_correct"] = summary.n_correct();
  }
  return json;
}

nlohmann::json GradHeaderJson(const v1::GradHeader& header) {
  return {{"vocab_size", header.vocab_size()},
          {"hidden_size", header.hidden_size()},
          {"dtype", WireDTypeName(header.dtype())},
          {"has_bias", header.has_bias()},
          {"contributions", header.contributions()},
          {"head_version", header.head_version()},
          {"replayed", header.replayed()}};
}

}  // namespace flce::cli
