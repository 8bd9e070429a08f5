// grpc_echo: a bare gRPC unary echo over a unix socket — what one local API call costs
// with no ferry in it (the floor of `tools/bench.sh control`).
//
//   grpc_echo serve --socket=/tmp/echo.sock       # until killed; the synchronous
//                                                 # server, as the agent's local API
//   grpc_echo serve --socket=/tmp/cb.sock --callback   # gRPC's callback server
//   grpc_echo call --socket=/tmp/echo.sock --iters=2000   # prints "echo <p50_us> <p99_us>"
//   (--label names the row; --bytes=N sends N-byte requests, answered with at most 8)
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "tools/bench/echo.grpc.pb.h"

ABSL_FLAG(std::string, socket, "/tmp/ferry-echo.sock", "unix socket path");
ABSL_FLAG(int, iters, 2000, "call: calls measured (after 50 warm-up calls)");
ABSL_FLAG(bool, callback, false, "serve: gRPC's callback server instead of the synchronous one");
ABSL_FLAG(std::string, label, "echo", "call: the row's name");
ABSL_FLAG(int, bytes, 8, "call: request size (the answer echoes at most 8 of them, as a Write's answer is small)");

namespace {

class EchoService final : public ferry::bench::Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const ferry::bench::EchoMessage* req,
                    ferry::bench::EchoMessage* resp) override {
    resp->set_data(req->data().substr(0, 8));
    return grpc::Status::OK;
  }
};

class CallbackEchoService final : public ferry::bench::Echo::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* ctx, const ferry::bench::EchoMessage* req,
                                 ferry::bench::EchoMessage* resp) override {
    resp->set_data(req->data().substr(0, 8));
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

int Serve() {
  EchoService service;
  CallbackEchoService callback_service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + absl::GetFlag(FLAGS_socket), grpc::InsecureServerCredentials());
  if (absl::GetFlag(FLAGS_callback)) {
    builder.RegisterService(&callback_service);
  } else {
    builder.RegisterService(&service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    fprintf(stderr, "grpc_echo: cannot serve on %s\n", absl::GetFlag(FLAGS_socket).c_str());
    return 1;
  }
  server->Wait();
  return 0;
}

int Call() {
  auto channel = grpc::CreateChannel("unix:" + absl::GetFlag(FLAGS_socket), grpc::InsecureChannelCredentials());
  auto stub = ferry::bench::Echo::NewStub(channel);
  ferry::bench::EchoMessage req, resp;
  req.set_data(std::string(absl::GetFlag(FLAGS_bytes), 'x'));
  std::vector<double> us;
  const int iters = absl::GetFlag(FLAGS_iters);
  for (int i = 0; i < iters + 50; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const absl::Time t0 = absl::Now();
    grpc::Status s = stub->Echo(&ctx, req, &resp);
    if (!s.ok()) {
      fprintf(stderr, "grpc_echo: %s\n", s.error_message().c_str());
      return 1;
    }
    if (i >= 50) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  std::sort(us.begin(), us.end());
  printf("%s %.1f %.1f\n", absl::GetFlag(FLAGS_label).c_str(), us[us.size() / 2], us[us.size() * 99 / 100]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string mode = args.size() > 1 ? args[1] : "";
  if (mode == "serve") return Serve();
  if (mode == "call") return Call();
  fprintf(stderr, "usage: grpc_echo serve|call --socket=PATH [--iters=N]\n");
  return 2;
}
