#include "agent/common/thread_name.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

namespace ferry {
namespace {

// What /proc shows for the calling thread (what top -H and perf read).
std::string OwnThreadName() {
  std::ifstream comm("/proc/self/task/" + std::to_string(syscall(SYS_gettid)) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

TEST_CASE("a thread named by NameThisThread shows that name, its first 15 bytes if longer") {
  std::string short_name, long_name;
  std::thread([&] {
    NameThisThread("ferry-nic");
    short_name = OwnThreadName();
    NameThisThread("ferry-gpu12-done-and-more");
    long_name = OwnThreadName();
  }).join();
  CHECK(short_name == "ferry-nic");
  CHECK(long_name == "ferry-gpu12-don");
}

TEST_CASE("without a name a thread keeps its creator's") {
  NameThisThread("ferry-creator");
  std::string inherited;
  std::thread([&] { inherited = OwnThreadName(); }).join();
  CHECK(inherited == "ferry-creator");
}

}  // namespace
}  // namespace ferry
