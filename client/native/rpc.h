// libferry_rpc: unary calls of the agent's local API from C, for clients whose own gRPC
// stack costs more than the call (the Python client loads it through ctypes: grpcio's
// unary call costs 1.5-3.5x the C++ library's, tools/bench/RESULTS.md "control path").
//
// Usage:
//   ferry_rpc_channel* ch = ferry_rpc_open("unix:/run/ferry/ferry.sock");
//   const char* resp; size_t resp_len; const char* msg;
//   int code = ferry_rpc_call(ch, "/ferry.v1.Agent/GetStatus", req, req_len,
//                             "ferry-session", token_hex, 30000000, &resp, &resp_len, &msg);
//   // code 0: resp[0, resp_len) is the serialized response; else msg is the status message.
//   ferry_rpc_shutdown(ch);   // cancels calls in flight; later calls fail at once
//   ferry_rpc_free(ch);       // once no thread is inside a call
//
// Contracts:
// - Requests and responses are serialized protobuf messages; the library knows no
//   message types, only method paths. Checking them is the caller's and the agent's job.
// - `resp` and `msg` point into storage owned by the calling thread; they stay valid
//   until that thread's next ferry_rpc_call. Copy them before calling again.
// - A channel is safe to use from many threads at once. ferry_rpc_shutdown may run
//   beside calls (they end CANCELLED); ferry_rpc_free only after every call returned.
// - The call blocks the calling thread only (callers from Python: ctypes releases the GIL).
#ifndef FERRY_CLIENT_NATIVE_RPC_H_
#define FERRY_CLIENT_NATIVE_RPC_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_rpc_channel ferry_rpc_channel;

// A channel to `target` (a gRPC target: "unix:/path"); NULL if `target` is NULL or empty.
// Connects lazily, as gRPC channels do: a dead socket shows as UNAVAILABLE on a call.
ferry_rpc_channel* ferry_rpc_open(const char* target);

// Cancels every call in flight on `channel` (they return CANCELLED) and fails every later
// call with UNAVAILABLE; returns once no call is in flight. Idempotent.
void ferry_rpc_shutdown(ferry_rpc_channel* channel);

// Frees `channel` (shut down first if it was not). No call may be in flight or follow.
void ferry_rpc_free(ferry_rpc_channel* channel);

// One unary call of `method` (a full path, "/package.Service/Method") with metadata
// `md_key`: `md_value` (both NULL: none) and a deadline `timeout_us` from now (<= 0: none;
// clamped to a year). Returns the gRPC status code. Arguments gRPC would not take (a key
// with capitals or spaces, a value with control characters unless the key ends in "-bin",
// a malformed path) are refused with INVALID_ARGUMENT and a message saying which; NULL
// `response`, `response_len` or `message` with INVALID_ARGUMENT alone.
int ferry_rpc_call(ferry_rpc_channel* channel, const char* method, const char* request, size_t request_len,
                   const char* md_key, const char* md_value, int64_t timeout_us, const char** response,
                   size_t* response_len, const char** message);

#ifdef __cplusplus
}
#endif

#endif  // FERRY_CLIENT_NATIVE_RPC_H_
