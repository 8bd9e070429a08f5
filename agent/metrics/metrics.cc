#include "agent/metrics/metrics.h"

#include <civetweb.h>

#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace ferry {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

}  // namespace

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double decade = 1e-5; decade < 10; decade *= 10) {
    b.push_back(decade);
    b.push_back(2.5 * decade);
    b.push_back(5 * decade);
  }
  b.push_back(10);
  return b;
}

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      transfer_bytes_(BuildCounter()
                          .Name("ferry_transfer_bytes_total")
                          .Help("Bytes moved by transfers, by direction (tx, rx), path and NIC")
                          .Register(*registry_)),
      transfers_(BuildCounter()
                     .Name("ferry_transfers_total")
                     .Help("Transfers completed, by path and final gRPC status code")
                     .Register(*registry_)),
      transfer_duration_(BuildHistogram()
                             .Name("ferry_transfer_duration_seconds")
                             .Help("Transfer latency from submission to completion")
                             .Register(*registry_)),
      op_duration_(BuildHistogram()
                       .Name("ferry_op_duration_seconds")
                       .Help("Latency of single fabric operations, post to completion, by NIC and traffic class")
                       .Register(*registry_)),
      ops_inflight_(BuildGauge()
                        .Name("ferry_ops_inflight")
                        .Help("Fabric operations posted and not yet completed")
                        .Register(*registry_)),
      eagain_(BuildCounter()
                  .Name("ferry_fabric_eagain_total")
                  .Help("Posts the provider refused with -FI_EAGAIN (retried)")
                  .Register(*registry_)),
      fabric_errors_(BuildCounter()
                         .Name("ferry_fabric_errors_total")
                         .Help("Fabric operations that completed with an error")
                         .Register(*registry_)),
      reconnects_(BuildCounter()
                      .Name("ferry_fabric_reconnects_total")
                      .Help("Connections to a peer the provider dropped (the next write reconnects)")
                      .Register(*registry_)),
      qos_bytes_(BuildCounter()
                     .Name("ferry_qos_bytes_total")
                     .Help("Bytes written over the fabric, by NIC and traffic class")
                     .Register(*registry_)),
      qos_queue_delay_(BuildHistogram()
                           .Name("ferry_qos_queue_delay_seconds")
                           .Help("Time from a transfer's submission to the post of each of its fabric ops, by NIC "
                                 "and traffic class")
                           .Register(*registry_)),
      qos_throttled_(BuildCounter()
                         .Name("ferry_qos_throttled_seconds_total")
                         .Help("Time pods' queued ops were held back by their rule's inflight or rate cap, by NIC "
                               "and traffic class (summed over pods)")
                         .Register(*registry_)),
      retries_(BuildCounter()
                   .Name("ferry_transfer_retries_total")
                   .Help("Transfers written a second time after their connection dropped")
                   .Register(*registry_)
                   .Add({})),
      regions_(BuildGauge().Name("ferry_regions").Help("Registered regions, by memory kind").Register(*registry_)),
      registered_bytes_(BuildGauge()
                            .Name("ferry_registered_bytes")
                            .Help("Bytes in registered regions, by memory kind")
                            .Register(*registry_)),
      registration_duration_(BuildHistogram()
                                 .Name("ferry_registration_duration_seconds")
                                 .Help("RegisterMemory latency: import, map and fabric registration")
                                 .Register(*registry_)),
      cache_hits_(BuildCounter()
                      .Name("ferry_registration_cache_hits_total")
                      .Help("Registrations served from the registration cache")
                      .Register(*registry_)
                      .Add({})),
      sessions_(BuildGauge().Name("ferry_sessions").Help("Live client sessions").Register(*registry_).Add({})),
      peers_(BuildGauge().Name("ferry_peers").Help("Known peer agents, by state").Register(*registry_)),
      staging_buffers_(BuildGauge()
                           .Name("ferry_staging_buffers")
                           .Help("Staging buffers this agent holds for initiators writing into its staged regions")
                           .Register(*registry_)
                           .Add({})),
      notifications_(BuildCounter()
                         .Name("ferry_notifications_total")
                         .Help("Notifications delivered to local region owners")
                         .Register(*registry_)
                         .Add({})),
      notifications_dropped_(BuildCounter()
                                 .Name("ferry_notifications_dropped_total")
                                 .Help("Notifications dropped because their receiver's queue was full (the next one "
                                       "it gets says how many: Notification.lost_before)")
                                 .Register(*registry_)
                                 .Add({})),
      peer_notifications_(BuildCounter()
                              .Name("ferry_peer_notifications_total")
                              .Help("Notifications peer agents sent for this agent's regions, by how they came "
                                    "(fabric_message, rpc)")
                              .Register(*registry_)),
      gpu_transfers_(BuildCounter()
                         .Name("ferry_gpu_transfers_total")
                         .Help("Node-local GPU transfers by device and how they were moved (copy_engine, kernel, "
                               "kernel_batched)")
                         .Register(*registry_)),
      errors_(BuildCounter()
                  .Name("ferry_errors_total")
                  .Help("API calls answered with an error, by API and gRPC status code")
                  .Register(*registry_)) {
  for (const char* kind : {"host", "cuda"}) {
    regions(kind).Set(0);
    registered_bytes(kind).Set(0);
  }
  for (const char* via : {"fabric_message", "rpc"}) {
    peer_notifications(via);
  }
}

void Metrics::SetNicInfo(const std::string& nic, const std::string& device, int numa_node,
                         const std::string& pcie_root) {
  BuildGauge()
      .Name("ferry_nic_info")
      .Help("A fabric NIC's place in the node's topology; always 1")
      .Register(*registry_)
      .Add({{"nic", nic},
            {"device", device},
            {"numa_node", numa_node >= 0 ? absl::StrCat(numa_node) : "unknown"},
            {"pcie_root", pcie_root}})
      .Set(1);
}

void Metrics::SetBuildInfo(const std::string& version, const std::string& libfabric_version,
                           const std::string& provider) {
  BuildGauge()
      .Name("ferry_build_info")
      .Help("Build information; always 1")
      .Register(*registry_)
      .Add({{"version", version}, {"libfabric_version", libfabric_version}, {"provider", provider}})
      .Set(1);
}

prometheus::Histogram& Metrics::transfer_duration(const std::string& path) {
  return transfer_duration_.Add({{"path", path}}, LatencyBuckets());
}

prometheus::Histogram& Metrics::qos_queue_delay(const std::string& nic, const std::string& cls) {
  return qos_queue_delay_.Add({{"nic", nic}, {"class", cls}}, LatencyBuckets());
}

prometheus::Histogram& Metrics::op_duration(const std::string& nic, const std::string& traffic_class) {
  return op_duration_.Add({{"nic", nic}, {"class", traffic_class}}, LatencyBuckets());
}

prometheus::Histogram& Metrics::registration_duration(const std::string& kind) {
  return registration_duration_.Add({{"kind", kind}}, LatencyBuckets());
}

const char* StatusCodeName(int code) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  if (code < 0 || code > 16) return "UNKNOWN";
  return kNames[code];
}

namespace {

int Reply(struct mg_connection* conn, int code, const char* content_type, const std::string& body) {
  mg_printf(conn, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", code,
            mg_get_response_code_text(conn, code), content_type, body.size());
  mg_write(conn, body.data(), body.size());
  return code;
}

}  // namespace

int MetricsServer::ServeMetrics(struct mg_connection* conn, void* self) {
  Metrics* metrics = static_cast<MetricsServer*>(self)->metrics_;
  metrics->RunScrapeHook();
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, metrics->registry()->Collect());
  return Reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", out.str());
}

int MetricsServer::ServeHealth(struct mg_connection* conn, void*) { return Reply(conn, 200, "text/plain", "ok\n"); }

int MetricsServer::ServeReady(struct mg_connection* conn, void* self) {
  absl::Status ready = static_cast<MetricsServer*>(self)->ready_();
  if (ready.ok()) return Reply(conn, 200, "text/plain", "ready\n");
  return Reply(conn, 503, "text/plain", absl::StrCat("not ready: ", ready.message(), "\n"));
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address, Metrics* metrics,
                                                                    ReadinessCheck ready) {
  std::unique_ptr<MetricsServer> server(new MetricsServer(metrics, std::move(ready)));
  mg_init_library(0);
  const char* options[] = {"listening_ports", address.c_str(), "num_threads", "2", nullptr};
  mg_callbacks callbacks{};
  server->ctx_ = mg_start(&callbacks, nullptr, options);
  if (server->ctx_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot serve metrics on ", address,
                                                      " (--metrics_address: is the port free and the address local?)"));
  }
  mg_set_request_handler(server->ctx_, "/metrics$", &MetricsServer::ServeMetrics, server.get());
  mg_set_request_handler(server->ctx_, "/healthz$", &MetricsServer::ServeHealth, server.get());
  mg_set_request_handler(server->ctx_, "/readyz$", &MetricsServer::ServeReady, server.get());
  mg_server_port ports[4] = {};
  if (mg_get_server_ports(server->ctx_, 4, ports) > 0) server->port_ = ports[0].port;
  return server;
}

MetricsServer::~MetricsServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);
  mg_exit_library();
}

}  // namespace ferry
