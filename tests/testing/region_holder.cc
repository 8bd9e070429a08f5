// region_holder SOCKET COUNT SIZE READY_FILE: registers COUNT host regions of SIZE
// bytes, writes the first region's descriptor to READY_FILE.desc and then READY_FILE,
// then sleeps (at most 10 minutes) until killed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "client/cpp/ferry_client.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: region_holder SOCKET COUNT SIZE READY_FILE\n");
    return 2;
  }
  auto client = ferry::Client::Connect(argv[1]);
  if (!client.ok()) {
    fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<ferry::HostBuffer> buffers;
  for (int i = 0; i < atoi(argv[2]); ++i) {
    auto buf = ferry::HostBuffer::Create(strtoull(argv[3], nullptr, 10));
    if (!buf.ok()) return 1;
    auto reg = (*client)->RegisterHost(*buf);
    if (!reg.ok()) {
      fprintf(stderr, "%s\n", reg.status().ToString().c_str());
      return 1;
    }
    buffers.push_back(std::move(*buf));
    if (i == 0) std::ofstream(std::string(argv[4]) + ".desc", std::ios::binary) << reg->region().SerializeAsString();
  }
  std::string tmp = std::string(argv[4]) + ".tmp";
  { std::ofstream(tmp) << "ok\n"; }
  rename(tmp.c_str(), argv[4]);
  sleep(600);
  return 0;
}
