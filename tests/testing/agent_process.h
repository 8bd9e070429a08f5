// AgentProcess: a real ferryd started as a separate process for integration tests.
//
//   auto agent = AgentProcess::Start({"--max_chunks_per_write=16"});
//   REQUIRE(agent.ok());
//   auto client = ferry::Client::Connect((*agent)->socket());
//   std::string metrics = HttpGet((*agent)->metrics_port(), "/metrics");
//   int code = (*agent)->Stop();      // SIGTERM, bounded wait; returns the exit status
//
// Sockets live under a short /tmp directory (unix socket paths are limited to 107
// bytes); metrics bind port 0. Every wait is bounded; the destructor SIGKILLs what is
// left and removes the directory.
#ifndef FERRY_TESTS_TESTING_AGENT_PROCESS_H_
#define FERRY_TESTS_TESTING_AGENT_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ferry::testing {

// Path of a binary built by Bazel and listed in the test's `data`, e.g. "agent/main/ferryd".
std::string RunfilePath(const std::string& workspace_relative);

// A fresh short directory under /tmp, removed by the caller (or AgentProcess).
std::string MakeTempDir(const std::string& prefix);

class AgentProcess {
 public:
  // `dir`: reuse a directory (e.g. to restart on the same socket); empty = a new one.
  // `wrapper`: argv prefix, e.g. {"ip", "netns", "exec", "ns1"}.
  static absl::StatusOr<std::unique_ptr<AgentProcess>> Start(const std::vector<std::string>& flags,
                                                             const std::string& dir = "",
                                                             const std::vector<std::string>& wrapper = {});
  ~AgentProcess();

  const std::string& dir() const { return dir_; }
  std::string socket() const { return dir_ + "/ferry.sock"; }
  pid_t pid() const { return pid_; }
  int metrics_port() const { return std::stoi(ready_.at("metrics_port")); }
  std::string ready(const std::string& key) const { return ready_.count(key) ? ready_.at(key) : ""; }

  // Sends `sig` and waits up to `timeout` for exit; returns the exit code, 128+signal if
  // killed by a signal, or -1 if it had to be SIGKILLed after the timeout.
  int Stop(int sig = 15, absl::Duration timeout = absl::Seconds(15));
  bool running();
  // The agent's stderr so far (for failure messages).
  std::string Log() const;
  // Keeps the directory on destruction (for a restart test).
  void KeepDir() { keep_dir_ = true; }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int exit_status_ = -1;
  bool keep_dir_ = false;
  std::map<std::string, std::string> ready_;
};

// A child process running `argv`; killed (SIGKILL) on destruction if still alive.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::vector<std::string>& argv,
                                                             const std::string& log_path);
  ~ChildProcess();
  pid_t pid() const { return pid_; }
  // Returns the exit status as AgentProcess::Stop does; -1 on timeout (process left alive).
  int Wait(absl::Duration timeout);
  void Kill(int sig);

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

// Waits until `path` exists (bounded). Returns its contents.
absl::StatusOr<std::string> WaitForFile(const std::string& path, absl::Duration timeout);

// HTTP GET on 127.0.0.1:port; returns the body, or an error (bounded by `timeout`).
absl::StatusOr<std::string> HttpGet(int port, const std::string& path, absl::Duration timeout = absl::Seconds(5));

// The value of the sample `name{labels}` in Prometheus text exposition, or -1 if absent.
// `labels` is the exact label text inside the braces, e.g. R"(kind="host")", or "" for none.
double MetricValue(const std::string& exposition, const std::string& name, const std::string& labels = "");

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_AGENT_PROCESS_H_
