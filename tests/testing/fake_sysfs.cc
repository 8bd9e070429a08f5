#include "tests/testing/fake_sysfs.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ferry::testing {
namespace {

namespace fs = std::filesystem;

absl::Status WriteFile(const fs::path& p, const std::string& text) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  std::ofstream out(p);
  out << text << "\n";
  return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", p.string()));
}

absl::Status Link(const fs::path& link, const std::string& device_path) {
  std::error_code ec;
  fs::create_directories(link.parent_path(), ec);
  // link is <root>/a/b/c: three levels below the root.
  fs::create_directory_symlink(fs::path("../../../devices") / device_path, link, ec);
  return ec ? absl::InternalError(absl::StrCat("symlink ", link.string(), ": ", ec.message())) : absl::OkStatus();
}

}  // namespace

absl::Status WriteFakeSysfs(absl::string_view spec, const std::string& root_dir) {
  const fs::path root(root_dir);
  for (absl::string_view raw : absl::StrSplit(spec, '\n')) {
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    auto bad = [&] { return absl::InvalidArgumentError(absl::StrCat("fake sysfs: bad line '", line, "'")); };
    if (f[0] == "node") {
      if (f.size() != 3) return bad();
      absl::Status s = WriteFile(root / "devices/system/node" / ("node" + f[1]) / "cpulist", f[2]);
      if (!s.ok()) return s;
      continue;
    }
    const bool gpu = f[0] == "gpu";
    if (!gpu && f[0] != "ib" && f[0] != "net") return bad();
    const size_t first_opt = gpu ? 2 : 3;
    if (f.size() < first_opt) return bad();
    const std::string path = f[first_opt - 1];
    std::map<std::string, std::string> opt;
    for (size_t i = first_opt; i + 1 < f.size(); i += 2) opt[f[i]] = f[i + 1];
    if ((f.size() - first_opt) % 2 != 0) return bad();

    const fs::path dev = root / "devices" / path;
    const std::string address = fs::path(path).filename().string();
    const std::string vendor = gpu ? "0x10de" : "0x15b3";
    const std::string cls = gpu ? "0x030200" : (f[0] == "ib" ? "0x020700" : "0x020000");
    for (const auto& [file, text] :
         std::map<std::string, std::string>{{"numa_node", opt.count("numa") ? opt["numa"] : "-1"},
                                            {"vendor", vendor},
                                            {"class", cls},
                                            {"device", opt.count("device") ? opt["device"] : "0x1021"}}) {
      absl::Status s = WriteFile(dev / file, text);
      if (!s.ok()) return s;
    }
    absl::Status s = Link(root / "bus/pci/devices" / address, path);
    if (s.ok() && f[0] == "ib") s = Link(root / "class/infiniband" / f[1] / "device", path);
    if (s.ok() && f[0] == "net") s = Link(root / "class/net" / f[1] / "device", path);
    if (s.ok() && opt.count("netdev")) {
      fs::create_directories(dev / "net" / opt["netdev"]);
      s = Link(root / "class/net" / opt["netdev"] / "device", path);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WriteFakeSysfsFromFile(const std::string& spec_path, const std::string& root) {
  std::ifstream in(spec_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", spec_path));
  std::stringstream text;
  text << in.rdbuf();
  return WriteFakeSysfs(text.str(), root);
}

}  // namespace ferry::testing
