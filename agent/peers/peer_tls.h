// PeerTls: credentials of the agent-to-agent service, plaintext or mutual TLS.
//
//   absl::StatusOr<PeerTls> tls = PeerTls::Load(config);   // reads the PEM files once
//   builder.AddListeningPort(config.peer_address, tls->server);
//   engine->StartPeers(self, tls->channel, tls->channel_args);
//
// With TLS every peer must present a certificate signed by the configured CA, both
// ways; certificates are checked for the cluster-wide name --peer_tls_server_name
// (agents are dialled by IP, which pod certificates rarely carry). Without TLS the
// peer API is plaintext: keep it on a private network (see SECURITY.md).
#ifndef FERRY_AGENT_PEERS_PEER_TLS_H_
#define FERRY_AGENT_PEERS_PEER_TLS_H_

#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "agent/config/config.h"

namespace ferry {

struct PeerTls {
  // INVALID_ARGUMENT when only some of the three files are given or one is unreadable.
  static absl::StatusOr<PeerTls> Load(const AgentConfig& config);

  bool enabled = false;
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> channel;
  grpc::ChannelArguments channel_args;
};

}  // namespace ferry

#endif  // FERRY_AGENT_PEERS_PEER_TLS_H_
