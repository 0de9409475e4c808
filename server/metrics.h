// Prometheus metrics of the server, behind one small class so the set can
// grow without touching the RPC code. Served by prometheus-cpp's pull
// Exposer on --metrics-port (/metrics); with port 0 they are still counted
// but not served.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(auto metrics, Metrics::Create(9464));
//   metrics->RecordRequest("Compute", grpc::StatusCode::OK, seconds);
#ifndef FLCE_SERVER_METRICS_H_
#define FLCE_SERVER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/status_code_enum.h"

namespace prometheus {
class Exposer;
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace flce::server {

class Metrics {
 public:
  // port 0: no exposer.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(int port);
  ~Metrics();

  // flce_requests_total{rpc,code} and flce_request_duration_seconds{rpc}.
  void RecordRequest(absl::string_view rpc, grpc::StatusCode code, double seconds);
  // flce_tokens_total{head,strategy} and flce_engine_duration_seconds{strategy}.
  void RecordCompute(absl::string_view head_id, absl::string_view strategy, int64_t tokens,
                     double engine_seconds);
  // flce_received_bytes_total{rpc} / flce_sent_bytes_total{rpc}: tensor
  // payload bytes in messages.
  void AddReceivedBytes(absl::string_view rpc, int64_t bytes);
  void AddSentBytes(absl::string_view rpc, int64_t bytes);
  // flce_inflight_requests{rpc}.
  void InflightAdd(absl::string_view rpc, double delta);
  // Gauges sampled by the server's housekeeping thread.
  struct Snapshot {
    int64_t heads = 0;
    int64_t sessions = 0;
    int64_t sessions_with_pending = 0;
    int64_t workspace_peak_bytes = 0;
    int64_t workspace_budget_bytes = 0;
    int64_t gpu_memory_used = 0;
    int64_t gpu_memory_total = 0;
  };
  void SetGauges(const Snapshot& snapshot);
  // flce_head_weight_bytes{head}: exactly these heads (unloaded ones vanish).
  void SetHeadWeights(const std::map<std::string, int64_t>& bytes_by_head);

  // The port the exposer listens on, 0 without one.
  int port() const { return port_; }

 private:
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* tokens_ = nullptr;
  prometheus::Family<prometheus::Histogram>* duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* engine_duration_ = nullptr;
  prometheus::Family<prometheus::Gauge>* inflight_ = nullptr;
  prometheus::Family<prometheus::Counter>* received_ = nullptr;
  prometheus::Family<prometheus::Counter>* sent_ = nullptr;
  prometheus::Family<prometheus::Gauge>* head_weight_ = nullptr;
  absl::Mutex head_weight_mu_;
  std::map<std::string, prometheus::Gauge*> head_weight_gauges_ ABSL_GUARDED_BY(head_weight_mu_);
  prometheus::Gauge* heads_ = nullptr;
  prometheus::Gauge* sessions_ = nullptr;
  prometheus::Gauge* sessions_pending_ = nullptr;
  prometheus::Gauge* workspace_in_use_ = nullptr;
  prometheus::Gauge* workspace_budget_ = nullptr;
  prometheus::Gauge* gpu_used_ = nullptr;
  prometheus::Gauge* gpu_total_ = nullptr;
  int port_ = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_METRICS_H_
