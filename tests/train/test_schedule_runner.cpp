// The schedule runner (train/schedule_runner.h) of every pipeline stage in
// one process, for every schedule (1F1B, GPipe, ZB-H1, interleaved, ZB-V):
// each stage's runner on its own thread, its chunks test chunks that check
// and write boundary tensors naming their micro-batch, chunk and direction,
// its link an in-process queue. Checked: the actions each runner ran
// (dist::schedule_*'s lists), that every message arrives from the action
// the pipeline simulator (dist::simulate_pipeline) takes for its dependency
// and ends before the receiver starts there, the tensors passed, the slots
// (no live micro-batch overwritten), grad-ready arming, and the observers'
// calls. Two steps each, so slots and queues are reused.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dist/schedule.h"
#include "train/schedule_runner.h"
#include "util/error.h"

namespace wiola {
namespace {

using dist::Action;
using dist::Op;

constexpr int kTensors = 2;      // tensors per boundary message
constexpr size_t kElems = 3;     // elements per tensor
constexpr size_t kMbTokens = 5;  // tokens per micro-batch
constexpr double kLossScale = 0.25;

// The value element j of tensor i of the message global chunk g sends for
// micro-batch `micro` (forward or backward) holds.
float message_value(int g, int micro, bool backward, int i, size_t j) {
  return float((((backward ? 1 : 0) * 64 + g) * 64 + micro) * 16 + i * 4 + int(j));
}

// Every stage's messages in one process: a queue per (from, to, tag).
class InProcessLinks {
 public:
  class Link final : public BoundaryLink {
   public:
    Link(InProcessLinks& hub, int rank) : hub_(hub), rank_(rank) {}
    void send(const std::vector<CPtr>& ts, int peer, int tag) override {
      std::vector<std::vector<float>> msg;
      for (const CPtr& t : ts) msg.emplace_back(t.as<float>(), t.as<float>() + kElems);
      std::lock_guard<std::mutex> lock(hub_.mu_);
      auto& q = hub_.queued_[{rank_, peer, tag}];
      WIOLA_CHECK(q.empty(), "a second message from ", rank_, " to ", peer, " with tag ", tag,
                  " before the first was received");
      q.push_back(std::move(msg));
      ++hub_.sent_;
      hub_.cv_.notify_all();
    }
    void recv(const std::vector<Ptr>& ts, int peer, int tag) override {
      std::unique_lock<std::mutex> lock(hub_.mu_);
      auto& q = hub_.queued_[{peer, rank_, tag}];
      WIOLA_CHECK(
          hub_.cv_.wait_for(lock, std::chrono::seconds(2), [&] { return !q.empty() || hub_.failed_; }) && !hub_.failed_,
          "rank ", rank_, " waits for tag ", tag, " from ", peer, ": deadlock or an earlier failure");
      WIOLA_CHECK(q.front().size() == ts.size(), "tag ", tag, ": ", q.front().size(), " tensors, expected ", ts.size());
      for (size_t i = 0; i < ts.size(); ++i) std::copy(q.front()[i].begin(), q.front()[i].end(), ts[i].as<float>());
      q.pop_front();
    }
    void flush() override { ++flushes; }
    int flushes = 0;

   private:
    InProcessLinks& hub_;
    int rank_;
  };

  void fail() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    cv_.notify_all();
  }
  size_t undelivered() const {
    size_t n = 0;
    for (const auto& [key, q] : queued_) n += q.size();
    return n;
  }
  int sent() const { return sent_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::vector<float>>>> queued_;
  int sent_ = 0;
  bool failed_ = false;
};

// What a test chunk saw of one action: the micro-batch, whether grad-ready
// reports were armed, and the global chunk whose message it received (-1:
// none).
struct ChunkEvent {
  Op op;
  int micro;
  bool armed;
  int from_g;
};

// A model chunk that checks what it is given: its slot's input is the
// previous chunk's forward message for this micro-batch, the backward input
// the next chunk's, no slot or W operand set is reused while its
// micro-batch still needs it; and writes its own messages.
class TestChunk final : public StageChunk {
 public:
  TestChunk(int g, int n_global, int slots, int wslots)
      : g_(g),
        n_(n_global),
        in_(size_t(slots)),
        out_(size_t(slots)),
        slot_micro_(size_t(slots), -1),
        wslot_micro_(size_t(wslots), -1) {
    for (int s = 0; s < slots; ++s) {
      in_[size_t(s)].assign(kTensors, std::vector<float>(kElems, -1.f));
      out_[size_t(s)].assign(kTensors, std::vector<float>(kElems, -1.f));
    }
    bwd_in_.assign(kTensors, std::vector<float>(kElems, -1.f));
    bwd_out_.assign(kTensors, std::vector<float>(kElems, -1.f));
  }

  std::vector<Ptr> fwd_in(int slot) override { return ptrs(in_.at(size_t(slot))); }
  std::vector<CPtr> fwd_out(int slot) const override { return cptrs(out_.at(size_t(slot))); }
  std::vector<Ptr> bwd_in() override { return ptrs(bwd_in_); }
  std::vector<CPtr> bwd_out() const override { return cptrs(bwd_out_); }

  void forward(int slot, const int32_t* tokens, double loss_scale) override {
    const int micro = tokens[0];
    for (size_t k = 0; k < kMbTokens; ++k) expect(tokens[k] == micro, "the micro-batch's tokens");
    expect(loss_scale == kLossScale, "the loss scale");
    expect(slot_micro_.at(size_t(slot)) == -1, "forward into a live slot");
    slot_micro_[size_t(slot)] = micro;
    if (g_ > 0) check_message(in_[size_t(slot)], g_ - 1, micro, false);
    write_message(out_[size_t(slot)], micro, false);
    events.push_back({Op::Fwd, micro, armed_, g_ > 0 ? g_ - 1 : -1});
  }

  void backward(Op op, int slot, int wslot) override {
    const int micro = slot_micro_.at(size_t(slot));
    expect(micro >= 0, "backward of a free slot");
    int from = -1;
    if (op == Op::BwdWeight) {
      expect(wslot_micro_.at(size_t(wslot)) == micro, "W of another micro-batch's operands");
      wslot_micro_[size_t(wslot)] = -1;
    } else {
      if (g_ + 1 < n_) check_message(bwd_in_, from = g_ + 1, micro, true);
      write_message(bwd_out_, micro, true);
    }
    if (op == Op::BwdInput) {
      expect(wslot_micro_.at(size_t(wslot)) == -1, "B into live W operands");
      wslot_micro_[size_t(wslot)] = micro;
    } else {
      slot_micro_[size_t(slot)] = -1;
    }
    events.push_back({op, micro, armed_, from});
  }

  void arm_grad_ready(bool on) override { armed_ = on; }

  std::vector<ChunkEvent> events;
  std::vector<std::string> errors;

 private:
  static std::vector<Ptr> ptrs(std::vector<std::vector<float>>& ts) {
    std::vector<Ptr> r;
    for (auto& t : ts) r.emplace_back(t.data());
    return r;
  }
  static std::vector<CPtr> cptrs(const std::vector<std::vector<float>>& ts) {
    std::vector<CPtr> r;
    for (const auto& t : ts) r.emplace_back(t.data());
    return r;
  }
  void expect(bool ok, const std::string& what) {
    if (!ok) errors.push_back("chunk " + std::to_string(g_) + ": " + what);
  }
  void check_message(const std::vector<std::vector<float>>& ts, int from_g, int micro, bool backward) {
    for (int i = 0; i < kTensors; ++i)
      for (size_t j = 0; j < kElems; ++j)
        expect(ts[size_t(i)][j] == message_value(from_g, micro, backward, i, j),
               std::string(backward ? "backward" : "forward") + " message of micro-batch " + std::to_string(micro));
  }
  void write_message(std::vector<std::vector<float>>& ts, int micro, bool backward) const {
    for (int i = 0; i < kTensors; ++i)
      for (size_t j = 0; j < kElems; ++j) ts[size_t(i)][j] = message_value(g_, micro, backward, i, j);
  }

  int g_, n_;
  std::vector<std::vector<std::vector<float>>> in_, out_;  // [slot][tensor]
  std::vector<std::vector<float>> bwd_in_, bwd_out_;
  std::vector<int> slot_micro_, wslot_micro_;  // the micro-batch in each (-1: free)
  bool armed_ = false;
};

// The observers' calls as words: "begin F0.1", "end F0.1", "done F0.1", "step 2".
class RecordingObserver final : public ScheduleObserver {
 public:
  void compute_begins(const Action& a) override { calls.push_back("begin " + dist::to_string(a)); }
  void compute_ends(const Action& a) override { calls.push_back("end " + dist::to_string(a)); }
  void action_done(const Action& a) override { calls.push_back("done " + dist::to_string(a)); }
  void schedule_done(int64_t t) override { calls.push_back("step " + std::to_string(t)); }
  std::vector<std::string> calls;
};

struct Case {
  std::string schedule;
  int pp, m, v;
  dist::ChunkPlacement placement;
  std::function<std::vector<Action>(int stage)> expected;  // dist::schedule_*
};

// One stage of the pipeline: its schedule, chunks, link, runner and observers.
struct Stage {
  StageSchedule schedule;
  std::vector<std::unique_ptr<TestChunk>> chunks;
  std::unique_ptr<InProcessLinks::Link> link;
  std::unique_ptr<ScheduleRunner> runner;
  RecordingObserver first, second;
  std::string error;
};

constexpr int kSteps = 2;

std::vector<std::unique_ptr<Stage>> run_pipeline(const Case& c, bool report_grads, InProcessLinks& hub) {
  std::vector<std::unique_ptr<Stage>> stages;
  std::vector<int32_t> tokens(size_t(c.m) * kMbTokens);
  for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = int32_t(k / kMbTokens);
  for (int s = 0; s < c.pp; ++s) {
    auto st = std::make_unique<Stage>();
    st->schedule = make_stage_schedule(*parse_enum<dist::Schedule>(c.schedule), c.pp, s, c.m, c.v, c.placement);
    std::vector<StageChunk*> chunks;
    for (int k = 0; k < c.v; ++k) {
      st->chunks.push_back(std::make_unique<TestChunk>(st->schedule.global_chunk(k), c.pp * c.v,
                                                       st->schedule.chunk_slots[size_t(k)],
                                                       st->schedule.chunk_weight_slots[size_t(k)]));
      chunks.push_back(st->chunks.back().get());
    }
    st->link = std::make_unique<InProcessLinks::Link>(hub, s);
    st->runner = std::make_unique<ScheduleRunner>(st->schedule, chunks, *st->link, kMbTokens, kLossScale);
    st->runner->add_observer(st->first);
    st->runner->add_observer(st->second);
    stages.push_back(std::move(st));
  }
  std::vector<std::thread> threads;
  for (auto& sp : stages)
    threads.emplace_back([&, st = sp.get()] {
      try {
        for (int t = 1; t <= kSteps; ++t)
          st->runner->run(t, "stage " + std::to_string(st->schedule.stage), tokens.data(), report_grads);
      } catch (const std::exception& e) {
        st->error = e.what();
        hub.fail();
      }
    });
  for (auto& th : threads) th.join();
  return stages;
}

// The index in `s` of the action a message for `micro` came from: global
// chunk g's forward, or its input-gradient backward (Bwd or BwdInput).
size_t sender_index(const std::vector<Action>& s, const StageSchedule& at, int g, int micro, bool backward) {
  for (size_t k = 0; k < s.size(); ++k) {
    const Action& a = s[k];
    const bool kind = backward ? (a.op == Op::Bwd || a.op == Op::BwdInput) : a.op == Op::Fwd;
    if (kind && a.micro == micro && at.global_chunk(a.chunk) == g) return k;
  }
  ADD_FAILURE() << "no action of global chunk " << g << " for micro-batch " << micro;
  return 0;
}

// Every received message came from the action the simulator takes for the
// receiver's dependency, which ends (simulated) before the receiver starts.
void check_against_simulator(const Case& c, const std::vector<std::unique_ptr<Stage>>& stages) {
  std::vector<std::vector<Action>> all;
  for (const auto& st : stages) all.push_back(st->schedule.actions);
  const dist::PipelineSim sim = dist::simulate_pipeline(all, 1.0, 1.0, 0.5, c.placement);
  for (int s = 0; s < c.pp; ++s) {
    const Stage& st = *stages[size_t(s)];
    std::vector<size_t> next(size_t(c.v), 0);  // each chunk's next event (the first step's)
    for (size_t k = 0; k < all[size_t(s)].size(); ++k) {
      const Action& a = all[size_t(s)][k];
      const ChunkEvent& e = st.chunks[size_t(a.chunk)]->events.at(next[size_t(a.chunk)]++);
      ASSERT_EQ(e.op, a.op);
      ASSERT_EQ(e.micro, a.micro);
      if (e.from_g < 0) continue;
      const int r = st.schedule.chunk_rank(e.from_g);
      const size_t ks = sender_index(all[size_t(r)], stages[size_t(r)]->schedule, e.from_g, a.micro, a.op != Op::Fwd);
      EXPECT_LE(sim.end[size_t(r)][ks], sim.start[size_t(s)][k] + 1e-9)
          << "stage " << s << " " << dist::to_string(a) << " receives from stage " << r << " "
          << dist::to_string(all[size_t(r)][ks]);
    }
  }
}

// Armed exactly for each chunk's last backward (B or whole) and last W of a
// step, when the step reports gradients.
void check_grad_ready(const Stage& st, bool report_grads) {
  for (int c = 0; c < st.schedule.v; ++c) {
    const std::vector<Action> mine = dist::chunk_actions(st.schedule.actions, c);
    std::vector<bool> want(mine.size(), false);
    for (const bool weight : {false, true})
      for (size_t k = mine.size(); k-- > 0;)
        if (mine[k].op != Op::Fwd && (mine[k].op == Op::BwdWeight) == weight) {
          want[k] = report_grads;
          break;
        }
    const auto& events = st.chunks[size_t(c)]->events;
    ASSERT_EQ(events.size(), kSteps * mine.size());
    for (size_t k = 0; k < events.size(); ++k)
      EXPECT_EQ(events[k].armed, want[k % mine.size()])
          << "chunk " << c << " " << dist::to_string(mine[k % mine.size()]);
  }
}

void check_observers(const Stage& st) {
  std::vector<std::string> want;
  for (int t = 1; t <= kSteps; ++t) {
    for (const Action& a : st.schedule.actions)
      for (const char* w : {"begin ", "end ", "done "}) want.push_back(w + dist::to_string(a));
    want.push_back("step " + std::to_string(t));
  }
  EXPECT_EQ(st.first.calls, want);
  EXPECT_EQ(st.second.calls, want);
}

void check_case(const Case& c, bool report_grads) {
  SCOPED_TRACE(c.schedule + " pp " + std::to_string(c.pp) + " m " + std::to_string(c.m) + " v " + std::to_string(c.v) +
               (report_grads ? " reporting gradients" : ""));
  InProcessLinks hub;
  const auto stages = run_pipeline(c, report_grads, hub);
  int messages = 0;
  for (const auto& st : stages) {
    ASSERT_EQ(st->error, "");
    EXPECT_EQ(st->schedule.actions, c.expected(st->schedule.stage));
    for (const auto& ch : st->chunks) EXPECT_EQ(ch->errors, std::vector<std::string>{});
    EXPECT_EQ(st->link->flushes, kSteps);
    check_grad_ready(*st, report_grads);
    check_observers(*st);
    for (const auto& ch : st->chunks)
      for (const ChunkEvent& e : ch->events) messages += e.from_g >= 0;
  }
  EXPECT_EQ(hub.undelivered(), 0u);
  EXPECT_EQ(hub.sent(), messages);
  // Every boundary between the p·v global chunks carries each micro-batch forward and back.
  EXPECT_EQ(messages, kSteps * 2 * c.m * (c.pp * c.v - 1));
  check_against_simulator(c, stages);
}

std::vector<Case> every_schedule() {
  using P = dist::ChunkPlacement;
  std::vector<Case> cs;
  for (const auto& [pp, m] : std::vector<std::pair<int, int>>{{1, 2}, {2, 4}, {4, 8}, {4, 2}}) {
    cs.push_back({"1f1b", pp, m, 1, P::Interleaved, [=](int s) { return dist::schedule_1f1b(pp, s, m); }});
    cs.push_back({"gpipe", pp, m, 1, P::Interleaved, [=](int s) { return dist::schedule_gpipe(pp, s, m); }});
    cs.push_back({"zb-h1", pp, m, 1, P::Interleaved, [=](int s) { return dist::schedule_zb_h1(pp, s, m); }});
  }
  for (const auto& [pp, m, v] : std::vector<std::tuple<int, int, int>>{{1, 2, 2}, {2, 4, 2}, {4, 8, 2}, {2, 4, 4}})
    cs.push_back(
        {"interleaved", pp, m, v, P::Interleaved, [=](int s) { return dist::schedule_interleaved(pp, s, m, v); }});
  for (const auto& [pp, m] : std::vector<std::pair<int, int>>{{1, 2}, {2, 2}, {2, 4}, {4, 8}})
    cs.push_back({"zb-v", pp, m, 2, P::V, [=](int s) { return dist::schedule_zb_v(pp, s, m); }});
  return cs;
}

TEST(ScheduleRunner, EverySchedulePassesItsTensorsInTheSimulatorsOrder) {
  for (const Case& c : every_schedule()) check_case(c, true);
}

TEST(ScheduleRunner, NoGradReadyReportsWhenTheStepDoesNotAskForThem) {
  for (const Case& c : every_schedule()) check_case(c, false);
}

// A message that never comes (here: no stage 0 to send it) ends the step
// with the link's error, not a hang.
TEST(ScheduleRunner, AMissingMessageEndsTheStepWithAnError) {
  InProcessLinks hub;
  StageSchedule s = make_stage_schedule(dist::Schedule::OneFOneB, 2, 1, 2, 1, dist::ChunkPlacement::Interleaved);
  TestChunk chunk(1, 2, s.chunk_slots[0], s.chunk_weight_slots[0]);
  InProcessLinks::Link link(hub, 1);
  ScheduleRunner runner(s, {&chunk}, link, kMbTokens, kLossScale);
  std::vector<int32_t> tokens(2 * kMbTokens, 0);
  hub.fail();  // no stage 0: the first receive fails at once
  EXPECT_THROW(runner.run(1, "stage 1 step 1", tokens.data(), false), Error);
}

}  // namespace
}  // namespace wiola
