// TOML run configuration: parsing (toml++), --set overrides, validation and
// the canonical TOML form. Every key is documented in docs/config.md.
#include "config/run_config.h"

#include "kernels/backend.h"
#include "kernels/ops.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string_view>
#include <variant>

#include "data/byte_level.h"
#include "util/env.h"
#include "util/error.h"

namespace wiola {
namespace {

// ---------------------------------------------------------------------------
// Schema: every section and key of config/run_config_keys.h, bound to the
// RunConfig field it sets, with its doc line. docs/config.md's key tables
// are generated from it (run_config_schema(); `wiola train
// --print-config-schema`, scripts/config_docs.py; ctest config_docs).

// A field whose type is a named enum (util/named_enum.h), read and written by
// its names.
struct EnumRef {
  void* field;
  std::string_view (*get)(const void* field);
  bool (*set)(void* field, std::string_view name);  // false: not a name of the enum
  std::vector<std::string> (*names)();
  std::string (*choices)();  // for messages: "\"a\", \"b\" or \"c\""
};

template <NamedEnum E>
EnumRef enum_ref(E* field) {
  return {field, [](const void* f) { return to_string(*static_cast<const E*>(f)); },
          [](void* f, std::string_view name) {
            const auto e = parse_enum<E>(name);
            if (e) *static_cast<E*>(f) = *e;
            return e.has_value();
          },
          [] {
            std::vector<std::string> out;
            for (const auto n : enum_names(E{})) out.emplace_back(n);
            return out;
          },
          &enum_choices<E>};
}

using FieldPtr = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<BlendSource>*,
                              std::vector<DataStage>*, std::vector<StepWindow>*, std::vector<int>*,
                              std::vector<std::string>*, EnumRef>;

template <class T>
FieldPtr bind(T* field) {
  if constexpr (NamedEnum<T>) return enum_ref(field);
  else return field;
}

struct KeyDef {
  const char* name;
  FieldPtr (*field)(RunConfig&);
  const char* doc;             // the meaning column of docs/config.md (Markdown, one line)
  KeyRange range = kAnyValue;  // a numeric key's values (run_config_keys.h)
};

struct SectionDef {
  const char* name;
  std::vector<KeyDef> keys;
};

#define WIOLA_KEY(member, key, doc, range) \
  KeyDef{key, [](RunConfig& r) -> FieldPtr { return bind(&r.member); }, doc, range},
// (The model's keys are checked by ModelConfig::validate, model/config.h.)
#define WIOLA_MODEL_KEY(key, member, doc) WIOLA_KEY(member, #key, doc, kAnyValue)
#define WIOLA_TRAIN_KEY(type, key, default_value, range, doc) WIOLA_KEY(train.key, #key, doc, range)
#define WIOLA_DATA_KEY(type, key, default_value, range, doc) WIOLA_KEY(data.key, #key, doc, range)
#define WIOLA_PARALLEL_KEY(type, key, default_value, range, doc) WIOLA_KEY(parallel.key, #key, doc, range)
#define WIOLA_CHECKPOINT_KEY(type, key, default_value, range, doc) WIOLA_KEY(checkpoint.key, #key, doc, range)
#define WIOLA_OPTION_KEY(field, type, key, flag, old_env, doc) \
  WIOLA_KEY(train.backend_options.field, key, doc, kAnyValue)
#define WIOLA_OPTION_KEYS(member) WIOLA_BACKEND_OPTIONS(WIOLA_OPTION_KEY)

const std::vector<SectionDef>& schema() {
  static const std::vector<SectionDef> s = {
      {"model", {WIOLA_MODEL_KEYS(WIOLA_MODEL_KEY)}},
      {"train", {WIOLA_TRAIN_KEYS(WIOLA_TRAIN_KEY, WIOLA_OPTION_KEYS)}},
      {"data", {WIOLA_DATA_KEYS(WIOLA_DATA_KEY)}},
      {"parallel", {WIOLA_PARALLEL_KEYS(WIOLA_PARALLEL_KEY)}},
      {"checkpoint", {WIOLA_CHECKPOINT_KEYS(WIOLA_CHECKPOINT_KEY)}},
  };
  return s;
}

#undef WIOLA_OPTION_KEYS
#undef WIOLA_OPTION_KEY
#undef WIOLA_CHECKPOINT_KEY
#undef WIOLA_PARALLEL_KEY
#undef WIOLA_DATA_KEY
#undef WIOLA_TRAIN_KEY
#undef WIOLA_MODEL_KEY
#undef WIOLA_KEY

const SectionDef* find_section(std::string_view name) {
  for (const auto& s : schema())
    if (name == s.name) return &s;
  return nullptr;
}

const KeyDef* find_key(const SectionDef& s, std::string_view name) {
  for (const auto& k : s.keys)
    if (name == k.name) return &k;
  return nullptr;
}

// Which alternative of FieldPtr a key binds (same for every RunConfig).
bool is_string_key(const KeyDef& k) {
  RunConfig probe;
  const FieldPtr f = k.field(probe);
  return std::holds_alternative<std::string*>(f) || std::holds_alternative<EnumRef>(f);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// " (did you mean 'section.key'?)" or a pointer to the docs.
std::string suggest_key(const SectionDef* sec, std::string_view key) {
  // Same key name in another section (e.g. [train] path -> data.path).
  for (const auto& s : schema())
    if (&s != sec && find_key(s, key)) return detail::concat(" (did you mean '", s.name, ".", key, "'?)");
  if (sec) {
    const KeyDef* best = nullptr;
    size_t best_d = 3;
    for (const auto& k : sec->keys) {
      const size_t dist = edit_distance(key, k.name);
      if (dist < best_d) best_d = dist, best = &k;
    }
    if (best) return detail::concat(" (did you mean '", sec->name, ".", best->name, "'?)");
  }
  return " (see docs/config.md)";
}

std::string suggest_section(std::string_view name) {
  for (const auto& s : schema())
    if (edit_distance(name, s.name) <= 2) return detail::concat(" (did you mean [", s.name, "]?)");
  return " (known: [model] [train] [data] [parallel] [checkpoint])";
}

// ---------------------------------------------------------------------------
// Values.

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

std::string toml_string(std::string_view s) {
  std::string o = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\b': o += "\\b"; break;
      case '\t': o += "\\t"; break;
      case '\n': o += "\\n"; break;
      case '\f': o += "\\f"; break;
      case '\r': o += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", unsigned(c));
          o += buf;
        } else {
          o += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  return o + "\"";
}

// Shortest text that reads back as exactly `v`, always a TOML float.
std::string toml_double(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 'n': inf, nan
  return s;
}

std::string toml_blend(const std::vector<BlendSource>& blend) {
  std::string o = "[";
  for (size_t i = 0; i < blend.size(); ++i)
    o += detail::concat(i ? ", " : "", "{ path = ", toml_string(blend[i].path),
                        ", weight = ", toml_double(blend[i].weight), " }");
  return o + "]";
}

std::string toml_stages(const std::vector<DataStage>& stages) {
  std::string o = "[";
  for (size_t i = 0; i < stages.size(); ++i) {
    o += detail::concat(i ? ", " : "", "{ from = ", stages[i].from, ", weights = [");
    for (size_t k = 0; k < stages[i].weights.size(); ++k) o += (k ? ", " : "") + toml_double(stages[i].weights[k]);
    o += "] }";
  }
  return o + "]";
}

std::string toml_windows(const std::vector<StepWindow>& w) {
  std::string o = "[";
  for (size_t i = 0; i < w.size(); ++i) o += detail::concat(i ? ", " : "", "[", w[i].from, ", ", w[i].to, "]");
  return o + "]";
}

std::string toml_ints(const std::vector<int>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += detail::concat(i ? ", " : "", v[i]);
  return o + "]";
}

std::string toml_strings(const std::vector<std::string>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += detail::concat(i ? ", " : "", toml_string(v[i]));
  return o + "]";
}

// A key's value as the effective config writes it.
std::string toml_value(const FieldPtr& field) {
  return std::visit(
      [](auto p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, EnumRef>) return toml_string(p.get(p.field));
        else if constexpr (std::is_same_v<T, std::string>) return toml_string(*p);
        else if constexpr (std::is_same_v<T, std::vector<BlendSource>>) return toml_blend(*p);
        else if constexpr (std::is_same_v<T, std::vector<DataStage>>) return toml_stages(*p);
        else if constexpr (std::is_same_v<T, std::vector<StepWindow>>) return toml_windows(*p);
        else if constexpr (std::is_same_v<T, std::vector<int>>) return toml_ints(*p);
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) return toml_strings(*p);
        else if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>) return toml_double(*p);
        else return std::to_string(*p);
      },
      field);
}

// A key's type as docs/config.md's "Types" table names it.
const char* doc_type(const FieldPtr& field) {
  return std::visit(
      [](auto p) -> const char* {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int>) return "int";
        else if constexpr (std::is_same_v<T, int64_t>) return "int64";
        else if constexpr (std::is_same_v<T, uint64_t>) return "int64 ≥ 0";
        else if constexpr (std::is_same_v<T, double>) return "float";
        else if constexpr (std::is_same_v<T, bool>) return "bool";
        else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, EnumRef>) return "string";
        else if constexpr (std::is_same_v<T, std::vector<BlendSource>> || std::is_same_v<T, std::vector<DataStage>>)
          return "array of tables";
        else if constexpr (std::is_same_v<T, std::vector<int>>) return "array of int";
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "array of string";
        else return "array of [int64, int64]";
      },
      field);
}

// A bound as the config writes it: 1, -1, 0.5.
std::string bound_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// "≥ 1", "> 0", "in [0, 1)" (`ascii`: ">= 1" for messages); "" for kAnyValue.
std::string range_text(const KeyRange& r, bool ascii) {
  const bool lo = std::isfinite(r.lo), hi = std::isfinite(r.hi);
  if (lo && hi)
    return "in " + std::string(r.lo_open ? "(" : "[") + bound_text(r.lo) + ", " + bound_text(r.hi) +
           (r.hi_open ? ")" : "]");
  if (lo) return std::string(r.lo_open ? ">" : ascii ? ">=" : "≥") + " " + bound_text(r.lo);
  if (hi) return std::string(r.hi_open ? "<" : ascii ? "<=" : "≤") + " " + bound_text(r.hi);
  return "";
}

bool in_range(double v, const KeyRange& r) {
  return (r.lo_open ? v > r.lo : v >= r.lo) && (r.hi_open ? v < r.hi : v <= r.hi);
}

std::string describe(const toml::node& n) {
  std::string d = type_name(n);
  if (auto s = n.as_string()) return d + " (" + toml_string(s->get()) + ")";
  if (auto i = n.as_integer()) return d + " (" + std::to_string(i->get()) + ")";
  if (auto f = n.as_floating_point()) return d + " (" + toml_double(f->get()) + ")";
  if (auto b = n.as_boolean()) return d + (b->get() ? " (true)" : " (false)");
  return d;
}

// One value of the merged configuration and where it came from.
struct Entry {
  const toml::node* node = nullptr;
  std::string origin;  // "file:line:col" or "<--set> 'section.key=value'"
};

using Entries = std::map<std::string, std::map<std::string, Entry>>;  // section -> key

[[noreturn]] void key_error(const Entry& e, std::string_view sec, std::string_view key, const std::string& problem) {
  fail(e.origin, ": ", sec, ".", key, ": ", problem);
}

// An array of tables (inline, or [[section.key]] sections): f(item, table)
// for each, item naming it ("source 2 of 3"); `shape` is a table's form in
// the messages.
template <class F>
void for_each_table(const toml::node& n, const Entry& e, std::string_view sec, const char* key, const char* noun,
                    const char* shape, F&& f) {
  const auto* arr = n.as_array();
  if (!arr) key_error(e, sec, key, detail::concat("expected an array of ", shape, " tables, got ", describe(n)));
  for (size_t i = 0; i < arr->size(); ++i) {
    const std::string item = detail::concat(noun, " ", i + 1, " of ", arr->size());
    const auto* t = (*arr)[i].as_table();
    if (!t) key_error(e, sec, key, detail::concat(item, ": expected a table ", shape, ", got ", describe((*arr)[i])));
    f(item, *t);
  }
}

// A TOML integer or float as a double; NaN for anything else.
double number_of(const toml::node& v) {
  if (auto iv = v.as_integer()) return static_cast<double>(iv->get());
  if (auto fv = v.as_floating_point()) return fv->get();
  return std::nan("");
}

// data.blend: an array of {path = "...", weight = w} tables.
std::vector<BlendSource> read_blend(const toml::node& n, const Entry& e, std::string_view sec, const char* key) {
  std::vector<BlendSource> out;
  for_each_table(
      n, e, sec, key, "source", "{path = \"...\", weight = w}", [&](const std::string& item, const toml::table& t) {
        BlendSource b;
        bool has_path = false, has_weight = false;
        for (const auto& [name, v] : t) {
          if (name == "path") {
            if (!v.is_string() || v.as_string()->get().empty())
              key_error(e, sec, key, detail::concat(item, ": path must be a non-empty string, got ", describe(v)));
            b.path = v.as_string()->get();
            has_path = true;
          } else if (name == "weight") {
            if (!v.is_number())
              key_error(e, sec, key, detail::concat(item, ": weight must be a number, got ", describe(v)));
            b.weight = number_of(v);
            if (!std::isfinite(b.weight) || b.weight <= 0)
              key_error(e, sec, key,
                        detail::concat(item, ": weight must be positive and finite (got ", toml_double(b.weight), ")"));
            has_weight = true;
          } else {
            key_error(e, sec, key,
                      detail::concat(item, ": unknown field '", name.str(), "' (a source has path and weight)"));
          }
        }
        if (!has_path || !has_weight) key_error(e, sec, key, detail::concat(item, ": needs both path and weight"));
        out.push_back(std::move(b));
      });
  return out;
}

// data.stages: an array of {from = step, weights = [w, ...]} tables.
std::vector<DataStage> read_stages(const toml::node& n, const Entry& e, std::string_view sec, const char* key) {
  std::vector<DataStage> out;
  for_each_table(
      n, e, sec, key, "stage", "{from = step, weights = [...]}", [&](const std::string& item, const toml::table& t) {
        DataStage st;
        bool has_from = false, has_weights = false;
        for (const auto& [name, v] : t) {
          if (name == "from") {
            if (!v.is_integer() || v.as_integer()->get() < 2)
              key_error(e, sec, key, detail::concat(item, ": from must be a step >= 2, got ", describe(v)));
            st.from = v.as_integer()->get();
            has_from = true;
          } else if (name == "weights") {
            const auto* w = v.as_array();
            if (!w)
              key_error(e, sec, key, detail::concat(item, ": weights must be an array of numbers, got ", describe(v)));
            for (size_t k = 0; k < w->size(); ++k) {
              const double d = number_of((*w)[k]);
              if (!std::isfinite(d) || d < 0)
                key_error(
                    e, sec, key,
                    detail::concat(item, ": weight ", k + 1, " must be a finite number >= 0, got ", describe((*w)[k])));
              st.weights.push_back(d);
            }
            has_weights = true;
          } else {
            key_error(e, sec, key,
                      detail::concat(item, ": unknown field '", name.str(), "' (a stage has from and weights)"));
          }
        }
        if (!has_from || !has_weights) key_error(e, sec, key, detail::concat(item, ": needs both from and weights"));
        out.push_back(std::move(st));
      });
  return out;
}

// An array of integers (parallel.layer_cuts).
std::vector<int> read_ints(const toml::node& n, const Entry& e, std::string_view sec, const char* key) {
  const auto* arr = n.as_array();
  if (!arr) key_error(e, sec, key, detail::concat("expected an array of integers, got ", describe(n)));
  std::vector<int> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    const auto* v = (*arr)[i].as_integer();
    if (!v || v->get() < INT_MIN || v->get() > INT_MAX)
      key_error(e, sec, key, detail::concat("element ", i + 1, " of ", arr->size(), ": expected an integer"));
    out.push_back(int(v->get()));
  }
  return out;
}

// An array of strings (train.eval_tasks).
std::vector<std::string> read_strings(const toml::node& n, const Entry& e, std::string_view sec, const char* key) {
  const auto* arr = n.as_array();
  if (!arr) key_error(e, sec, key, detail::concat("expected an array of strings, got ", describe(n)));
  std::vector<std::string> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    const auto* v = (*arr)[i].as_string();
    if (!v) key_error(e, sec, key, detail::concat("element ", i + 1, " of ", arr->size(), ": expected a string"));
    out.push_back(v->get());
  }
  return out;
}

// train.skip_batches: an array of [from, to] step pairs (inclusive).
std::vector<StepWindow> read_windows(const toml::node& n, const Entry& e, std::string_view sec, const char* key) {
  const auto* arr = n.as_array();
  if (!arr) key_error(e, sec, key, detail::concat("expected an array of [from, to] step pairs, got ", describe(n)));
  std::vector<StepWindow> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    const auto* p = (*arr)[i].as_array();
    if (!p || p->size() != 2 || !(*p)[0].is_integer() || !(*p)[1].is_integer())
      key_error(e, sec, key,
                detail::concat("window ", i + 1, " of ", arr->size(), ": expected [from, to], two integers"));
    out.push_back({(*p)[0].as_integer()->get(), (*p)[1].as_integer()->get()});
  }
  return out;
}

void assign(RunConfig& rc, const KeyDef& k, std::string_view sec, const Entry& e) {
  const toml::node& n = *e.node;
  auto want = [&](const char* what) {
    key_error(e, sec, k.name, detail::concat("expected ", what, ", got ", describe(n)));
  };
  std::visit(
      [&](auto p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, EnumRef>) {
          if (!n.is_string()) want("a string");
          if (!p.set(p.field, n.as_string()->get()))
            key_error(e, sec, k.name,
                      detail::concat("must be ", p.choices(), " (got ", toml_string(n.as_string()->get()), ")"));
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!n.is_string()) want("a string");
          *p = n.as_string()->get();
        } else if constexpr (std::is_same_v<T, std::vector<BlendSource>>) {
          *p = read_blend(n, e, sec, k.name);
        } else if constexpr (std::is_same_v<T, std::vector<DataStage>>) {
          *p = read_stages(n, e, sec, k.name);
        } else if constexpr (std::is_same_v<T, std::vector<StepWindow>>) {
          *p = read_windows(n, e, sec, k.name);
        } else if constexpr (std::is_same_v<T, std::vector<int>>) {
          *p = read_ints(n, e, sec, k.name);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          *p = read_strings(n, e, sec, k.name);
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!n.is_boolean()) want("a boolean (true or false)");
          *p = n.as_boolean()->get();
        } else if constexpr (std::is_same_v<T, double>) {
          double v = 0;
          if (auto i = n.as_integer()) v = static_cast<double>(i->get());
          else if (auto f = n.as_floating_point()) v = f->get();
          else want("a number");
          if (!std::isfinite(v)) key_error(e, sec, k.name, "must be a finite number");
          *p = v;
        } else {  // integers
          if (!n.is_integer()) want("an integer");
          const int64_t v = n.as_integer()->get();
          if constexpr (std::is_same_v<T, int>) {
            if (v < INT_MIN || v > INT_MAX)
              key_error(e, sec, k.name,
                        detail::concat("integer ", v, " is out of range (", INT_MIN, " .. ", INT_MAX, ")"));
            *p = static_cast<int>(v);
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            if (v < 0) key_error(e, sec, k.name, detail::concat("must be non-negative (got ", v, ")"));
            *p = static_cast<uint64_t>(v);
          } else {
            *p = v;
          }
        }
      },
      k.field(rc));
}

std::string position(const toml::source_region& r, const std::string& file) {
  const auto& b = r.begin;
  if (b.line == 0) return file;
  return detail::concat(file, ":", b.line, ":", b.column);
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("cannot read config file '", path, "': is a directory");
  errno = 0;
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read config file '", path, "': ", std::strerror(errno ? errno : ENOENT));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read config file '", path, "': read error");
  return ss.str();
}

// The file's sections and keys, checked against the schema.
void collect_file(const toml::table& root, const std::string& path, Entries& out) {
  for (const auto& [skey, snode] : root) {
    const std::string sname(skey.str());
    const std::string swhere = position(skey.source(), path);
    const SectionDef* sec = find_section(sname);
    if (!snode.is_table()) {
      if (sec) fail(swhere, ": [", sname, "] must be a table (a section), got ", type_name(snode));
      fail(swhere, ": key '", sname, "' is outside any section", suggest_key(nullptr, sname));
    }
    if (!sec) fail(swhere, ": unknown section [", sname, "]", suggest_section(sname));
    for (const auto& [kkey, knode] : *snode.as_table()) {
      const std::string kname(kkey.str());
      if (!find_key(*sec, kname))
        fail(position(kkey.source(), path), ": unknown key '", sname, ".", kname, "'", suggest_key(sec, kname));
      out[sname][kname] = Entry{&knode, position(knode.source(), path)};
    }
  }
}

std::string_view trim(std::string_view s) {
  const auto ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// "section.key=value": value in TOML syntax, or else taken as a bare string.
void collect_override(const std::string& ov, std::vector<std::unique_ptr<toml::table>>& store, Entries& out) {
  const std::string origin = "<--set> '" + ov + "'";
  const size_t eq = ov.find('=');
  if (eq == std::string::npos) fail(origin, ": malformed override, expected section.key=value (no '=')");
  const std::string_view lhs = trim(std::string_view(ov).substr(0, eq));
  const std::string_view rhs = trim(std::string_view(ov).substr(eq + 1));
  const size_t dot = lhs.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == lhs.size())
    fail(origin, ": malformed override, expected section.key=value (need 'section.key' before '=')");
  const std::string sname(trim(lhs.substr(0, dot)));
  const std::string kname(trim(lhs.substr(dot + 1)));
  const SectionDef* sec = find_section(sname);
  if (!sec) fail(origin, ": unknown section [", sname, "]", suggest_section(sname));
  const KeyDef* key = find_key(*sec, kname);
  if (!key) fail(origin, ": unknown key '", sname, ".", kname, "'", suggest_key(sec, kname));

  std::unique_ptr<toml::table> t;
  try {
    t = std::make_unique<toml::table>(toml::parse("x = " + std::string(rhs), std::string_view("<--set>")));
    if (t->size() != 1 || !t->contains("x")) t.reset();
  } catch (const toml::parse_error&) {
    t.reset();
  }
  // Bare text, or text meant for a string key that parsed as something else
  // (e.g. train.run_dir=2024): the text itself.
  if (!t || (is_string_key(*key) && !(*t)["x"].is_string())) {
    // TOML is UTF-8: other bytes would be written into the run's config and
    // checkpoints, which then could not be read back.
    size_t bad = 0;
    if (!valid_utf8(rhs, &bad))
      fail(origin, ": the value of ", sname, ".", kname, " is not valid UTF-8 (byte ", bad + 1, ")");
    t = std::make_unique<toml::table>();
    t->insert("x", std::string(rhs));
  }
  out[sname][kname] = Entry{t->get("x"), origin};
  store.push_back(std::move(t));
}

// Every numeric key within its declared range (run_config_keys.h), named
// with the range in the message.
void check_ranges(const RunConfig& rc) {
  RunConfig copy = rc;  // KeyDef::field binds a writable config
  for (const auto& sec : schema())
    for (const auto& k : sec.keys) {
      if (!std::isfinite(k.range.lo) && !std::isfinite(k.range.hi)) continue;
      std::visit(
          [&](auto p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
              WIOLA_CHECK(in_range(double(*p), k.range), sec.name, ".", k.name, " must be ", range_text(k.range, true),
                          " (got ", *p, ")");
            }
          },
          k.field(copy));
    }
}

// [train] and what it needs of the others. The values of enum keys were
// checked when read (assign).
// Step windows [from, to]: 1 <= from <= to, sorted and disjoint.
void check_windows(const std::vector<StepWindow>& ws, const char* key) {
  for (size_t i = 0; i < ws.size(); ++i) {
    const StepWindow& w = ws[i];
    WIOLA_CHECK(w.from >= 1 && w.to >= w.from, key, ": window ", i + 1, " [", w.from, ", ", w.to,
                "] must have 1 <= from <= to");
    WIOLA_CHECK(i == 0 || w.from > ws[i - 1].to, key, ": window ", i + 1, " [", w.from, ", ", w.to,
                "] must start after window ", i, " ends (sorted, disjoint)");
  }
}

void check_train(const RunConfig& rc) {
  const auto& t = rc.train;
  const auto& c = rc.checkpoint;
  {
    const auto known = backend_names();
    std::string list;
    for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
    const std::string backend(to_string(t.backend));
    WIOLA_CHECK(std::find(known.begin(), known.end(), backend) != known.end(), "train.backend \"", backend,
                "\" is not a backend of this build (known: ", list, ")");
  }
  check_attention_heads_per_block(t.backend_options, rc.model.H, rc.model.Hkv);
  WIOLA_CHECK(!(t.spike_sigma > 0 || t.spike_skipped > 0) || !c.dir.empty(),
              "train.spike_sigma / train.spike_skipped rewind to a checkpoint: set checkpoint.dir");
  WIOLA_CHECK(!(t.spike_skipped > 0 && t.nonfinite_fatal),
              "train.spike_skipped counts skipped steps, but train.nonfinite_fatal stops at the first: set one");
  check_windows(t.skip_batches, "train.skip_batches");
  check_windows(t.trace_steps, "train.trace_steps");
  WIOLA_CHECK(t.seed <= uint64_t(INT64_MAX), "train.seed must be <= ", INT64_MAX, " (got ", t.seed, ")");
  WIOLA_CHECK(t.lr_min >= 0 && t.lr_min <= t.lr_max, "train.lr_min (", t.lr_min,
              ") must be in [0, train.lr_max] = [0, ", t.lr_max, "]");
}

// data.stages against data.blend: a weight per source, steps increasing.
void check_stages(const DataSection& d) {
  for (size_t j = 0; j < d.stages.size(); ++j) {
    const DataStage& st = d.stages[j];
    WIOLA_CHECK(d.blend.size() >= 2,
                "data.stages changes the shares of a blend: set data.blend with two sources or more");
    WIOLA_CHECK(st.weights.size() == d.blend.size(), "data.stages: stage ", j + 1, " (from step ", st.from, ") has ",
                st.weights.size(), " weights, data.blend ", d.blend.size(), " sources");
    WIOLA_CHECK(j == 0 || st.from > d.stages[j - 1].from, "data.stages: stage ", j + 1, " (from step ", st.from,
                ") must start after stage ", j, " (from step ", d.stages[j - 1].from, ")");
    double total = 0;
    for (double w : st.weights) total += w;
    WIOLA_CHECK(total > 0, "data.stages: stage ", j + 1, " (from step ", st.from, ") has no weight above 0");
  }
}

void check_data(const RunConfig& rc) {
  WIOLA_CHECK(rc.data.path.empty() || rc.data.blend.empty(),
              "data.path and data.blend are both set; a run reads "
              "one source (data.path) or a blend of several (data.blend), not both (to override the file's "
              "data.path, add --set 'data.path=\"\"')");
  check_stages(rc.data);
}

// [parallel]: the grid against the model, the schedule's chunks.
void check_parallel(const RunConfig& rc) {
  const auto& p = rc.parallel;
  WIOLA_CHECK(p.pp <= rc.model.L, "parallel.pp (", p.pp, ") must not exceed model.n_layers (", rc.model.L,
              "): every pipeline stage needs a layer");
  // The chunked schedules (dist/schedule.h): p·v chunks of at least a layer each.
  const int chunks = perf::chunks_per_rank(rc.layout());
  WIOLA_CHECK(p.pp * chunks <= rc.model.L, "parallel.schedule \"", to_string(p.schedule), "\" cuts the model into ",
              p.pp * chunks, " chunks (parallel.pp ", p.pp, " x ", chunks, " per rank), more than model.n_layers (",
              rc.model.L, "): every chunk needs a layer");
  if (!p.layer_cuts.empty()) {
    const auto& cuts = p.layer_cuts;
    bool increasing = cuts.front() == 0 && cuts.back() == rc.model.L;
    for (size_t k = 1; k < cuts.size(); ++k) increasing = increasing && cuts[k - 1] < cuts[k];
    WIOLA_CHECK(int(cuts.size()) == p.pp * chunks + 1 && increasing, "parallel.layer_cuts must be ", p.pp * chunks + 1,
                " increasing layer numbers from 0 to model.n_layers (", rc.model.L, ") for ", p.pp * chunks,
                " chunks (parallel.pp ", p.pp, " x ", chunks, " per rank of \"", to_string(p.schedule), "\"); got ",
                cuts.size(), " numbers");
  }
  WIOLA_CHECK(p.schedule != dist::Schedule::Interleaved || chunks == 1 || rc.train.grad_accum % p.pp == 0,
              "parallel.schedule \"interleaved\" needs train.grad_accum (", rc.train.grad_accum,
              ") to be a multiple of parallel.pp (", p.pp, "): micro-batches go through the chunks in groups of pp");
  WIOLA_CHECK(p.schedule != dist::Schedule::ZbV || rc.train.grad_accum >= p.pp,
              "parallel.schedule \"zb-v\" needs "
              "train.grad_accum (",
              rc.train.grad_accum, ") of at least parallel.pp (", p.pp, ")");
  auto divides = [&](int v, const char* key) {
    WIOLA_CHECK(v % p.tp == 0, "parallel.tp (", p.tp, ") must divide ", key, " (", v, ")");
  };
  divides(rc.model.Hkv, "model.n_kv_heads");
  divides(rc.model.dA, "model.d_a");
  divides(rc.model.dB, "model.d_b");
  divides(rc.model.V, "model.vocab_size");
}

void check_checkpoint(const RunConfig& rc) {
  const auto& t = rc.train;
  const auto& p = rc.parallel;
  WIOLA_CHECK(int64_t(t.micro_batch) * t.grad_accum * p.dp <= INT_MAX,
              "global batch train.micro_batch x train.grad_accum x parallel.dp is too large");
}

void check_run_config(const RunConfig& rc) {
  rc.model.validate();
  check_ranges(rc);
  check_train(rc);
  check_data(rc);
  check_parallel(rc);
  check_checkpoint(rc);
}

}  // namespace

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  // The environment variable that set the timeout before it was a key: a
  // script that still sets it would otherwise lose its timeout silently.
  if (const std::string v = env_text("WIOLA_COMM_TIMEOUT_S"); !v.empty())
    fail("WIOLA_COMM_TIMEOUT_S=", v,
         " is no longer read: the communication timeout is the run-config key "
         "parallel.comm_timeout_s (wiola train --set parallel.comm_timeout_s=",
         v, "); unset WIOLA_COMM_TIMEOUT_S");
  return run_config_from_toml_text(path.empty() ? std::string() : read_file(path), path, overrides);
}

RunConfig run_config_from_toml_text(const std::string& text, const std::string& path,
                                    const std::vector<std::string>& overrides) {
  toml::table file_root;
  Entries entries;
  try {
    file_root = toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    fail(path, ":", b.line, ":", b.column, ": TOML syntax error: ", e.description());
  }
  collect_file(file_root, path, entries);
  std::vector<std::unique_ptr<toml::table>> store;
  for (const auto& ov : overrides) collect_override(ov, store, entries);

  RunConfig rc;
  rc.source = path;
  // model.preset first, then every explicit model key on top of it.
  const SectionDef& model_sec = *find_section("model");
  if (auto it = entries["model"].find("preset"); it != entries["model"].end()) {
    assign(rc, *find_key(model_sec, "preset"), "model", it->second);
    if (!rc.preset.empty()) {
      try {
        rc.model = model_preset(rc.preset);
      } catch (const Error& err) {
        key_error(it->second, "model", "preset", err.what());
      }
    }
  }
  rc.model.name = rc.preset.empty() ? "custom" : rc.preset;
  for (const auto& sec : schema())
    for (const auto& [kname, entry] : entries[sec.name]) {
      if (&sec == &model_sec && kname == "preset") continue;
      assign(rc, *find_key(sec, kname), sec.name, entry);
    }

  try {
    check_run_config(rc);
  } catch (const Error& err) {
    const std::string where = path.empty()        ? std::string("<--set>")
                              : overrides.empty() ? path
                                                  : path + " with --set overrides";
    fail(where, ": ", err.what());
  }
  return rc;
}

void validate_run_config(const RunConfig& rc) {
  try {
    check_run_config(rc);
  } catch (const Error& err) {
    if (rc.source.empty()) throw;
    fail(rc.source, ": ", err.what());
  }
}

std::string run_config_to_toml(const RunConfig& rc) {
  RunConfig copy = rc;  // schema accessors take a mutable RunConfig
  std::ostringstream os;
  os << "# wiola run configuration (effective values; keys in docs/config.md)\n";
  bool first = true;
  for (const auto& sec : schema()) {
    os << (first ? "" : "\n") << "[" << sec.name << "]\n";
    first = false;
    for (const auto& k : sec.keys) {
      if (std::string_view(k.name) == "preset" && rc.preset.empty()) continue;
      os << k.name << " = " << toml_value(k.field(copy)) << "\n";
    }
  }
  return os.str();
}

std::vector<ConfigKeyDoc> run_config_schema() {
  RunConfig defaults;
  std::vector<ConfigKeyDoc> out;
  for (const auto& sec : schema())
    for (const auto& k : sec.keys) {
      const FieldPtr f = k.field(defaults);
      std::vector<std::string> values;
      if (const auto* e = std::get_if<EnumRef>(&f)) values = e->names();
      const std::string range = range_text(k.range, false);
      out.push_back({sec.name, k.name, doc_type(f) + (range.empty() ? "" : " " + range), toml_value(f),
                     std::move(values), k.doc});
    }
  return out;
}

}  // namespace wiola
