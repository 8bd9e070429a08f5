#include "agent/topology/cpu_list.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ferry {

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list) {
  constexpr int kMaxCpu = 65535;
  std::vector<int> cpus;
  for (absl::string_view range : absl::StrSplit(absl::StripAsciiWhitespace(list), ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> ends = absl::StrSplit(range, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    const bool single = range.find('-') == absl::string_view::npos;
    if (!absl::SimpleAtoi(ends.first, &lo) || (!single && !absl::SimpleAtoi(ends.second, &hi))) {
      return absl::InvalidArgumentError(absl::StrCat("bad cpu list '", list, "': '", range, "'"));
    }
    if (single) hi = lo;
    if (lo < 0 || hi < lo || hi > kMaxCpu) {
      return absl::InvalidArgumentError(absl::StrCat("bad cpu range '", range, "' in '", list, "'"));
    }
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    absl::StrAppend(&out, cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> ProcessCpus(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status") : absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "Cpus_allowed_list:")) {
      absl::StatusOr<std::vector<int>> cpus = ParseCpuList(rest);
      return cpus.ok() ? *cpus : std::vector<int>();
    }
  }
  return {};
}

}  // namespace ferry
