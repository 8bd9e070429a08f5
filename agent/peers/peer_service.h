// PeerService: the agent-to-agent API (ferry.v1.Peer) on --peer_address.
//
// Serves other agents: the handshake, OpenRegion (region id + capability token ->
// bounds and per-NIC remote keys; the token is compared in constant time and a wrong
// one learns nothing about the region), Notify (bytes landed: count them and notify the
// region's owner; or a notified write begins: InboundWrites holds it until it ends) and
// Ping. The same NotifyRequest also arrives as a fabric message
// (AcceptMessage, from the NIC workers) and is checked the same way. Raw keys leave the
// agent only through OpenRegion, only to an agent that presented the region's token.
#ifndef FERRY_AGENT_PEERS_PEER_SERVICE_H_
#define FERRY_AGENT_PEERS_PEER_SERVICE_H_

#include <optional>
#include <string>
#include <vector>

#include "agent/common/token.h"
#include "agent/fabric/fabric_nic.h"
#include "agent/memory/region_table.h"
#include "agent/memory/write_windows.h"
#include "agent/metrics/metrics.h"
#include "agent/peers/inbound_writes.h"
#include "agent/peers/staging_provider.h"
#include "agent/transfer/transfer.h"
#include "proto/ferry/v1/peer.grpc.pb.h"

namespace ferry {

class PeerService final : public v1::Peer::Service {
 public:
  PeerService(uint64_t incarnation, std::vector<FabricNic*> nics, RegionTable* regions, TransferManager* transfers,
              Metrics* metrics);

  grpc::Status Handshake(grpc::ServerContext* ctx, const v1::HandshakeRequest* req,
                         v1::HandshakeResponse* resp) override;
  grpc::Status OpenRegion(grpc::ServerContext* ctx, const v1::OpenRegionRequest* req,
                          v1::OpenRegionResponse* resp) override;
  grpc::Status Notify(grpc::ServerContext* ctx, const v1::NotifyRequest* req, v1::NotifyResponse* resp) override;
  grpc::Status CommitStaged(grpc::ServerContext* ctx, const v1::CommitStagedRequest* req,
                            v1::CommitStagedResponse* resp) override;
  grpc::Status Ping(grpc::ServerContext* ctx, const v1::PingRequest* req, v1::PingResponse* resp) override;

  // A NotifyRequest that came as a fabric message (serialized; untrusted). Errors are
  // counted and logged: its sender is not waiting for an answer. Thread-safe.
  void AcceptMessage(absl::string_view bytes);

  // Serves regions the NICs cannot reach; without one they are refused. Set before
  // serving.
  void set_staging(StagingProvider* staging) { staging_ = staging; }
  // Holds announced writes (NotifyRequest.begin); without one, begins are refused. Set
  // before serving.
  void set_inbound(InboundWrites* inbound) { inbound_ = inbound; }
  // This agent's write windows; without them a window is never found. Set before serving.
  void set_windows(WriteWindows* windows) { windows_ = windows; }
  // Makes each writing agent keys of its own (Region::writers), which InboundWrites can
  // fence; without one, every writer gets the region's own keys. Set before serving.
  void set_registrar(RegionRegistrar* registrar) { registrar_ = registrar; }

 private:
  // The region a peer names, if the incarnation and token (the region's, or with
  // `window_id` the window's: open or recently closed) are right.
  absl::StatusOr<std::shared_ptr<Region>> Authorize(uint64_t incarnation, uint64_t region_id, const std::string& token,
                                                    uint64_t window_id = 0);
  // Authorize's two halves: the descriptor's incarnation and token, then the region.
  absl::StatusOr<Token> ParseToken(uint64_t incarnation, const std::string& token) const;
  absl::StatusOr<std::shared_ptr<Region>> Authorize(uint64_t region_id, const Token& token, uint64_t window_id);
  // As Authorize, for a write: a region in window mode only through an open window of
  // it, whose admission is returned (empty without a window). `tell_owner`: a write
  // with the region's own token into a region in window mode is told to its owner.
  struct WriteAccess {
    std::shared_ptr<Region> region;
    std::optional<WindowAdmission> window;
  };
  absl::StatusOr<WriteAccess> AuthorizeWrite(uint64_t incarnation, uint64_t region_id, const std::string& token,
                                             uint64_t window_id, bool tell_owner);
  grpc::Status Reply(const char* api, const absl::Status& s);
  // Counts and delivers a Notify, however it came (`via`: "rpc", "fabric_message").
  absl::Status Accept(const v1::NotifyRequest& req, const char* via);

  const uint64_t incarnation_;
  const std::vector<FabricNic*> nics_;
  RegionTable* regions_;
  TransferManager* transfers_;
  Metrics* metrics_;
  std::vector<prometheus::Counter*> rx_bytes_;  // per NIC
  StagingProvider* staging_ = nullptr;
  InboundWrites* inbound_ = nullptr;
  WriteWindows* windows_ = nullptr;
  RegionRegistrar* registrar_ = nullptr;
};

}  // namespace ferry

#endif  // FERRY_AGENT_PEERS_PEER_SERVICE_H_
