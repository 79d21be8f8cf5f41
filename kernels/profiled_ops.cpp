// ProfiledOps (kernels/profiled_ops.h): every timed op forwards to the
// backend between two timeline marks; profile() sums the spans.
#include "kernels/profiled_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <utility>

namespace wiola {

namespace {

// The host clock: right where an op has finished when it returns.
class HostTimeline final : public OpTimeline {
 public:
  int mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return int(marks_.size()) - 1;
  }
  double seconds(int from, int to) override {
    return std::chrono::duration<double>(marks_[size_t(to)] - marks_[size_t(from)]).count();
  }
  void clear() override { marks_.clear(); }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

std::vector<OpTime> costliest_first(const std::map<std::string, OpTime>& by_name) {
  std::vector<OpTime> v;
  for (const auto& [name, t] : by_name) v.push_back(t);
  std::stable_sort(v.begin(), v.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return v;
}

}  // namespace

std::unique_ptr<OpTimeline> make_host_timeline() { return std::make_unique<HostTimeline>(); }

const char* op_class_of(const std::string& op) { return op_class_name(op_info(op_named(op)).cls); }

double OpProfile::class_seconds(const std::string& cls) const {
  for (const auto& c : classes)
    if (c.name == cls) return c.seconds;
  return 0;
}

std::string format_op_profile(const OpProfile& p, double wall_s, int steps, const std::string& indent) {
  std::string out;
  char line[160];
  const double per = 1e3 / std::max(steps, 1);
  auto row = [&](const std::string& name, double s, long calls) {
    std::snprintf(line, sizeof line, "%s%-18s %9.2f ms %5.1f %%", indent.c_str(), name.c_str(), s * per,
                  wall_s > 0 ? 100.0 * s / wall_s : 0.0);
    out += line;
    if (calls > 0) {
      std::snprintf(line, sizeof line, "  %6ld calls", calls / std::max(steps, 1));
      out += line;
    }
    out += "\n";
  };
  for (const OpTime& c : p.classes) row(c.name, c.seconds, c.calls);
  row("(between ops)", std::max(0.0, wall_s - p.seconds), 0);
  return out;
}

template <class T>
ProfiledOps<T>::ProfiledOps(Ops<T>& inner) : ForwardingOps<T>(inner), timeline_(inner.make_timeline()) {}

template <class T>
ProfiledOps<T>::~ProfiledOps() = default;

template <class T>
void ProfiledOps<T>::reset() {
  spans_.clear();
  timeline_->clear();
}

template <class T>
OpProfile ProfiledOps<T>::profile() {
  this->inner_.synchronize();
  std::map<std::string, OpTime> ops, classes;
  OpProfile p;
  for (const Span& s : spans_) {
    const double t = timeline_->seconds(s.from, s.to);
    const OpInfo& op = op_info(s.op);
    for (auto [map, key] :
         {std::pair{&ops, std::string(op.name)}, std::pair{&classes, std::string(op_class_name(op.cls))}}) {
      OpTime& e = (*map)[key];
      e.name = key;
      e.seconds += t;
      ++e.calls;
    }
    p.seconds += t;
  }
  p.ops = costliest_first(ops);
  p.classes = costliest_first(classes);
  return p;
}

template <class T>
void ProfiledOps<T>::op_begin(OpId) {
  from_ = on_ ? timeline_->mark() : -1;
}

template <class T>
void ProfiledOps<T>::op_end(OpId op) noexcept {
  if (from_ >= 0) spans_.push_back({op, from_, timeline_->mark()});
  from_ = -1;
}

template class ProfiledOps<float>;
template class ProfiledOps<double>;

}  // namespace wiola
