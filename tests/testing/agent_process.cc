#include "tests/testing/agent_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace ferry::testing {
namespace {

absl::StatusOr<pid_t> SpawnWithLog(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (log_path + ".out").c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  pid_t pid;
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::InternalError(absl::StrCat("posix_spawn ", argv[0], ": ", strerror(rc)));
  return pid;
}

// Waits for `pid` up to `timeout`; returns the decoded status or -1 on timeout.
int WaitPid(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return -2;
    if (absl::Now() > deadline) return -1;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace

std::string RunfilePath(const std::string& workspace_relative) {
  // Outside Bazel (the GPU suite on the GPU host): binaries side by side in one folder.
  const char* bindir = getenv("FERRY_BIN_DIR");
  if (bindir != nullptr) return absl::StrCat(bindir, "/", workspace_relative.substr(workspace_relative.rfind('/') + 1));
  const char* srcdir = getenv("TEST_SRCDIR");
  if (srcdir != nullptr) {
    std::string p = absl::StrCat(srcdir, "/ferry/", workspace_relative);
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return workspace_relative;
}

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
  char* d = mkdtemp(tmpl.data());
  return d != nullptr ? std::string(d) : "";
}

absl::StatusOr<std::string> WaitForFile(const std::string& path, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (access(path.c_str(), R_OK) != 0) {
    if (absl::Now() > deadline)
      return absl::DeadlineExceededError(absl::StrCat("no ", path, " after ", absl::FormatDuration(timeout)));
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::unique_ptr<AgentProcess>> AgentProcess::Start(const std::vector<std::string>& flags,
                                                                  const std::string& dir,
                                                                  const std::vector<std::string>& wrapper) {
  std::unique_ptr<AgentProcess> a(new AgentProcess());
  a->dir_ = dir.empty() ? MakeTempDir("fy") : dir;
  if (a->dir_.empty()) return absl::InternalError("mkdtemp failed");
  std::string ready_file = a->dir_ + "/ready";
  unlink(ready_file.c_str());
  std::vector<std::string> argv = wrapper;
  argv.insert(argv.end(), {RunfilePath("agent/main/ferryd"), "--socket=" + a->socket(), "--metrics_address=127.0.0.1:0",
                           "--ready_file=" + ready_file});
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<pid_t> pid = SpawnWithLog(argv, a->dir_ + "/ferryd.log");
  if (!pid.ok()) return pid.status();
  a->pid_ = *pid;
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (access(ready_file.c_str(), R_OK) != 0) {
    int st = WaitPid(a->pid_, absl::ZeroDuration());
    if (st >= 0 || absl::Now() > deadline) {
      std::string log = a->Log();
      a->pid_ = -1;
      return absl::InternalError(absl::StrCat("ferryd did not become ready (status ", st, "): ", log));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::ifstream in(ready_file);
  std::string line;
  while (std::getline(in, line)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    a->ready_[kv.first] = kv.second;
  }
  return a;
}

bool AgentProcess::running() {
  if (pid_ < 0) return false;
  int st = WaitPid(pid_, absl::ZeroDuration());
  if (st >= 0) {
    exit_status_ = st;
    pid_ = -1;
    return false;
  }
  return true;
}

int AgentProcess::Stop(int sig, absl::Duration timeout) {
  if (pid_ < 0) return exit_status_;
  kill(pid_, sig);
  int st = WaitPid(pid_, timeout);
  if (st == -1) {
    kill(pid_, SIGKILL);
    WaitPid(pid_, absl::Seconds(5));
  }
  exit_status_ = st;
  pid_ = -1;
  return st;
}

std::string AgentProcess::Log() const {
  std::ifstream in(dir_ + "/ferryd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

AgentProcess::~AgentProcess() {
  if (pid_ > 0) {
    // A test passes only if its agents stayed healthy to the end: one that died on its
    // own (a crash after the test's last assertion, a sanitizer report) or that does not
    // stop cleanly on SIGTERM fails the test binary — unless the test already failed.
    int st = WaitPid(pid_, absl::ZeroDuration());
    if (st < 0) {
      kill(pid_, SIGTERM);
      st = WaitPid(pid_, absl::Seconds(20));
    }
    if (st < 0) {
      kill(pid_, SIGKILL);
      WaitPid(pid_, absl::Seconds(5));
    }
    if (st != 0 && std::uncaught_exceptions() == 0) {
      fprintf(stderr, "ferryd (pid %d) did not end cleanly: status %d. Its log:\n%s\n", pid_, st, Log().c_str());
      std::abort();
    }
  }
  if (!keep_dir_ && !dir_.empty()) {
    std::string cmd = "rm -rf '" + dir_ + "'";
    int ignored = system(cmd.c_str());
    (void)ignored;
  }
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                                                  const std::string& log_path) {
  absl::StatusOr<pid_t> pid = SpawnWithLog(argv, log_path);
  if (!pid.ok()) return pid.status();
  std::unique_ptr<ChildProcess> c(new ChildProcess());
  c->pid_ = *pid;
  return c;
}

int ChildProcess::Wait(absl::Duration timeout) {
  if (pid_ < 0) return status_;
  int st = WaitPid(pid_, timeout);
  if (st != -1) {
    status_ = st;
    pid_ = -1;
  }
  return st;
}

void ChildProcess::Kill(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    WaitPid(pid_, absl::Seconds(5));
  }
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path, absl::Duration timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to 127.0.0.1:", port, ": ", strerror(errno)));
  }
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError("send failed");
  }
  std::string resp;
  absl::Time deadline = absl::Now() + timeout;
  char buf[65536];
  for (;;) {
    int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) {
      close(fd);
      return absl::DeadlineExceededError("HTTP response timed out");
    }
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    resp.append(buf, n);
  }
  close(fd);
  size_t body = resp.find("\r\n\r\n");
  if (resp.compare(0, 12, "HTTP/1.1 200") != 0 && resp.compare(0, 12, "HTTP/1.0 200") != 0) {
    return absl::UnavailableError("HTTP status: " + resp.substr(0, resp.find("\r\n")));
  }
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

double MetricValue(const std::string& exposition, const std::string& name, const std::string& labels) {
  std::string key = labels.empty() ? name + " " : name + "{" + labels + "} ";
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.substr(0, key.size()) == key) return std::strtod(std::string(line.substr(key.size())).c_str(), nullptr);
  }
  return -1;
}

}  // namespace ferry::testing
