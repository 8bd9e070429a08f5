// pod_workload: a serving pod's use of the node agent, for the container test. Two
// containers, each run as the chart's docs tell workload pods to run (non-root, the
// socket group), meet through a shared directory:
//
//   pod_workload --role=receiver --exchange=/exchange --bytes=N
//   pod_workload --role=sender   --exchange=/exchange --bytes=N [--rounds=R]
//   pod_workload --role=writer   --bytes=N --rounds_after_restart=R   (across an agent's roll)
//
// The receiver registers N bytes of zeroed host memory and leaves its region's descriptor
// in EXCHANGE/region; the sender registers N bytes of a pattern, writes them into the
// receiver's region through the agent R times, waits for each, and leaves EXCHANGE/sent;
// the receiver then checks every byte. Each waits at most --wait_seconds for the other.
// Exits 0 only if every write succeeded and every byte arrived.
//
// The writer stays through an agent's restart (a `helm upgrade` rolling the DaemonSet):
// it writes a new pattern between two regions of its own, round after round, checking
// every byte; when a call fails with UNAVAILABLE (the agent went away) it reconnects,
// registers its memory again and goes on. Exits 0 once it has seen that failure and
// R more rounds succeeded, every byte of every round checked; 1 on any other error, on
// a corrupt byte, or after --wait_seconds.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"

ABSL_FLAG(std::string, socket, "/run/ferry/ferry.sock", "the agent's socket");
ABSL_FLAG(std::string, role, "", "receiver or sender");
ABSL_FLAG(std::string, exchange, "/exchange", "directory both containers mount");
ABSL_FLAG(uint64_t, bytes, 16 << 20, "bytes to move");
ABSL_FLAG(int, rounds, 1, "sender: how many times to write the whole buffer");
ABSL_FLAG(int, wait_seconds, 60, "how long to wait for the other container (writer: for the restart)");
ABSL_FLAG(int, rounds_after_restart, 10, "writer: rounds to write after reconnecting");

namespace ferry {
namespace {

uint64_t Pattern(uint64_t i) { return i * 0x9E3779B97F4A7C15ull + 0x5eedull; }

absl::Status WriteFileAtomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << data;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError(absl::StrCat("cannot rename to ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> AwaitFile(const std::string& path) {
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_seconds));
  while (absl::Now() < deadline) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::ostringstream s;
      s << in.rdbuf();
      return s.str();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("no ", path, " after ", absl::GetFlag(FLAGS_wait_seconds), " s"));
}

absl::Status Receive(Client& client, const std::string& exchange, uint64_t bytes) {
  absl::StatusOr<HostRegion> region = client.AllocateHost(bytes);
  if (!region.ok()) return region.status();
  absl::Status s = WriteFileAtomically(exchange + "/region", region->descriptor().SerializeAsString());
  if (!s.ok()) return s;
  absl::StatusOr<std::string> sent = AwaitFile(exchange + "/sent");
  if (!sent.ok()) return sent.status();
  const auto* words = reinterpret_cast<const uint64_t*>(region->buffer.data());
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    if (words[i] != Pattern(i)) {
      return absl::DataLossError(absl::StrCat("word ", i, " is ", words[i], ", expected ", Pattern(i)));
    }
  }
  printf("receiver: %llu bytes arrived intact\n", static_cast<unsigned long long>(bytes));
  return absl::OkStatus();
}

absl::Status Send(Client& client, const std::string& exchange, uint64_t bytes, int rounds) {
  absl::StatusOr<HostRegion> region = client.AllocateHost(bytes);
  if (!region.ok()) return region.status();
  auto* words = reinterpret_cast<uint64_t*>(region->buffer.data());
  for (uint64_t i = 0; i < bytes / 8; ++i) words[i] = Pattern(i);
  absl::StatusOr<std::string> wire = AwaitFile(exchange + "/region");
  if (!wire.ok()) return wire.status();
  v1::RegionDescriptor dst;
  if (!dst.ParseFromString(*wire)) return absl::DataLossError("the receiver's descriptor does not parse");
  for (int r = 0; r < rounds; ++r) {
    absl::StatusOr<uint64_t> id = client.Write(region->id(), dst, {{0, 0, bytes}});
    if (!id.ok()) return id.status();
    absl::StatusOr<v1::TransferResult> result = client.Wait(*id, absl::Seconds(30));
    if (!result.ok()) return result.status();
    if (result->code() != 0) return ResultStatus(*result);
  }
  printf("sender: %d writes of %llu bytes done\n", rounds, static_cast<unsigned long long>(bytes));
  return WriteFileAtomically(exchange + "/sent", "ok");
}

// One round: a pattern of `round` into src, src -> dst through the agent, dst checked.
absl::Status WriteRound(Client& client, HostRegion& src, HostRegion& dst, uint64_t bytes, uint64_t round) {
  auto* in = reinterpret_cast<uint64_t*>(src.buffer.data());
  for (uint64_t i = 0; i < bytes / 8; ++i) in[i] = Pattern(i + round);
  absl::StatusOr<uint64_t> id = client.Write(src.id(), dst.descriptor(), {{0, 0, bytes}});
  if (!id.ok()) return absl::Status(id.status().code(), absl::StrCat("Write: ", id.status().message()));
  absl::StatusOr<v1::TransferResult> result = client.Wait(*id, absl::Seconds(30));
  if (!result.ok()) return absl::Status(result.status().code(), absl::StrCat("Wait: ", result.status().message()));
  if (result->code() != 0) return ResultStatus(*result);
  const auto* out = reinterpret_cast<const uint64_t*>(dst.buffer.data());
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    if (out[i] != Pattern(i + round)) {
      return absl::DataLossError(absl::StrCat("round ", round, ": word ", i, " is ", out[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Incarnation(Client& client) {
  absl::StatusOr<v1::GetStatusResponse> status = client.GetStatus();
  if (!status.ok()) return status.status();
  return status->incarnation();
}

// Until the new agent has served a round, UNAVAILABLE means the old one is going (it
// refuses work while it drains) or gone: reconnect and register again.
absl::Status WriteAcrossRestart(Client& client, uint64_t bytes) {
  absl::StatusOr<HostRegion> src = client.AllocateHost(bytes);
  if (!src.ok()) return src.status();
  absl::StatusOr<HostRegion> dst = client.AllocateHost(bytes);
  if (!dst.ok()) return dst.status();
  absl::StatusOr<uint64_t> first_agent = Incarnation(client);
  if (!first_agent.ok()) return first_agent.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_seconds));
  const uint64_t wanted_after = absl::GetFlag(FLAGS_rounds_after_restart);
  uint64_t round = 0, before = 0, after = 0, failures = 0;
  bool on_new_agent = false;
  while (after < wanted_after) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("after ", absl::GetFlag(FLAGS_wait_seconds), " s: ", before,
                                                      " rounds before the restart, ", after, " after"));
    }
    absl::Status s = WriteRound(client, *src, *dst, bytes, ++round);
    if (s.ok()) {
      if (!on_new_agent) {
        if (++before == 1) printf("writer: first round done\n");
        fflush(stdout);
      } else {
        ++after;
      }
      continue;
    }
    if (s.code() != absl::StatusCode::kUnavailable || after > 0) return s;
    printf("writer: round %llu failed: %s\n", static_cast<unsigned long long>(round), s.ToString().c_str());
    ++failures;
    // Reconnect, and the same buffers registered again (the new agent knows nothing of
    // the old registrations); retried while the agent is away. A draining agent may
    // still take a session: rounds count as the new agent's only once it answers.
    auto rejoin = [&]() -> absl::Status {
      if (absl::Status r = client.Reconnect(absl::Seconds(10)); !r.ok()) return r;
      for (HostRegion* region : {&*src, &*dst}) {
        absl::StatusOr<v1::RegisterMemoryResponse> reg = client.RegisterHost(region->buffer);
        if (!reg.ok()) return reg.status();
        region->registration = *std::move(reg);
      }
      return absl::OkStatus();
    };
    absl::Status joined;
    do {
      absl::SleepFor(absl::Milliseconds(200));
      joined = rejoin();
    } while (joined.code() == absl::StatusCode::kUnavailable && absl::Now() < deadline);
    if (!joined.ok()) return joined;
    absl::StatusOr<uint64_t> agent = Incarnation(client);
    on_new_agent = agent.ok() && *agent != *first_agent;
  }
  absl::StatusOr<uint64_t> agent = Incarnation(client);
  if (!agent.ok()) return agent.status();
  if (*agent == *first_agent) return absl::FailedPreconditionError("the agent never restarted");
  printf(
      "writer: %llu rounds on the first agent, %llu on the next (after %llu failed calls), %llu bytes each, "
      "every byte checked\n",
      static_cast<unsigned long long>(before), static_cast<unsigned long long>(after),
      static_cast<unsigned long long>(failures), static_cast<unsigned long long>(bytes));
  return absl::OkStatus();
}

int Run() {
  const std::string role = absl::GetFlag(FLAGS_role);
  const uint64_t bytes = absl::GetFlag(FLAGS_bytes);
  if ((role != "receiver" && role != "sender" && role != "writer") || bytes == 0 || bytes % 8 != 0) {
    fprintf(stderr, "pod_workload: --role must be receiver, sender or writer and --bytes a positive multiple of 8\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(absl::GetFlag(FLAGS_socket));
  absl::Status s = client.status();
  if (s.ok()) {
    s = role == "receiver" ? Receive(**client, absl::GetFlag(FLAGS_exchange), bytes)
        : role == "sender" ? Send(**client, absl::GetFlag(FLAGS_exchange), bytes, absl::GetFlag(FLAGS_rounds))
                           : WriteAcrossRestart(**client, bytes);
  }
  if (!s.ok()) {
    fprintf(stderr, "pod_workload %s (uid %d, gid %d): %s\n", role.c_str(), getuid(), getgid(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
