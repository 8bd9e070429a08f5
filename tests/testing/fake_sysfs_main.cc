// fake_sysfs SPEC DIR: writes the fake sysfs tree SPEC describes (see fake_sysfs.h) under
// DIR, for running ferryd --sysfs_root=DIR by hand or from a script (the GPU suite).
#include <cstdio>

#include "tests/testing/fake_sysfs.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: fake_sysfs SPEC DIR\n");
    return 2;
  }
  absl::Status s = ferry::testing::WriteFakeSysfsFromFile(argv[1], argv[2]);
  if (!s.ok()) {
    fprintf(stderr, "fake_sysfs: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
