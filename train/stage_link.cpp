#include "train/stage_link.h"

namespace wiola {

StageLink::StageLink(Ops<float>& ops, dist::Comm& pp_data, DType t, size_t tensor_elems)
    : ops_(ops), pp_(pp_data), t_(t), each_(tensor_elems) {}

StageLink::~StageLink() { flush(); }

void StageLink::send(const std::vector<CPtr>& ts, int peer, int tag) {
  Pending* p = nullptr;
  for (auto& q : pending_)
    if (!q.req.pending() || q.req.test()) {
      p = &q;
      break;
    }
  if (!p) p = &pending_.emplace_back();
  const size_t n = ts.size() * each_, bytes = each_ * dtype_bytes(t_);
  if (p->data.size() != n) p->data = DynBuffer<float>(ops_, t_, n);
  for (size_t i = 0; i < ts.size(); ++i) ops_.copy((p->data.data() + i * each_).raw(), ts[i].raw(), bytes);
  p->req = pp_.isend(p->data.data().raw(), n, t_, peer, tag);
}

void StageLink::recv(const std::vector<Ptr>& ts, int peer, int tag) {
  const size_t n = ts.size() * each_, bytes = each_ * dtype_bytes(t_);
  if (staging_.size() != n) staging_ = DynBuffer<float>(ops_, t_, n);
  pp_.irecv(staging_.data().raw(), n, t_, peer, tag).wait();
  for (size_t i = 0; i < ts.size(); ++i) ops_.copy(ts[i].raw(), (staging_.data() + i * each_).raw(), bytes);
}

void StageLink::flush() {
  for (auto& p : pending_) p.req.wait();
}

}  // namespace wiola
