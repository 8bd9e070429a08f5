// FERRY_CHECK / FERRY_DCHECK (agent/common/check.h): a failed check logs its condition
// and message and aborts; a passing one costs its condition only; FERRY_DCHECK does not
// even evaluate its condition in -c opt builds.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <catch2/catch.hpp>
#include "agent/common/check.h"

namespace ferry {
namespace {

struct Exit {
  int signal = 0;   // what ended the child, 0 if it exited
  std::string log;  // what it wrote on stderr
};

// Runs `body` in a child process and reports how it ended.
template <typename F>
Exit InChild(F body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    body();
    _exit(0);
  }
  close(fds[1]);
  Exit e;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) e.log.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  return e;
}

TEST_CASE("a failed FERRY_CHECK logs the condition and the message, then aborts") {
  Exit e = InChild([] {
    const int slots = 4;
    FERRY_CHECK(slots > 8) << "only " << slots << " slots";
  });
  CHECK(e.signal == SIGABRT);
  CHECK(e.log.find("check failed: slots > 8: only 4 slots") != std::string::npos);
  CHECK(e.log.find("check_test.cc:") != std::string::npos);
}

TEST_CASE("a passing FERRY_CHECK evaluates its condition once and goes on") {
  int evaluated = 0;
  FERRY_CHECK(++evaluated == 1) << "never formatted";
  CHECK(evaluated == 1);
}

TEST_CASE("FERRY_DCHECK is live in debug builds and not evaluated in -c opt") {
  int evaluated = 0;
  FERRY_DCHECK(++evaluated > 0);
#ifdef NDEBUG
  CHECK(evaluated == 0);
#else
  CHECK(evaluated == 1);
  Exit e = InChild([] { FERRY_DCHECK(1 + 1 == 3) << "arithmetic"; });
  CHECK(e.signal == SIGABRT);
  CHECK(e.log.find("check failed: 1 + 1 == 3: arithmetic") != std::string::npos);
#endif
}

}  // namespace
}  // namespace ferry
