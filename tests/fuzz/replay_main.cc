// Runs a fuzz target without libFuzzer (the gcc builds): over every file of the seed
// corpus given as arguments, then over pseudo-random mutations of them, so the targets
// build and run in every test pass. tools/fuzz.sh runs them under libFuzzer.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    inputs.push_back(ss.str());
  }
  if (inputs.empty()) inputs.push_back(std::string(64, '\0'));
  std::mt19937_64 rng(42);
  size_t runs = 0;
  for (const std::string& s : inputs) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++runs;
    for (int m = 0; m < 2000; ++m) {  // flip, insert and truncate bytes
      std::string t = s;
      for (int k = 0; k < 1 + static_cast<int>(rng() % 8); ++k) {
        switch (rng() % 3) {
          case 0:
            if (!t.empty()) t[rng() % t.size()] ^= static_cast<char>(1 << (rng() % 8));
            break;
          case 1:
            t.insert(t.begin() + (t.empty() ? 0 : rng() % t.size()), static_cast<char>(rng()));
            break;
          default:
            if (!t.empty()) t.resize(rng() % t.size());
        }
      }
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(t.data()), t.size());
      ++runs;
    }
  }
  printf("%zu inputs ran without a crash\n", runs);
  return 0;
}
