#include "agent/peers/peer_tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace ferry {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a PEM file (or cannot be read)"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<PeerTls> PeerTls::Load(const AgentConfig& config) {
  PeerTls tls;
  const int given = !config.peer_tls_cert.empty() + !config.peer_tls_key.empty() + !config.peer_tls_ca.empty();
  if (given == 0) {
    tls.server = grpc::InsecureServerCredentials();
    tls.channel = grpc::InsecureChannelCredentials();
    return tls;
  }
  if (given != 3) {
    return absl::InvalidArgumentError("--peer_tls_cert, --peer_tls_key and --peer_tls_ca go together: give all three");
  }
  FERRY_ASSIGN_OR_RETURN(std::string cert, ReadPem(config.peer_tls_cert, "--peer_tls_cert"));
  FERRY_ASSIGN_OR_RETURN(std::string key, ReadPem(config.peer_tls_key, "--peer_tls_key"));
  FERRY_ASSIGN_OR_RETURN(std::string ca, ReadPem(config.peer_tls_ca, "--peer_tls_ca"));

  grpc::SslServerCredentialsOptions server(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  server.pem_root_certs = ca;
  server.pem_key_cert_pairs.push_back({key, cert});
  tls.server = grpc::SslServerCredentials(server);

  grpc::SslCredentialsOptions channel;
  channel.pem_root_certs = ca;
  channel.pem_private_key = key;
  channel.pem_cert_chain = cert;
  tls.channel = grpc::SslCredentials(channel);
  tls.channel_args.SetSslTargetNameOverride(config.peer_tls_server_name);
  tls.enabled = true;
  return tls;
}

}  // namespace ferry
