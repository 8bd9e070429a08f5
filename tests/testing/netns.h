// TestNetwork: hosts for multi-agent tests, each in its own network namespace.
//
//   TestNetwork net = TestNetwork::Create(/*hosts=*/3, /*nics_per_host=*/2);
//   printf("%s\n", net.description().c_str());   // says whether namespaces were used
//   net.host(0).nics   -> {"169.254.77.1", "169.254.78.1"}
//   net.host(0).wrapper -> {"ip", "netns", "exec", "ferry-<pid>-h0"} (prefix for argv)
//
// With root and iproute2, every host is a namespace joined to a per-NIC bridge in a
// private hub namespace by a veth pair, with link-local addresses (169.254.77+nic.0/24):
// test traffic never touches the machine's own interfaces. Otherwise it falls back to
// distinct loopback addresses (127.0.<nic>.<host+1>) and says so. The destructor
// deletes the namespaces; every command is bounded in time.
#ifndef FERRY_TESTS_TESTING_NETNS_H_
#define FERRY_TESTS_TESTING_NETNS_H_

#include <string>
#include <vector>

namespace ferry::testing {

struct TestHost {
  std::vector<std::string> nics;     // one IPv4 address per NIC
  std::vector<std::string> wrapper;  // argv prefix that runs a command on this host
  std::string ns;                    // namespace name, empty on loopback
};

class TestNetwork {
 public:
  static TestNetwork Create(int hosts, int nics_per_host);
  TestNetwork(TestNetwork&&) = default;
  ~TestNetwork();

  const TestHost& host(int i) const { return hosts_[i]; }
  bool namespaces() const { return !hub_.empty(); }
  const std::string& description() const { return description_; }
  // Brings NIC `nic` of host `i` down or up (namespaces only; returns false otherwise).
  bool SetLink(int i, int nic, bool up);

 private:
  TestNetwork() = default;
  void Teardown(int hosts);
  std::vector<TestHost> hosts_;
  std::string hub_;
  std::string description_;
};

// Runs a shell command with a time limit; returns its exit status.
int RunCommand(const std::string& command, int timeout_seconds = 10);

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_NETNS_H_
