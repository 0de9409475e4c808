// Prometheus metrics of the server, behind one small class so the set can
// grow without touching the RPC code. Served by prometheus-cpp's pull
// Exposer on --metrics-host:--metrics-port (/metrics); with port 0 they are
// still counted but not served.
//
// /metrics has no authentication, so label values never name what a tenant
// chose: heads are labelled by id only when they are shared (loaded at start
// or by an admin); every tenant's private head counts under the one value
// kTenantHeads. Series of an unloaded head are removed, so the set of series
// is bounded by the heads resident now.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(auto metrics, Metrics::Create("127.0.0.1", 9464));
//   metrics->RecordRequest("Compute", grpc::StatusCode::OK, seconds);
#ifndef FLCE_SERVER_OBSERVE_METRICS_H_
#define FLCE_SERVER_OBSERVE_METRICS_H_

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

class ProcessCollector;

// The values of flce_region_refusals_total's reason label.
inline constexpr absl::string_view kRegionRefusalReasons[] = {
    "no_regions",        // the server takes none (--local-transports=none)
    "remote",            // the caller is on another host
    "tcp",               // same-uid rule: the caller came over TCP, not the Unix socket
    "other_uid",         // same-uid rule: the caller runs as another user
    "kind_not_offered",  // this kind is not offered (the server or connection has the other)
    "region_limit",      // the stream holds its most regions
    "tenant_cap",        // --max-region-mb reached
    "open_failed",       // the object or device memory could not be opened or mapped
    "invalid",           // a malformed registration
};

// The reason label of a messages call: MessagesReason's name, lower case,
// without its prefix ("asked", "no_room", ...); "unspecified" for a value
// this server does not know.
std::string MessagesReasonLabel(int reason);

class Metrics {
 public:
  // The `head` label value of every private (tenant-owned) head. Ids may hold
  // any printable character, so an admin could name a shared head so too;
  // its series would then add up with the tenants'.
  static constexpr absl::string_view kTenantHeads = "(tenant heads)";
  // The `head` label value of head_id owned by owner ("" = shared).
  static std::string HeadLabel(absl::string_view owner, absl::string_view head_id);

  // Serves /metrics on host:port (host an IPv4 address or a name resolving
  // to one, "0.0.0.0" = every interface: Debian's civetweb binds IPv4 only);
  // port 0: no exposer.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& host, int port);
  ~Metrics();

  // flce_requests_total{rpc,code} and flce_request_duration_seconds{rpc}.
  void RecordRequest(absl::string_view rpc, grpc::StatusCode code, double seconds);
  // flce_tokens_total{head,strategy} (head: HeadLabel(owner, head_id)) and
  // flce_engine_duration_seconds{strategy}.
  void RecordCompute(absl::string_view owner, absl::string_view head_id, absl::string_view strategy,
                     int64_t tokens, double engine_seconds);
  // flce_received_bytes_total{rpc} / flce_sent_bytes_total{rpc}: tensor
  // payload bytes in messages.
  void AddReceivedBytes(absl::string_view rpc, int64_t bytes);
  void AddSentBytes(absl::string_view rpc, int64_t bytes);
  // Compute data through a shared-memory region: direction "in" or "out".
  void AddSharedMemoryBytes(absl::string_view direction, int64_t bytes);
  void AddCudaIpcBytes(absl::string_view direction, int64_t bytes);
  void AddDataPlaneBytes(absl::string_view direction, int64_t bytes);
  // flce_compute_calls_total{transport,reason}: one per Compute call whose
  // header was accepted. transport: "messages_tcp", "messages_unix_socket",
  // "data_plane", "shm" or "cuda_ipc"; reason: why not a region (MessagesReasonLabel), "region"
  // for the last two.
  void RecordComputeTransport(absl::string_view transport, absl::string_view reason);
  // flce_region_refusals_total{reason}: a Regions stream or registration
  // refused (kRegionRefusalReasons).
  void RecordRegionRefusal(absl::string_view reason);
  // flce_optimizer_steps_total{outcome}: STEP_APPLIED, STEP_SKIPPED_...
  void RecordStep(absl::string_view outcome);
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
    int64_t optimizer_state_bytes = 0;  // every head's optimizer state
    int64_t held_rows_kept_bytes = 0;   // HeldRows::KeptBytes()
    int64_t receive_buffers_kept_bytes = 0;  // ReceiveBuffers::Shared().kept_bytes()
  };
  void SetGauges(const Snapshot& snapshot);
  // flce_head_weight_bytes{head}: exactly these head labels (HeadLabel);
  // the flce_tokens_total series of labels not among them are removed too
  // (a call that finished on a head after its unload recreates its series
  // until this next runs).
  void SetHeadWeights(const std::map<std::string, int64_t>& bytes_by_head);
  // Removes every series of one head label at once (a shared head unloaded).
  void ForgetHead(const std::string& label);

  // The text /metrics serves (for tests, and without an exposer).
  std::string Text() const;

  // The port the exposer listens on, 0 without one.
  int port() const { return port_; }

 private:
  Metrics() = default;

  void RemoveHeadLocked(const std::string& label) ABSL_EXCLUSIVE_LOCKS_REQUIRED(head_mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ProcessCollector> process_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* tokens_ = nullptr;
  prometheus::Family<prometheus::Histogram>* duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* engine_duration_ = nullptr;
  prometheus::Family<prometheus::Gauge>* inflight_ = nullptr;
  prometheus::Family<prometheus::Counter>* received_ = nullptr;
  prometheus::Family<prometheus::Counter>* sent_ = nullptr;
  prometheus::Family<prometheus::Counter>* shared_memory_ = nullptr;
  prometheus::Family<prometheus::Counter>* cuda_ipc_ = nullptr;
  prometheus::Family<prometheus::Counter>* data_plane_ = nullptr;
  prometheus::Family<prometheus::Counter>* compute_transports_ = nullptr;
  prometheus::Family<prometheus::Counter>* region_refusals_ = nullptr;
  prometheus::Family<prometheus::Gauge>* head_weight_ = nullptr;
  // Guards the per-head series: a counter must not be removed between a
  // compute call finding it and incrementing it.
  absl::Mutex head_mu_;
  std::map<std::string, prometheus::Gauge*> head_weight_gauges_ ABSL_GUARDED_BY(head_mu_);
  // flce_tokens_total series by head label (one per strategy used).
  std::map<std::string, std::map<std::string, prometheus::Counter*>> token_counters_
      ABSL_GUARDED_BY(head_mu_);
  prometheus::Gauge* heads_ = nullptr;
  prometheus::Gauge* sessions_ = nullptr;
  prometheus::Gauge* sessions_pending_ = nullptr;
  prometheus::Gauge* workspace_peak_ = nullptr;
  prometheus::Gauge* workspace_budget_ = nullptr;
  prometheus::Gauge* gpu_used_ = nullptr;
  prometheus::Gauge* gpu_total_ = nullptr;
  prometheus::Gauge* optimizer_state_ = nullptr;
  prometheus::Gauge* held_rows_kept_ = nullptr;
  prometheus::Gauge* receive_buffers_kept_ = nullptr;
  prometheus::Family<prometheus::Counter>* steps_ = nullptr;
  int port_ = 0;
};

}  // namespace flce::server

#endif  // FLCE_SERVER_OBSERVE_METRICS_H_
