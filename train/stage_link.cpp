#include "train/stage_link.h"

#include "util/error.h"
#include "util/trace.h"

namespace wiola {

namespace {
// A message's span on the timeline (util/trace.h): "send to stage 2", its
// tag and bytes as arguments.
trace::Span message_span(const char* what, int peer, int tag, size_t bytes) {
  if (!trace::wanted()) return trace::Span("p2p", {});
  return trace::Span("p2p", std::string(what) + " stage " + std::to_string(peer),
                     "{\"peer\":" + std::to_string(peer) + ",\"tag\":" + std::to_string(tag) +
                         ",\"bytes\":" + std::to_string(bytes) + "}");
}
}  // namespace

StageLink::StageLink(Ops<float>& ops, dist::Comm& pp_data, DType t, size_t tensor_elems)
    : ops_(ops), pp_(pp_data), t_(t), each_(tensor_elems) {}

StageLink::~StageLink() { flush(); }

void StageLink::send(const std::vector<CPtr>& ts, int peer, int tag) {
  const size_t n = ts.size() * each_, bytes = each_ * dtype_bytes(t_);
  const trace::Span span = message_span("send to", peer, tag, n * dtype_bytes(t_));
  if (peer == pp_.rank()) {
    WIOLA_CHECK(!mailbox_.count(tag), "internal: a second pipeline message with tag ", tag, " to this rank");
    DynBuffer<float>& box = mailbox_[tag];
    if (!spare_.empty() && spare_.back().size() == n) {
      box = std::move(spare_.back());
      spare_.pop_back();
    } else {
      box = DynBuffer<float>(ops_, t_, n);
    }
    for (size_t i = 0; i < ts.size(); ++i) ops_.copy((box.data() + i * each_).raw(), ts[i].raw(), bytes);
    return;
  }
  Pending* p = nullptr;
  for (auto& q : pending_)
    if (!q.req.pending() || q.req.test()) {
      p = &q;
      break;
    }
  if (!p) p = &pending_.emplace_back();
  if (p->data.size() != n) p->data = DynBuffer<float>(ops_, t_, n);
  for (size_t i = 0; i < ts.size(); ++i) ops_.copy((p->data.data() + i * each_).raw(), ts[i].raw(), bytes);
  p->req = pp_.isend(p->data.data().raw(), n, t_, peer, tag);
}

void StageLink::recv(const std::vector<Ptr>& ts, int peer, int tag) {
  const size_t n = ts.size() * each_, bytes = each_ * dtype_bytes(t_);
  const trace::Span span = message_span("receive from", peer, tag, n * dtype_bytes(t_));
  if (peer == pp_.rank()) {
    auto it = mailbox_.find(tag);
    WIOLA_CHECK(it != mailbox_.end() && it->second.size() == n, "internal: no pipeline message with tag ", tag, " of ",
                n, " elements from this rank itself (the schedule receives before it sends)");
    for (size_t i = 0; i < ts.size(); ++i) ops_.copy(ts[i].raw(), (it->second.data() + i * each_).raw(), bytes);
    spare_.push_back(std::move(it->second));
    mailbox_.erase(it);
    return;
  }
  if (staging_.size() != n) staging_ = DynBuffer<float>(ops_, t_, n);
  pp_.irecv(staging_.data().raw(), n, t_, peer, tag).wait();
  for (size_t i = 0; i < ts.size(); ++i) ops_.copy(ts[i].raw(), (staging_.data() + i * each_).raw(), bytes);
}

void StageLink::flush() {
  const trace::Span span("p2p", trace::wanted() && !pending_.empty() ? "wait for sends" : std::string());
  for (auto& p : pending_) p.req.wait();
}

}  // namespace wiola
