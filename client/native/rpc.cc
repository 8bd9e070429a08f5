#include "client/native/rpc.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace {

// A method's path and its registration with the channel, made once per path (gRPC's
// generated stubs keep one RpcMethod per method for the same reason); the RpcMethod
// points into `path`, so the pair never moves.
struct RegisteredMethod {
  RegisteredMethod(std::string method_path, const std::shared_ptr<grpc::Channel>& channel)
      : path(std::move(method_path)), rpc(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC, channel) {}
  const std::string path;
  const grpc::internal::RpcMethod rpc;
};

}  // namespace

struct ferry_rpc_channel {
  // Method paths registered at most: the agent's API has a few dozen; a caller making up
  // paths gets a registration per call beyond these rather than a table that only grows.
  static constexpr size_t kMaxMethods = 256;

  std::shared_ptr<grpc::Channel> channel;
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::unique_ptr<RegisteredMethod>> methods ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<grpc::ClientContext*> in_flight ABSL_GUARDED_BY(mu);
  bool shut_down ABSL_GUARDED_BY(mu) = false;

  // The registered method for `path` with `context` counted in flight (in `spare` when the
  // table is full), or null after shutdown.
  const grpc::internal::RpcMethod* Begin(const char* path, grpc::ClientContext* context,
                                         std::unique_ptr<RegisteredMethod>* spare) {
    absl::MutexLock lock(&mu);
    if (shut_down) return nullptr;
    in_flight.insert(context);
    auto it = methods.find(absl::string_view(path));  // no key made unless the path is new
    if (it != methods.end()) return &it->second->rpc;
    if (methods.size() >= kMaxMethods) {
      *spare = std::make_unique<RegisteredMethod>(path, channel);
      return &(*spare)->rpc;
    }
    return &methods.emplace(path, std::make_unique<RegisteredMethod>(path, channel)).first->second->rpc;
  }

  void End(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu);
    in_flight.erase(context);
  }

  void Shutdown() {
    absl::MutexLock lock(&mu);
    shut_down = true;
    for (grpc::ClientContext* context : in_flight) context->TryCancel();
    mu.Await(absl::Condition(
        +[](absl::flat_hash_set<grpc::ClientContext*>* calls) { return calls->empty(); }, &in_flight));
  }
};

namespace {

// What a call hands back to its thread (see the header's contract).
struct CallResult {
  std::string response;
  std::string message;
};

thread_local CallResult last_call;

int Fail(grpc::StatusCode code, std::string message, const char** out_message) {
  last_call.message = std::move(message);
  *out_message = last_call.message.c_str();
  return code;
}

// Deadlines beyond this are clamped to it: microseconds near 2^63 would overflow the
// clock's arithmetic into a deadline in the past.
constexpr int64_t kMaxTimeoutUs = int64_t{365} * 24 * 3600 * 1000000;

// What gRPC accepts as a method path ("/package.Service/Method") and as metadata (which it
// would otherwise abort the process on): the reason a value is refused, or empty.
std::string CheckMethod(const char* method) {
  if (method == nullptr || method[0] != '/') return "the method path must start with '/'";
  size_t n = 0, slashes = 0;
  for (const char* c = method; *c != '\0'; ++c, ++n) {
    if (*c <= 0x20 || *c >= 0x7f) return "the method path must be printable ASCII without spaces";
    slashes += *c == '/';
  }
  if (slashes != 2 || n > 512) return "the method path must be \"/package.Service/Method\", at most 512 bytes";
  return "";
}

std::string CheckMetadata(const char* key, const char* value) {
  if ((key == nullptr) != (value == nullptr)) return "md_key and md_value must both be set or both be NULL";
  if (key == nullptr) return "";
  const absl::string_view k(key);
  if (k.empty() || k.size() > 256 || absl::StartsWith(k, "grpc-")) {
    return "md_key must be 1..256 bytes and not start with \"grpc-\"";
  }
  for (char c : k) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.')) {
      return "md_key may hold only lowercase letters, digits, '-', '_' and '.'";
    }
  }
  if (absl::EndsWith(k, "-bin")) return "";  // binary values: any bytes
  for (const char* c = value; *c != '\0'; ++c) {
    if (*c < 0x20 || *c > 0x7e) return "md_value must be printable ASCII (or md_key end in \"-bin\")";
  }
  return "";
}

}  // namespace

extern "C" {

ferry_rpc_channel* ferry_rpc_open(const char* target) {
  if (target == nullptr || *target == '\0') return nullptr;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto* ch = new ferry_rpc_channel;
  ch->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  return ch;
}

void ferry_rpc_shutdown(ferry_rpc_channel* channel) {
  if (channel != nullptr) channel->Shutdown();
}

void ferry_rpc_free(ferry_rpc_channel* channel) {
  ferry_rpc_shutdown(channel);
  delete channel;
}

int ferry_rpc_call(ferry_rpc_channel* channel, const char* method, const char* request, size_t request_len,
                   const char* md_key, const char* md_value, int64_t timeout_us, const char** response,
                   size_t* response_len, const char** message) {
  if (response == nullptr || response_len == nullptr || message == nullptr) {
    return grpc::StatusCode::INVALID_ARGUMENT;  // nowhere to say why
  }
  *response = nullptr;
  *response_len = 0;
  *message = "";
  if (channel == nullptr || (request == nullptr && request_len > 0)) {
    return Fail(grpc::StatusCode::INVALID_ARGUMENT,
                "ferry_rpc_call: needs a channel, a method path starting with '/', and a request", message);
  }
  for (const std::string& why : {CheckMethod(method), CheckMetadata(md_key, md_value)}) {
    if (!why.empty()) return Fail(grpc::StatusCode::INVALID_ARGUMENT, "ferry_rpc_call: " + why, message);
  }
  grpc::ClientContext context;
  if (md_key != nullptr) context.AddMetadata(md_key, md_value);
  if (timeout_us > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::microseconds(std::min(timeout_us, kMaxTimeoutUs)));
  }
  grpc::Slice slice(request, request_len);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  std::unique_ptr<RegisteredMethod> unlisted;  // a path past the method table's bound
  const grpc::internal::RpcMethod* rpc = channel->Begin(method, &context, &unlisted);
  if (rpc == nullptr) return Fail(grpc::StatusCode::UNAVAILABLE, "this client is closed", message);
  grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel->channel.get(), *rpc, &context, request_buffer, &response_buffer);
  channel->End(&context);
  if (!status.ok()) return Fail(status.error_code(), status.error_message(), message);
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) {
    return Fail(grpc::StatusCode::INTERNAL, "ferry_rpc_call: could not read the response", message);
  }
  std::string& out = last_call.response;
  out.clear();
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  *response = out.data();
  *response_len = out.size();
  return grpc::StatusCode::OK;
}

}  // extern "C"
