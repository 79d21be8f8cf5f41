// TensorBoard event files by hand: CRC-32C, TFRecord frames and the few
// protobuf fields of Event / Summary / Value (train/tensorboard.h).
#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

#include "util/error.h"

namespace wiola {
namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> a{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      a[i] = c;
    }
    return a;
  }();
  return t;
}

// ---- protobuf wire format (the fields we write) ----------------------------
void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  s.push_back(char(uint8_t(v)));
}
void put_tag(std::string& s, int field, int wire_type) { put_varint(s, uint64_t(field) << 3 | uint64_t(wire_type)); }
template <class T>
void put_fixed(std::string& s, T v) {  // little-endian (x86, ARM)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}
void put_bytes(std::string& s, int field, const std::string& bytes) {
  put_tag(s, field, 2);
  put_varint(s, bytes.size());
  s += bytes;
}

// Event { double wall_time = 1; int64 step = 2; oneof { string file_version = 3; Summary summary = 5; } }
std::string event(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, uint64_t(step));
  return e;
}

double wall_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// metrics.jsonl key -> tag (docs/performance.md).
const std::map<std::string, std::string>& known_tags() {
  static const std::map<std::string, std::string> m = {{"loss", "train/loss"},
                                                       {"lr", "train/lr"},
                                                       {"grad_norm", "train/grad_norm"},
                                                       {"tokens", "train/tokens"},
                                                       {"skipped", "train/skipped_steps"},
                                                       {"tokens_per_s", "perf/tokens_per_s"},
                                                       {"step_ms", "perf/step_ms"},
                                                       {"checkpoint_ms", "perf/checkpoint_ms"},
                                                       {"mfu", "perf/mfu"},
                                                       {"atm_mu", "atm/mu"},
                                                       {"atm_saved_attention_gflop", "atm/saved_attention_gflop"},
                                                       {"peak_mem_mib", "memory/peak_mib"},
                                                       {"val_loss", "val/loss"},
                                                       {"z_loss", "train/z_loss"}};
  return m;
}

double number(const nlohmann::json& v) {
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tensorboard_source_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && (p.filename().empty() || p.filename() == "manifest.json" || p.filename() == "."))
    p = p.parent_path();
  std::string n = p.filename().string();
  if (n.empty()) n = "source";
  for (char& c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  return n;
}

Scalars tensorboard_scalars(const nlohmann::json& record, const std::vector<std::string>& source_names) {
  Scalars out;
  for (const auto& [key, v] : record.items()) {
    if (key == "step") continue;
    if (key == "val_loss_sources" && v.is_array()) {
      for (size_t k = 0; k < v.size(); ++k) {
        const std::string name = k < source_names.size() ? source_names[k] : "source";
        out.emplace_back("val/" + std::to_string(k + 1) + "-" + name + "/loss", number(v[k]));
      }
    } else if (v.is_object()) {
      const std::string base = key == "time_ms" ? "time_ms/" : "metrics/" + key + "/";
      for (const auto& [sub, x] : v.items())
        if (x.is_number() || x.is_null()) out.emplace_back(base + sub, number(x));
    } else if (v.is_number() || v.is_null()) {
      const auto it = known_tags().find(key);
      out.emplace_back(it != known_tags().end() ? it->second : "metrics/" + key, number(v));
    }
  }
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir, const std::vector<BlendSource>& blend,
                                     int64_t first_step) {
  for (const BlendSource& b : blend) sources_.push_back(tensorboard_source_name(b.path));
  std::filesystem::create_directories(dir);
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  path_ = dir / ("events.out.tfevents." + std::to_string(int64_t(wall_now())) + "." + host + "." +
                 std::to_string(long(getpid())) + ".0");
  out_.open(path_, std::ios::binary | std::ios::trunc);
  WIOLA_CHECK(out_.good(), "cannot write the TensorBoard event file '", path_.string(), "'");
  std::string e = event(wall_now(), 0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
  restart(first_step);
}

void TensorBoardWriter::restart(int64_t first_step) {
  std::string start = event(wall_now(), first_step);
  put_bytes(start, 7, std::string("\x08\x01", 2));  // session_log = SessionLog { status: START }
  write_record(start);
}

void TensorBoardWriter::add(int64_t step, const Scalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_tag(v, 2, 5);
    put_fixed(v, float(value));
    put_bytes(summary, 1, v);
  }
  std::string e = event(wall_now(), step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string frame;
  put_fixed(frame, uint64_t(data.size()));
  const uint32_t len_crc = masked_crc32c(frame.data(), 8);
  put_fixed(frame, len_crc);
  frame += data;
  put_fixed(frame, masked_crc32c(data.data(), data.size()));
  if (failed_) return;
  out_.write(frame.data(), std::streamsize(frame.size()));
  out_.flush();
  if (!out_.good()) {  // a full disk: the run goes on, metrics.jsonl keeps the numbers
    failed_ = true;
    std::fprintf(stderr,
                 "wiola train: warning: cannot write the TensorBoard event file '%s'; no more "
                 "TensorBoard events in this run\n",
                 path_.string().c_str());
  }
}

}  // namespace wiola
