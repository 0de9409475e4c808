#include "server/observe/metrics.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "flce/v1/flce.pb.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/base/status_mapping.h"
#include "server/observe/process_metrics.h"

// Both set by server/CMakeLists.txt; the commit is `git rev-parse --short
// HEAD` when CMake configured the build tree.
#ifndef FLCE_VERSION
#define FLCE_VERSION "0.0.0"
#endif
#ifndef FLCE_COMMIT
#define FLCE_COMMIT "unknown"
#endif

namespace flce::server {

std::string Metrics::HeadLabel(absl::string_view owner, absl::string_view head_id) {
  return std::string(owner.empty() ? head_id : kTenantHeads);
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& host, int port) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  metrics->process_ = std::make_shared<ProcessCollector>();
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
  metrics->shared_memory_ =
      &prometheus::BuildCounter()
           .Name("flce_shared_memory_bytes_total")
           .Help("Compute bytes through shared-memory regions instead of messages (in: hidden, "
                 "out: grad_input)")
           .Register(registry);
  metrics->shared_memory_->Add({{"direction", "in"}});
  metrics->shared_memory_->Add({{"direction", "out"}});
  metrics->cuda_ipc_ =
      &prometheus::BuildCounter()
           .Name("flce_cuda_ipc_bytes_total")
           .Help("Compute bytes read from and written to clients' GPU memory (CUDA IPC) instead "
                 "of messages (in: hidden, out: grad_input)")
           .Register(registry);
  metrics->cuda_ipc_->Add({{"direction", "in"}});
  metrics->cuda_ipc_->Add({{"direction", "out"}});
  metrics->data_plane_ =
      &prometheus::BuildCounter()
           .Name("flce_data_plane_bytes_total")
           .Help("Compute bytes on data-plane connections (--data-port) instead of messages (in: "
                 "hidden, out: grad_input)")
           .Register(registry);
  metrics->data_plane_->Add({{"direction", "in"}});
  metrics->data_plane_->Add({{"direction", "out"}});
  metrics->compute_transports_ =
      &prometheus::BuildCounter()
           .Name("flce_compute_calls_total")
           .Help("Compute calls by how hidden travelled (messages over TCP or the Unix socket, "
                 "shm, cuda_ipc) and, for messages, why (the client's messages_reason)")
           .Register(registry);
  // Every series from the start, so that rate() and the dashboard see a 0.
  const google::protobuf::EnumDescriptor* reasons = v1::MessagesReason_descriptor();
  for (const char* connection : {"messages_tcp", "messages_unix_socket"}) {
    for (int i = 0; i < reasons->value_count(); ++i) {
      metrics->compute_transports_->Add(
          {{"transport", connection}, {"reason", MessagesReasonLabel(reasons->value(i)->number())}});
    }
  }
  metrics->compute_transports_->Add({{"transport", "shm"}, {"reason", "region"}});
  metrics->compute_transports_->Add({{"transport", "cuda_ipc"}, {"reason", "region"}});
  metrics->region_refusals_ = &prometheus::BuildCounter()
                                   .Name("flce_region_refusals_total")
                                   .Help("Regions streams and registrations refused, by reason")
                                   .Register(registry);
  for (absl::string_view reason : kRegionRefusalReasons) {
    metrics->region_refusals_->Add({{"reason", std::string(reason)}});
  }
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
  // The engines report only the largest workspace any call used since start
  // (EngineInfo::workspace_peak_bytes), not what is in use at the scrape.
  metrics->workspace_peak_ =
      gauge("flce_workspace_peak_bytes", "Largest engine workspace any call used since start");
  metrics->workspace_budget_ =
      gauge("flce_workspace_budget_bytes", "Engine workspace budget (--workspace-mb)");
  metrics->gpu_used_ = gauge("flce_gpu_memory_used_bytes", "Device memory in use (0 on CPU)");
  metrics->gpu_total_ = gauge("flce_gpu_memory_total_bytes", "Device memory size (0 on CPU)");
  metrics->optimizer_state_ =
      gauge("flce_optimizer_state_bytes",
            "Memory of every head's optimizer state (fp32 master weight and moments)");
  metrics->held_rows_kept_ =
      gauge("flce_held_rows_kept_bytes",
            "Host memory kept for the next preference calls' held rows (two buffers at most)");
  metrics->receive_buffers_kept_ =
      gauge("flce_receive_buffers_kept_bytes",
            "Host memory kept for the next frames of hidden the data plane reads (64 MiB at most)");
  metrics->steps_ = &prometheus::BuildCounter()
                         .Name("flce_optimizer_steps_total")
                         .Help("Optimizer steps by outcome (STEP_APPLIED, STEP_SKIPPED_...)")
                         .Register(registry);
  // Every outcome from the start, so that rate() and alerts see a 0 before the first step.
  const google::protobuf::EnumDescriptor* outcomes = v1::StepOutcome_descriptor();
  for (int i = 0; i < outcomes->value_count(); ++i) {
    if (outcomes->value(i)->number() == v1::STEP_OUTCOME_UNSPECIFIED) continue;
    metrics->steps_->Add({{"outcome", outcomes->value(i)->name()}});
  }
  prometheus::BuildGauge()
      .Name("flce_build_info")
      .Help("Always 1; the labels say which build of flce-server runs")
      .Register(registry)
      .Add({{"version", FLCE_VERSION}, {"commit", FLCE_COMMIT}})
      .Set(1);
  if (port != 0) {
    // civetweb wants IPv6 addresses in brackets ("[::1]:9464").
    const std::string bind = host.find(':') != std::string::npos && host.front() != '['
                                 ? absl::StrCat("[", host, "]:", port)
                                 : absl::StrCat(host, ":", port);
    // civetweb reports failures (port taken, no such address, no worker
    // thread) as exceptions.
    try {
      metrics->exposer_ = std::make_unique<prometheus::Exposer>(bind);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", bind,
                                                 " (--metrics-host, --metrics-port): ", e.what()));
    }
    metrics->exposer_->RegisterCollectable(metrics->registry_);
    metrics->exposer_->RegisterCollectable(metrics->process_);
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

void Metrics::RecordCompute(absl::string_view owner, absl::string_view head_id,
                            absl::string_view strategy, int64_t tokens, double engine_seconds) {
  {
    const std::string label = HeadLabel(owner, head_id);
    absl::MutexLock lock(&head_mu_);
    prometheus::Counter*& counter = token_counters_[label][std::string(strategy)];
    if (counter == nullptr) {
      counter = &tokens_->Add({{"head", label}, {"strategy", std::string(strategy)}});
    }
    counter->Increment(static_cast<double>(tokens));
  }
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

void Metrics::AddSharedMemoryBytes(absl::string_view direction, int64_t bytes) {
  shared_memory_->Add({{"direction", std::string(direction)}})
      .Increment(static_cast<double>(bytes));
}

void Metrics::AddDataPlaneBytes(absl::string_view direction, int64_t bytes) {
  data_plane_->Add({{"direction", std::string(direction)}}).Increment(static_cast<double>(bytes));
}

void Metrics::AddCudaIpcBytes(absl::string_view direction, int64_t bytes) {
  cuda_ipc_->Add({{"direction", std::string(direction)}}).Increment(static_cast<double>(bytes));
}

std::string MessagesReasonLabel(int reason) {
  const google::protobuf::EnumValueDescriptor* value =
      v1::MessagesReason_descriptor()->FindValueByNumber(reason);
  if (value == nullptr) value = v1::MessagesReason_descriptor()->FindValueByNumber(0);
  return absl::AsciiStrToLower(absl::StripPrefix(value->name(), "MESSAGES_REASON_"));
}

void Metrics::RecordComputeTransport(absl::string_view transport, absl::string_view reason) {
  compute_transports_->Add({{"transport", std::string(transport)}, {"reason", std::string(reason)}})
      .Increment();
}

void Metrics::RecordRegionRefusal(absl::string_view reason) {
  region_refusals_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::RemoveHeadLocked(const std::string& label) {
  auto weight = head_weight_gauges_.find(label);
  if (weight != head_weight_gauges_.end()) {
    head_weight_->Remove(weight->second);
    head_weight_gauges_.erase(weight);
  }
  auto tokens = token_counters_.find(label);
  if (tokens != token_counters_.end()) {
    for (const auto& [strategy, counter] : tokens->second) tokens_->Remove(counter);
    token_counters_.erase(tokens);
  }
}

void Metrics::ForgetHead(const std::string& label) {
  absl::MutexLock lock(&head_mu_);
  RemoveHeadLocked(label);
}

void Metrics::SetHeadWeights(const std::map<std::string, int64_t>& bytes_by_head) {
  absl::MutexLock lock(&head_mu_);
  std::vector<std::string> gone;
  for (const auto& [label, gauge] : head_weight_gauges_) {
    if (bytes_by_head.count(label) == 0) gone.push_back(label);
  }
  for (const auto& [label, counters] : token_counters_) {
    if (bytes_by_head.count(label) == 0) gone.push_back(label);
  }
  for (const std::string& label : gone) RemoveHeadLocked(label);
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
  workspace_peak_->Set(static_cast<double>(s.workspace_peak_bytes));
  workspace_budget_->Set(static_cast<double>(s.workspace_budget_bytes));
  gpu_used_->Set(static_cast<double>(s.gpu_memory_used));
  gpu_total_->Set(static_cast<double>(s.gpu_memory_total));
  optimizer_state_->Set(static_cast<double>(s.optimizer_state_bytes));
  held_rows_kept_->Set(static_cast<double>(s.held_rows_kept_bytes));
  receive_buffers_kept_->Set(static_cast<double>(s.receive_buffers_kept_bytes));
}

void Metrics::RecordStep(absl::string_view outcome) {
  steps_->Add({{"outcome", std::string(outcome)}}).Increment();
}

std::string Metrics::Text() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& family : process_->Collect()) {
    families.push_back(std::move(family));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace flce::server
