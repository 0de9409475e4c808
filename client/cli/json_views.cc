#include "client/cli/json_views.h"

#include "absl/strings/match.h"
#include "client/cpp/wire_dtype.h"

namespace flce::cli {

std::string WithoutPrefix(const std::string& name, absl::string_view prefix) {
  return absl::StartsWith(name, prefix) ? name.substr(prefix.size()) : name;
}

namespace {

nlohmann::json GroupJson(const v1::OptimizerGroup& g) {
  return {{"weight_decay", g.weight_decay()}, {"momentum", g.momentum()},
          {"dampening", g.dampening()},       {"nesterov", g.nesterov()},
          {"beta1", g.beta1()},               {"beta2", g.beta2()},
          {"eps", g.eps()},                   {"amsgrad", g.amsgrad()}};
}

}  // namespace

nlohmann::json OptimizerInfoJson(const v1::OptimizerInfo& info) {
  return {{"kind", WithoutPrefix(v1::OptimizerKind_Name(info.kind()), "OPTIMIZER_")},
          {"weight", GroupJson(info.weight())},
          {"bias", GroupJson(info.bias())},
          {"steps", info.steps()},
          {"skipped_steps", info.skipped_steps()},
          {"state_bytes", info.state_bytes()}};
}

nlohmann::json HeadInfoJson(const v1::HeadInfo& head) {
  nlohmann::json json = {
      {"head_id", head.head_id()},           {"vocab_size", head.vocab_size()},
      {"hidden_size", head.hidden_size()},   {"dtype", WireDTypeName(head.dtype())},
      {"has_bias", head.has_bias()},         {"version", head.version()},
      {"weight_bytes", head.weight_bytes()}, {"source", head.source()},
      {"sessions", head.sessions()}};
  if (head.has_optimizer()) json["optimizer"] = OptimizerInfoJson(head.optimizer());
  return json;
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
          {"max_message_bytes", info.max_message_bytes()},
          {"capabilities", std::vector<std::string>(info.capabilities().begin(),
                                                    info.capabilities().end())},
          {"boot_id", info.boot_id()},
          {"local_transports", std::vector<std::string>(info.local_transports().begin(),
                                                        info.local_transports().end())},
          {"device_uuid", info.device_uuid()},
          {"unix_socket", info.unix_socket()},
          {"data_plane_port", info.data_plane_port()}};
}

nlohmann::json SummaryJson(const v1::ComputeSummary& summary, bool with_accuracy) {
  nlohmann::json json = {{"loss", summary.loss()},
                         {"n_valid", summary.n_valid()},
                         {"z_loss", summary.z_loss()},
                         {"entropy_sum", summary.entropy_sum()},
                         {"strategy_used", summary.strategy_used()},
                         {"kernels", summary.kernels()},
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
  if (summary.has_policy()) {
    const v1::PolicySummary& p = summary.policy();
    json["policy"] = {{"loss", p.loss()},
                      {"tokens", p.tokens()},
                      {"surrogate_loss", p.surrogate_loss()},
                      {"kl_loss", p.kl_loss()},
                      {"clip_fraction_low", p.clip_fraction_low()},
                      {"clip_fraction_high", p.clip_fraction_high()},
                      {"dual_clip_fraction", p.dual_clip_fraction()},
                      {"approx_kl", p.approx_kl()},
                      {"kl_mean", p.kl_mean()},
                      {"ratio_mean", p.ratio_mean()},
                      {"ratio_min", p.ratio_min()},
                      {"ratio_max", p.ratio_max()}};
  }
  if (summary.has_preference()) {
    const v1::PreferenceSummary& p = summary.preference();
    json["preference"] = {{"loss", p.loss()},
                          {"pairs", p.pairs()},
                          {"pair_loss", p.pair_loss()},
                          {"nll_loss", p.nll_loss()},
                          {"chosen_reward_mean", p.chosen_reward_mean()},
                          {"rejected_reward_mean", p.rejected_reward_mean()},
                          {"reward_accuracy", p.reward_accuracy()},
                          {"reward_margin_mean", p.reward_margin_mean()},
                          {"chosen_logp_mean", p.chosen_logp_mean()},
                          {"rejected_logp_mean", p.rejected_logp_mean()},
                          {"first_pass_ms", p.first_pass_ms()}};
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
