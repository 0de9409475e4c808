#include "server/metrics.h"

#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/status_mapping.h"

namespace flce::server {

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(int port) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Registry& registry = *metrics->registry_;
  metrics->requests_ = &prometheus::BuildCounter()
                            .Name("flce_requests_total")
                            .Help("RPCs finished, by method and gRPC status code")
                            .Register(registry);
  metrics->tokens_ = &prometheus::BuildCounter()
                          .Name("flce_tokens_total")
                          .Help("Tokens computed by Compute, by head and strategy")
                          .Register(registry);
  metrics->duration_ = &prometheus::BuildHistogram()
                            .Name("flce_request_duration_seconds")
                            .Help("RPC latency, first message to status, by method")
                            .Register(registry);
  metrics->engine_duration_ = &prometheus::BuildHistogram()
                                   .Name("flce_engine_duration_seconds")
                                   .Help("Engine time per Compute call, by strategy")
                                   .Register(registry);
  metrics->inflight_ = &prometheus::BuildGauge()
                            .Name("flce_inflight_requests")
                            .Help("RPCs in progress, by method")
                            .Register(registry);
  metrics->received_ = &prometheus::BuildCounter()
                            .Name("flce_received_bytes_total")
                            .Help("Payload bytes received (tensor bytes in messages), by method")
                            .Register(registry);
  metrics->sent_ = &prometheus::BuildCounter()
                        .Name("flce_sent_bytes_total")
                        .Help("Payload bytes sent (tensor bytes in messages), by method")
                        .Register(registry);
  metrics->head_weight_ = &prometheus::BuildGauge()
                               .Name("flce_head_weight_bytes")
                               .Help("Resident bytes of each head")
                               .Register(registry);
  auto gauge = [&registry](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
  };
  metrics->heads_ = gauge("flce_heads_loaded", "Resident heads");
  metrics->sessions_ = gauge("flce_sessions", "Live gradient sessions");
  metrics->sessions_pending_ = gauge("flce_sessions_with_pending_gradients",
                                     "Sessions holding staged (uncommitted) contributions");
  metrics->workspace_in_use_ =
      gauge("flce_workspace_bytes_in_use", "Engine workspace high-water mark");
  metrics->workspace_budget_ =
      gauge("flce_workspace_budget_bytes", "Engine workspace budget (--workspace-mb)");
  metrics->gpu_used_ = gauge("flce_gpu_memory_used_bytes", "Device memory in use (0 on CPU)");
  metrics->gpu_total_ = gauge("flce_gpu_memory_total_bytes", "Device memory size (0 on CPU)");
  if (port != 0) {
    // civetweb reports failures (port taken, no worker thread) as exceptions.
    try {
      metrics->exposer_ = std::make_unique<prometheus::Exposer>(absl::StrCat("0.0.0.0:", port));
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve /metrics on --metrics-port=", port, ": ", e.what()));
    }
    metrics->exposer_->RegisterCollectable(metrics->registry_);
    std::vector<int> ports = metrics->exposer_->GetListeningPorts();
    metrics->port_ = ports.empty() ? port : ports.front();
  }
  return metrics;
}

Metrics::~Metrics() = default;

void Metrics::RecordRequest(absl::string_view rpc, grpc::StatusCode code, double seconds) {
  requests_->Add({{"rpc", std::string(rpc)}, {"code", GrpcCodeName(code)}}).Increment();
  // 1 ms to 60 s in ~x2.5 steps (docs/METRICS.md).
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60};
  duration_->Add({{"rpc", std::string(rpc)}}, kBuckets).Observe(seconds);
}

void Metrics::RecordCompute(absl::string_view head_id, absl::string_view strategy, int64_t tokens,
                            double engine_seconds) {
  tokens_->Add({{"head", std::string(head_id)}, {"strategy", std::string(strategy)}})
      .Increment(static_cast<double>(tokens));
  // 0.1 ms to 10 s in ~x2.5 steps (docs/METRICS.md).
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  engine_duration_->Add({{"strategy", std::string(strategy)}}, kBuckets).Observe(engine_seconds);
}

void Metrics::InflightAdd(absl::string_view rpc, double delta) {
  prometheus::Gauge& gauge = inflight_->Add({{"rpc", std::string(rpc)}});
  if (delta >= 0) {
    gauge.Increment(delta);
  } else {
    gauge.Decrement(-delta);
  }
}

void Metrics::AddReceivedBytes(absl::string_view rpc, int64_t bytes) {
  received_->Add({{"rpc", std::string(rpc)}}).Increment(static_cast<double>(bytes));
}

void Metrics::AddSentBytes(absl::string_view rpc, int64_t bytes) {
  sent_->Add({{"rpc", std::string(rpc)}}).Increment(static_cast<double>(bytes));
}

void Metrics::SetHeadWeights(const std::map<std::string, int64_t>& bytes_by_head) {
  absl::MutexLock lock(&head_weight_mu_);
  for (auto it = head_weight_gauges_.begin(); it != head_weight_gauges_.end();) {
    if (bytes_by_head.count(it->first) == 0) {
      head_weight_->Remove(it->second);
      it = head_weight_gauges_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [head, bytes] : bytes_by_head) {
    prometheus::Gauge*& gauge = head_weight_gauges_[head];
    if (gauge == nullptr) gauge = &head_weight_->Add({{"head", head}});
    gauge->Set(static_cast<double>(bytes));
  }
}

void Metrics::SetGauges(const Snapshot& s) {
  heads_->Set(static_cast<double>(s.heads));
  sessions_->Set(static_cast<double>(s.sessions));
  sessions_pending_->Set(static_cast<double>(s.sessions_with_pending));
  workspace_in_use_->Set(static_cast<double>(s.workspace_peak_bytes));
  workspace_budget_->Set(static_cast<double>(s.workspace_budget_bytes));
  gpu_used_->Set(static_cast<double>(s.gpu_memory_used));
  gpu_total_->Set(static_cast<double>(s.gpu_memory_total));
}

}  // namespace flce::server
