// Helpers shared by the data tests: scratch folders, files, the Python twin.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace wiola::test {

inline const std::string kWiolaTokenizer = std::string(WIOLA_SOURCE_DIR) + "/data/wiola360m/tokenizer.json";
// The bundled corpus (data/brown/brown.txt.xz), unpacked at configure time.
inline const std::string kBrown = std::string(WIOLA_BINARY_DIR) + "/brown.txt";

// A fresh folder under the build tree, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::path(WIOLA_BINARY_DIR) / "tmp-data-tests" / (tag + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs a shell command; returns its exit status.
inline int sh(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline bool hf_tokenizers_available() {
  static int ok = sh(std::string(WIOLA_PYTHON) + " -c 'import tokenizers' >/dev/null 2>&1") == 0 ? 1 : 0;
  return ok == 1;
}
inline const char* kHfMissing =
    "Hugging Face `tokenizers` not installed for " WIOLA_PYTHON
    " (pip install --break-system-packages tokenizers)";

// Encodes each line of `lines_file` with HF tokenizers (no special tokens
// added) and returns one id list per line.
inline std::vector<std::vector<int>> hf_encode_lines(const std::string& tokenizer, const std::string& lines_file,
                                                     const std::string& scratch_dir) {
  std::string py = scratch_dir + "/hf_encode.py", out = scratch_dir + "/hf_ids.txt";
  write_text(py,
             "import sys\n"
             "from tokenizers import Tokenizer\n"
             "tok = Tokenizer.from_file(sys.argv[1])\n"
             "lines = open(sys.argv[2], encoding='utf-8', newline='\\n').read().split('\\n')\n"
             "if lines and lines[-1] == '': lines.pop()\n"
             "with open(sys.argv[3], 'w') as f:\n"
             "    for e in tok.encode_batch(lines, add_special_tokens=False):\n"
             "        f.write(' '.join(map(str, e.ids)) + '\\n')\n");
  std::string cmd = std::string(WIOLA_PYTHON) + " " + py + " " + tokenizer + " " + lines_file + " " + out;
  if (sh(cmd) != 0) return {};
  std::vector<std::vector<int>> res;
  std::ifstream f(out);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::vector<int> ids;
    int v;
    while (is >> v) ids.push_back(v);
    res.push_back(std::move(ids));
  }
  return res;
}

}  // namespace wiola::test
