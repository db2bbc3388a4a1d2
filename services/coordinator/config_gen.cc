// shoal-config-gen: what RunConfig's `setting` options generate
// (common/run_config_doc.h).
//   shoal-config-gen flags OUT.cc   the coordinator's flag definitions (build time)
//   shoal-config-gen doc FILE.md    rewrites docs/CONFIG.md's generated tables (make config-doc)
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "common/run_config_doc.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "shoal-config-gen: %s\n", what.c_str());
  return 1;
}

// Writes `text` unless the file holds it already (no rebuild for nothing).
bool WriteIfChanged(const std::string& path, const std::string& text) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream old;
  old << in.rdbuf();
  if (in && old.str() == text) return true;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return Fail("usage: shoal-config-gen flags OUT.cc | doc CONFIG.md");
  const std::string command = argv[1];
  const std::string path = argv[2];
  absl::StatusOr<std::string> text;
  if (command == "flags") {
    text = shoal::RunConfigFlagsSource();
  } else if (command == "doc") {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Fail("cannot read " + path);
    std::stringstream current;
    current << in.rdbuf();
    text = shoal::RenderConfigDoc(current.str());
  } else {
    return Fail("unknown command " + command);
  }
  if (!text.ok()) return Fail(std::string(text.status().message()));
  if (!WriteIfChanged(path, *text)) return Fail("cannot write " + path);
  return 0;
}
