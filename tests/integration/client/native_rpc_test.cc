// libferry_rpc (client/native/rpc.h) against a real gRPC server on a unix socket: calls,
// metadata, deadlines, refusals, and shutdown beside calls in flight (the part TSan and
// ASan check here; the Python client's tests cover it against live agents).
#include "client/native/rpc.h"

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "tests/testing/agent_process.h"
#include "tools/bench/echo.grpc.pb.h"

namespace ferry {
namespace {

constexpr char kEcho[] = "/ferry.bench.Echo/Echo";

// Echoes the request's data after the "who" metadata's value; "block" waits until the
// call is cancelled or 10 s pass.
class TestService final : public bench::Echo::Service {
 public:
  std::atomic<int> blocked{0};

  grpc::Status Echo(grpc::ServerContext* ctx, const bench::EchoMessage* req, bench::EchoMessage* resp) override {
    if (req->data() == "block") {
      blocked++;
      const absl::Time give_up = absl::Now() + absl::Seconds(10);
      while (!ctx->IsCancelled() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
      blocked--;
      return grpc::Status(grpc::StatusCode::ABORTED, "was not cancelled");
    }
    auto who = ctx->client_metadata().find("who");
    std::string prefix = who == ctx->client_metadata().end() ? "" : std::string(who->second.data(), who->second.size());
    resp->set_data(prefix + req->data());
    return grpc::Status::OK;
  }
};

class Server {
 public:
  Server() : dir_(testing::MakeTempDir("fy.rpc")), target_("unix:" + dir_ + "/echo.sock") {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(target_, grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~Server() {
    server_->Shutdown(std::chrono::system_clock::now());
    std::filesystem::remove_all(dir_);
  }
  const std::string& target() const { return target_; }
  TestService& service() { return service_; }

 private:
  std::string dir_, target_;
  TestService service_;
  std::unique_ptr<grpc::Server> server_;
};

std::string Request(const std::string& data) {
  bench::EchoMessage m;
  m.set_data(data);
  return m.SerializeAsString();
}

struct Answer {
  int code;
  std::string data;  // the echoed data when code is 0
  std::string message;
};

Answer Call(ferry_rpc_channel* ch, const std::string& data, const char* who = nullptr, int64_t timeout_us = 5000000,
            const char* method = kEcho) {
  const std::string req = Request(data);
  const char* resp = nullptr;
  const char* message = nullptr;
  size_t resp_len = 0;
  int code = ferry_rpc_call(ch, method, req.data(), req.size(), who ? "who" : nullptr, who, timeout_us, &resp,
                            &resp_len, &message);
  Answer a{code, "", message};
  bench::EchoMessage m;
  if (code == 0 && m.ParseFromArray(resp, static_cast<int>(resp_len))) a.data = m.data();
  return a;
}

TEST_CASE("a call carries its request and metadata and returns the answer") {
  Server server;
  ferry_rpc_channel* ch = ferry_rpc_open(server.target().c_str());
  REQUIRE(ch != nullptr);
  Answer a = Call(ch, "hello");
  CHECK(a.code == 0);
  CHECK(a.data == "hello");
  a = Call(ch, "x", "pod-7:");
  CHECK(a.code == 0);
  CHECK(a.data == "pod-7:x");
  ferry_rpc_free(ch);
}

TEST_CASE("bad arguments are refused with INVALID_ARGUMENT and a message") {
  Server server;
  CHECK(ferry_rpc_open(nullptr) == nullptr);
  CHECK(ferry_rpc_open("") == nullptr);
  ferry_rpc_channel* ch = ferry_rpc_open(server.target().c_str());
  const char* resp = nullptr;
  const char* message = nullptr;
  size_t len = 0;
  CHECK(ferry_rpc_call(nullptr, kEcho, "", 0, nullptr, nullptr, 0, &resp, &len, &message) == 3);
  CHECK(std::string(message).find("method path") != std::string::npos);
  CHECK(ferry_rpc_call(ch, "Echo", "", 0, nullptr, nullptr, 0, &resp, &len, &message) == 3);
  CHECK(ferry_rpc_call(ch, nullptr, "", 0, nullptr, nullptr, 0, &resp, &len, &message) == 3);
  CHECK(ferry_rpc_call(ch, kEcho, nullptr, 4, nullptr, nullptr, 0, &resp, &len, &message) == 3);
  CHECK(ferry_rpc_call(ch, kEcho, "", 0, "who", nullptr, 0, &resp, &len, &message) == 3);
  CHECK(Call(ch, "x", nullptr, 5000000, "/ferry.bench.Echo/Nothing").code == 12);  // UNIMPLEMENTED
  ferry_rpc_free(ch);
}

TEST_CASE("arguments gRPC would abort or crash on are refused, and the process lives") {
  // Before, bad metadata made gRPC abort the caller's process, NULL out-parameters
  // segfaulted, and a timeout near 2^63 overflowed into an immediate DEADLINE_EXCEEDED.
  Server server;
  ferry_rpc_channel* ch = ferry_rpc_open(server.target().c_str());
  const std::string req = Request("x");
  const char* resp = nullptr;
  const char* message = nullptr;
  size_t len = 0;
  auto call = [&](const char* method, const char* key, const char* value) {
    return ferry_rpc_call(ch, method, req.data(), req.size(), key, value, 5000000, &resp, &len, &message);
  };
  CHECK(call(kEcho, "Who", "x") == 3);
  CHECK(std::string(message).find("md_key may hold only lowercase") != std::string::npos);
  CHECK(call(kEcho, "who am i", "x") == 3);
  CHECK(call(kEcho, "", "x") == 3);
  CHECK(call(kEcho, "grpc-timeout", "1S") == 3);
  CHECK(call(kEcho, "who", "line\nbreak") == 3);
  CHECK(std::string(message).find("md_value must be printable ASCII") != std::string::npos);
  CHECK(call(kEcho, "who-bin", "line\nbreak") == 0);  // binary metadata takes any bytes
  CHECK(call("/ferry.bench.Echo/Echo\n", nullptr, nullptr) == 3);
  CHECK(call("/no-service-part", nullptr, nullptr) == 3);
  CHECK(std::string(message).find("/package.Service/Method") != std::string::npos);
  CHECK(ferry_rpc_call(ch, kEcho, req.data(), req.size(), nullptr, nullptr, 0, nullptr, &len, &message) == 3);
  CHECK(ferry_rpc_call(ch, kEcho, req.data(), req.size(), nullptr, nullptr, 0, &resp, nullptr, &message) == 3);
  CHECK(ferry_rpc_call(ch, kEcho, req.data(), req.size(), nullptr, nullptr, 0, &resp, &len, nullptr) == 3);
  CHECK(Call(ch, "far", nullptr, INT64_MAX).code == 0);  // clamped, not overflowed
  CHECK(Call(ch, "far", nullptr, INT64_MAX - 5).data == "far");
  ferry_rpc_free(ch);
}

TEST_CASE("made-up method paths do not grow the channel's table without bound") {
  Server server;
  ferry_rpc_channel* ch = ferry_rpc_open(server.target().c_str());
  for (int i = 0; i < 600; ++i) {
    const std::string path = "/ferry.bench.Echo/Made" + std::to_string(i);
    REQUIRE(Call(ch, "x", nullptr, 5000000, path.c_str()).code == 12);  // UNIMPLEMENTED, every time
  }
  CHECK(Call(ch, "still").data == "still");
  ferry_rpc_free(ch);
}

TEST_CASE("a deadline ends a call with DEADLINE_EXCEEDED; a dead socket is UNAVAILABLE") {
  Server server;
  ferry_rpc_channel* ch = ferry_rpc_open(server.target().c_str());
  const absl::Time start = absl::Now();
  CHECK(Call(ch, "block", nullptr, 50000).code == 4);
  CHECK(absl::Now() - start < absl::Seconds(5));
  ferry_rpc_free(ch);
  ferry_rpc_channel* nowhere = ferry_rpc_open("unix:/tmp/fy.rpc.nothing-listens-here.sock");
  CHECK(Call(nowhere, "x", nullptr, 2000000).code == 14);
  ferry_rpc_free(nowhere);
}

TEST_CASE("shutdown cancels calls in flight on other threads and refuses later calls") {
  Server server;
  ferry_rpc_channel* ch = ferry_rpc_open(server.target().c_str());
  constexpr int kCallers = 4;
  std::vector<int> codes(kCallers, -1);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] { codes[i] = Call(ch, "block", nullptr, 30000000).code; });
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (server.service().blocked.load() < kCallers && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  REQUIRE(server.service().blocked.load() == kCallers);
  const absl::Time start = absl::Now();
  ferry_rpc_shutdown(ch);  // returns once no call is in flight
  CHECK(absl::Now() - start < absl::Seconds(5));
  for (std::thread& t : callers) t.join();
  for (int code : codes) CHECK(code == 1);  // CANCELLED
  Answer later = Call(ch, "x");
  CHECK(later.code == 14);
  CHECK(later.message == "this client is closed");
  ferry_rpc_shutdown(ch);  // idempotent
  ferry_rpc_free(ch);
}

TEST_CASE("threads calling at once each read their own answer") {
  Server server;
  ferry_rpc_channel* ch = ferry_rpc_open(server.target().c_str());
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&, i] {
      const std::string mine = "caller-" + std::to_string(i);
      for (int n = 0; n < 200; ++n) {
        Answer a = Call(ch, mine + "/" + std::to_string(n));
        if (a.code != 0 || a.data != mine + "/" + std::to_string(n)) wrong++;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK(wrong.load() == 0);
  ferry_rpc_free(ch);
}

}  // namespace
}  // namespace ferry
