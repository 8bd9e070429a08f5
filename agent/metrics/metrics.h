// Metrics: every Prometheus metric the agent exports, in one registry.
//
//   Metrics m;
//   m.SetBuildInfo("0.1.0", "1.17", "tcp;ofi_rxm");
//   m.transfers_total("local", "OK").Increment();
//   absl::StatusOr<std::unique_ptr<MetricsServer>> s =
//       MetricsServer::Start("127.0.0.1:9464", &m, [] { return absl::OkStatus(); });
//
// Names are an interface (dashboards and alerts use them): see the metrics table in
// README.md. Label values are bounded sets: never region ids, tokens,
// pids or transfer ids. Bandwidth is rate(ferry_transfer_bytes_total[1m]) in PromQL.
#ifndef FERRY_AGENT_METRICS_METRICS_H_
#define FERRY_AGENT_METRICS_METRICS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

struct mg_connection;
struct mg_context;

namespace ferry {

class Metrics {
 public:
  Metrics();
  // ferry_build_info; call once, when the fabric provider is known ("" without fabric).
  void SetBuildInfo(const std::string& version, const std::string& libfabric_version, const std::string& provider);

  // ferry_nic_info: where each fabric NIC is, so per-NIC series can be grouped by NUMA
  // node and PCIe root in PromQL (`* on(nic) group_left(numa_node) ferry_nic_info`).
  void SetNicInfo(const std::string& nic, const std::string& device, int numa_node, const std::string& pcie_root);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // `hook` runs before every scrape, on the HTTP server's thread, to refresh gauges that
  // are cheaper to count on demand than to keep current (peers by state). Whoever sets
  // it clears it (nullptr) before the state it reads goes away.
  void SetScrapeHook(std::function<void()> hook) {
    absl::MutexLock lock(&hook_mu_);
    scrape_hook_ = std::move(hook);
  }
  void RunScrapeHook() {
    absl::MutexLock lock(&hook_mu_);
    if (scrape_hook_) scrape_hook_();
  }

  // Children are created on first use and cached by prometheus-cpp; call these off the
  // per-op hot path and keep the reference.
  prometheus::Counter& transfer_bytes(const std::string& direction, const std::string& path, const std::string& nic) {
    return transfer_bytes_.Add({{"direction", direction}, {"path", path}, {"nic", nic}});
  }
  prometheus::Counter& transfers_total(const std::string& path, const std::string& status) {
    return transfers_.Add({{"path", path}, {"status", status}});
  }
  prometheus::Histogram& transfer_duration(const std::string& path);
  prometheus::Histogram& op_duration(const std::string& nic, const std::string& traffic_class);
  prometheus::Gauge& ops_inflight(const std::string& nic) { return ops_inflight_.Add({{"nic", nic}}); }
  prometheus::Counter& fabric_eagain(const std::string& nic) { return eagain_.Add({{"nic", nic}}); }
  prometheus::Counter& fabric_errors(const std::string& nic) { return fabric_errors_.Add({{"nic", nic}}); }
  prometheus::Counter& fabric_reconnects(const std::string& nic) { return reconnects_.Add({{"nic", nic}}); }
  // Per NIC and traffic class (agent/engine/op_scheduler.h): bytes written, how long ops
  // waited from their transfer's submission to their post, time a pod's cap held them.
  prometheus::Counter& qos_bytes(const std::string& nic, const std::string& cls) {
    return qos_bytes_.Add({{"nic", nic}, {"class", cls}});
  }
  prometheus::Histogram& qos_queue_delay(const std::string& nic, const std::string& cls);
  prometheus::Counter& qos_throttled_seconds(const std::string& nic, const std::string& cls) {
    return qos_throttled_.Add({{"nic", nic}, {"class", cls}});
  }
  prometheus::Counter& transfer_retries() { return retries_; }
  prometheus::Gauge& regions(const std::string& kind) { return regions_.Add({{"kind", kind}}); }
  prometheus::Gauge& registered_bytes(const std::string& kind) { return registered_bytes_.Add({{"kind", kind}}); }
  prometheus::Histogram& registration_duration(const std::string& kind);
  prometheus::Counter& registration_cache_hits() { return cache_hits_; }
  prometheus::Gauge& sessions() { return sessions_; }
  prometheus::Gauge& peers(const std::string& state) { return peers_.Add({{"state", state}}); }
  prometheus::Gauge& staging_buffers() { return staging_buffers_; }
  prometheus::Counter& notifications() { return notifications_; }
  prometheus::Counter& notifications_dropped() { return notifications_dropped_; }
  prometheus::Counter& peer_notifications(const std::string& via) { return peer_notifications_.Add({{"via", via}}); }
  // Node-local GPU transfers by how the GPU moved them: copy_engine (a copy call per
  // chunk), kernel (one gather/scatter launch), kernel_batched (one launch shared with
  // other transfers queued at the same time).
  prometheus::Counter& gpu_transfers(const std::string& device, const std::string& method) {
    return gpu_transfers_.Add({{"device", device}, {"method", method}});
  }
  prometheus::Counter& errors(const std::string& api, const std::string& code) {
    return errors_.Add({{"api", api}, {"code", code}});
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  absl::Mutex hook_mu_;
  std::function<void()> scrape_hook_ ABSL_GUARDED_BY(hook_mu_);
  prometheus::Family<prometheus::Counter>& transfer_bytes_;
  prometheus::Family<prometheus::Counter>& transfers_;
  prometheus::Family<prometheus::Histogram>& transfer_duration_;
  prometheus::Family<prometheus::Histogram>& op_duration_;
  prometheus::Family<prometheus::Gauge>& ops_inflight_;
  prometheus::Family<prometheus::Counter>& eagain_;
  prometheus::Family<prometheus::Counter>& fabric_errors_;
  prometheus::Family<prometheus::Counter>& reconnects_;
  prometheus::Family<prometheus::Counter>& qos_bytes_;
  prometheus::Family<prometheus::Histogram>& qos_queue_delay_;
  prometheus::Family<prometheus::Counter>& qos_throttled_;
  prometheus::Counter& retries_;
  prometheus::Family<prometheus::Gauge>& regions_;
  prometheus::Family<prometheus::Gauge>& registered_bytes_;
  prometheus::Family<prometheus::Histogram>& registration_duration_;
  prometheus::Counter& cache_hits_;
  prometheus::Gauge& sessions_;
  prometheus::Family<prometheus::Gauge>& peers_;
  prometheus::Gauge& staging_buffers_;
  prometheus::Counter& notifications_;
  prometheus::Counter& notifications_dropped_;
  prometheus::Family<prometheus::Counter>& peer_notifications_;
  prometheus::Family<prometheus::Counter>& gpu_transfers_;
  prometheus::Family<prometheus::Counter>& errors_;
};

// gRPC code name as used in status labels: "OK", "NOT_FOUND", ...
const char* StatusCodeName(int code);

// The buckets of every latency histogram: 10 µs .. 10 s, three per decade.
prometheus::Histogram::BucketBoundaries LatencyBuckets();

// Serves, over HTTP on one port:
//   /metrics  the registry in the Prometheus text format (prometheus-cpp's serializer)
//   /healthz  200 while the process answers at all (liveness)
//   /readyz   200 when `ready` returns OK, else 503 with its message (readiness: a
//             Kubernetes Service or the kubelet stops sending work to a draining agent)
class MetricsServer {
 public:
  using ReadinessCheck = std::function<absl::Status()>;

  // `address` is host:port; port 0 picks a free port (see port()). `ready` is called on
  // the server's threads, so it must be thread-safe and must not block.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address, Metrics* metrics,
                                                              ReadinessCheck ready);
  ~MetricsServer();
  int port() const { return port_; }

 private:
  MetricsServer(Metrics* metrics, ReadinessCheck ready) : metrics_(metrics), ready_(std::move(ready)) {}
  static int ServeMetrics(struct mg_connection* conn, void* self);
  static int ServeHealth(struct mg_connection* conn, void* self);
  static int ServeReady(struct mg_connection* conn, void* self);

  Metrics* const metrics_;
  const ReadinessCheck ready_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
};

}  // namespace ferry

#endif  // FERRY_AGENT_METRICS_METRICS_H_
