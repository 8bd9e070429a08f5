// Agent-to-agent mTLS between real ferryd processes on loopback, with a throwaway CA
// and certificates made by openssl at test time: TLS agents talk to each other, and
// refuse plaintext agents and agents whose certificate another CA signed.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/cpp/ferry_client.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/fabric_agent.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using testing::AgentProcess;
using testing::MakePod;
using testing::TestPod;

void Run(const std::string& cmd) {
  INFO(cmd);
  REQUIRE(std::system((cmd + " >/dev/null 2>&1").c_str()) == 0);
}

// A CA in `dir`/`ca`.{pem,key}.
void MakeCa(const std::string& dir, const std::string& ca) {
  Run(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=", ca,
                   " -keyout ", dir, "/", ca, ".key -out ", dir, "/", ca, ".pem"));
}

// `name`.{pem,key} signed by `ca`, with the DNS name every agent certificate carries.
void MakeCert(const std::string& dir, const std::string& ca, const std::string& name) {
  std::ofstream(dir + "/san.ext") << "subjectAltName=DNS:ferry-peer\n";
  Run(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=", name, " -keyout ",
                   dir, "/", name, ".key -out ", dir, "/", name, ".csr"));
  Run(absl::StrCat("openssl x509 -req -days 1 -in ", dir, "/", name, ".csr -CA ", dir, "/", ca, ".pem -CAkey ", dir,
                   "/", ca, ".key -CAcreateserial -extfile ", dir, "/san.ext -out ", dir, "/", name, ".pem"));
}

std::vector<std::string> TlsFlags(const std::string& dir, const std::string& ca, const std::string& name) {
  return {"--peer_tls_cert=" + dir + "/" + name + ".pem", "--peer_tls_key=" + dir + "/" + name + ".key",
          "--peer_tls_ca=" + dir + "/" + ca + ".pem"};
}

std::unique_ptr<AgentProcess> StartOn(const std::string& addr, std::vector<std::string> flags) {
  flags.push_back("--transfer_timeout_ms=5000");
  return testing::StartFabricAgent(testing::TestHost{{addr}, {}, ""}, flags);
}

absl::Status WriteTo(TestPod& from, const TestPod& to) {
  auto r = from.client->WriteAndWait(testing::ChunkWrite(from, to.reg.region(), 0, 0, 4096), absl::Seconds(20));
  return r.ok() ? ResultStatus(*r) : r.status();
}

TEST_CASE("mTLS peers: TLS agents write to each other; plaintext and foreign-CA agents are refused both ways") {
  const std::string dir = testing::MakeTempDir("ftls");
  MakeCa(dir, "ca");
  MakeCa(dir, "other-ca");
  MakeCert(dir, "ca", "a");
  MakeCert(dir, "ca", "b");
  MakeCert(dir, "other-ca", "rogue");

  auto a = StartOn("127.0.0.1", TlsFlags(dir, "ca", "a"));
  auto b = StartOn("127.0.0.2", TlsFlags(dir, "ca", "b"));
  auto plain = StartOn("127.0.0.3", {});
  auto rogue = StartOn("127.0.0.4", TlsFlags(dir, "other-ca", "rogue"));
  TestPod pa = MakePod(a->socket(), 1 << 16, 0xAA);
  TestPod pb = MakePod(b->socket(), 1 << 16, 0xBB);
  TestPod pp = MakePod(plain->socket(), 1 << 16, 0xCC);
  TestPod pr = MakePod(rogue->socket(), 1 << 16, 0xDD);

  absl::Status s = WriteTo(pa, pb);
  INFO(s.ToString() << "\n" << a->Log());
  CHECK(s.ok());
  CHECK(pb.buf->data()[0] == 0xAA);

  s = WriteTo(pp, pb);  // plaintext client, TLS server
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  s = WriteTo(pa, pp);  // TLS client, plaintext server
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  s = WriteTo(pr, pb);  // certificate from another CA, either way
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  s = WriteTo(pa, pr);
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(pb.buf->data()[4096] == 0xBB);
  CHECK(pp.buf->data()[0] == 0xCC);
  CHECK(pr.buf->data()[0] == 0xDD);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("mTLS flags go together and must name PEM files") {
  const std::string dir = testing::MakeTempDir("ftls");
  auto half = AgentProcess::Start({"--peer_address=127.0.0.1:0", "--fabric_iface=127.0.0.1",
                                   "--fabric_provider=tcp;ofi_rxm", "--peer_tls_cert=" + dir + "/x.pem"});
  REQUIRE_FALSE(half.ok());
  CHECK(std::string(half.status().message()).find("go together") != std::string::npos);
  std::ofstream(dir + "/junk.pem") << "not a certificate\n";
  auto junk = AgentProcess::Start({"--peer_address=127.0.0.1:0", "--fabric_iface=127.0.0.1",
                                   "--fabric_provider=tcp;ofi_rxm", "--peer_tls_cert=" + dir + "/junk.pem",
                                   "--peer_tls_key=" + dir + "/junk.pem", "--peer_tls_ca=" + dir + "/junk.pem"});
  REQUIRE_FALSE(junk.ok());
  CHECK(std::string(junk.status().message()).find("is not a PEM file") != std::string::npos);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ferry
