#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "dist/optimizer.h"
#include "model/model.h"
#include "train/dump.h"
#include "train/schedule.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string human_duration(double s) {
  char buf[64];
  const long v = long(s + 0.5);
  if (v >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", v / 3600, (v / 60) % 60);
  else if (v >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", v / 60, v % 60);
  else std::snprintf(buf, sizeof buf, "%lds", v);
  return buf;
}

}  // namespace

std::vector<dist::ParamSegment> optimizer_segments(const ParamLayout& layout) {
  std::vector<dist::ParamSegment> segs;
  for (const ParamEntry& e : layout.entries()) segs.push_back({e.offset, e.size(), e.decay, true});
  return segs;
}

TrainSummary run_training(const RunConfig& rc, const TrainOptions& opt) {
  const TrainSection& tr = rc.train;
  const ModelConfig& cfg = rc.model;
  validate_run_config(rc);
  WIOLA_CHECK(rc.parallel.tp == 1 && rc.parallel.pp == 1 && rc.parallel.dp == 1,
              "parallel.tp/pp/dp = ", rc.parallel.tp, "/", rc.parallel.pp, "/", rc.parallel.dp,
              ": `wiola train` runs one process so far (multi-rank layouts are issue #4); set them to 1");
  WIOLA_CHECK(!rc.data.path.empty(), rc.source, ": data.path is not set (a manifest.json from `wiola prep`, "
              "its directory, or one .h5 shard)");
  set_cpu_threads(tr.threads);

  const int B = tr.micro_batch, T = cfg.T;
  const int64_t GB = rc.global_batch();
  const uint64_t data_seed = rc.data.seed >= 0 ? uint64_t(rc.data.seed) : tr.seed;
  TokenLoader loader(rc.data.path, "train", T, int(GB), 0, 1, data_seed, rc.data.shuffle,
                     rc.data.prefetch > 0);
  loader.expect(uint32_t(cfg.V));
  std::unique_ptr<TokenLoader> val;
  LoaderState val_start{};
  if (tr.eval_every > 0) {
    val = std::make_unique<TokenLoader>(rc.data.path, "val", T, B, 0, 1, data_seed, false, false);
    val_start = val->state();
  }

  auto ops = make_cpu_ops<float>();
  ModelOptions mo;
  mo.micro_batch = B;
  mo.recompute = tr.recompute;
  Model<float> model(*ops, cfg, ModelShard{}, nullptr, mo);
  model.init(tr.seed);
  const int64_t n_params = cfg.param_count();
  WIOLA_CHECK(int64_t(model.n_params()) == n_params, "internal: layout holds ", model.n_params(),
              " parameters, SPEC formula ", n_params);

  dist::AdamWConfig ac;
  ac.beta1 = tr.beta1; ac.beta2 = tr.beta2; ac.eps = tr.adam_eps;
  ac.weight_decay = tr.weight_decay; ac.clip = tr.clip;
  ac.zero = false; ac.nonfinite_fatal = tr.nonfinite_fatal;
  dist::DistAdamW adam(*ops, model.params(), model.grads(), model.n_params(),
                       optimizer_segments(model.layout()), ac, nullptr, nullptr);

  const char* budget = "train.steps";
  int64_t t_max = tr.steps;
  if (t_max == 0 && tr.tokens > 0) { t_max = steps_for_tokens(tr.tokens, GB, T); budget = "train.tokens"; }
  if (t_max == 0) { t_max = chinchilla_steps(n_params, GB, T); budget = "Chinchilla 20 N"; }
  const int64_t warmup = tr.warmup >= 0 ? tr.warmup : default_warmup(t_max);
  const int64_t last_step = tr.max_steps > 0 ? std::min(t_max, tr.max_steps) : t_max;
  std::map<int64_t, std::string> dumps(opt.dumps.begin(), opt.dumps.end());
  for (const auto& [s, p] : dumps)
    WIOLA_CHECK(s >= 1 && s <= last_step, "--dump-step ", s, ":", p, ": step outside 1..", last_step);

  const std::filesystem::path run_dir(tr.run_dir);
  std::filesystem::create_directories(run_dir);
  write_text_atomic((run_dir / "config.toml").string(), run_config_to_toml(rc));
  std::ofstream metrics(run_dir / "metrics.jsonl", std::ios::trunc);
  WIOLA_CHECK(metrics.good(), "cannot write '", (run_dir / "metrics.jsonl").string(), "'");

  const auto& di = loader.info();
  std::printf("wiola train: %s  %lld parameters (d=%d L=%d H=%d H_kv=%d d_A=%d d_B=%d V=%d T=%d)\n",
              cfg.name.c_str(), (long long)n_params, cfg.d, cfg.L, cfg.H, cfg.Hkv, cfg.dA, cfg.dB,
              cfg.V, T);
  std::printf("  data %s: %llu train samples; global batch %lld = %d x %d micro-batches "
              "(%lld tokens/step)\n", rc.data.path.c_str(), (unsigned long long)di.num_samples,
              (long long)GB, B, tr.grad_accum, (long long)(GB * T));
  std::printf("  Chinchilla budget: D = 20 x %lld = %lld tokens; T_max = ceil(D / (%lld x %d)) = %lld steps\n",
              (long long)n_params, (long long)(20 * n_params), (long long)GB, T,
              (long long)chinchilla_steps(n_params, GB, T));
  std::printf("  steps T_max = %lld (from %s), warmup %lld, lr %.3g -> %.3g, %d threads\n",
              (long long)t_max, budget, (long long)warmup, tr.lr_max, tr.lr_min, cpu_threads());
  std::printf("  memory: parameters+gradients %.1f MiB, AdamW state %.1f MiB, activations %.1f MiB%s\n",
              double(model.param_bytes()) / 1048576.0, double(adam.state_bytes_this_rank()) / 1048576.0,
              double(model.activation_bytes()) / 1048576.0, tr.recompute ? " (recompute on)" : "");
  if (!rc.checkpoint.dir.empty())
    std::printf("  note: checkpoint.dir is set but checkpoints are not written yet "
                "(resumable checkpoints are a later issue)\n");
  std::fflush(stdout);

  std::vector<int32_t> batch(size_t(GB) * (T + 1));
  const size_t mb_tokens = size_t(B) * (T + 1);
  const double scale = 1.0 / double(GB * T);
  TrainSummary sum;
  sum.t_max = t_max;
  double ema_step_s = 0, train_s = 0;

  auto evaluate = [&]() {
    val->restore(val_start);
    std::vector<int32_t> vb(mb_tokens);
    double tot = 0;
    const int n = tr.eval_batches * tr.grad_accum;
    for (int i = 0; i < n; ++i) {
      val->next_batch(vb.data());
      tot += model.eval_loss(vb.data());
    }
    return tot / (double(n) * B * T);
  };

  for (int64_t t = 1; t <= last_step; ++t) {
    const auto t0 = Clock::now();
    loader.next_batch(batch.data());
    const auto dump_it = dumps.find(t);
    const bool dumping = dump_it != dumps.end();
    StepDump dump;
    if (dumping) {
      model.set_keep_logits(true);
      dump.cfg = cfg;
      dump.B = int(GB);
      dump.tokens = batch;
      dump.params.resize(model.n_params());
      ops->download(dump.params.data(), model.params(), model.n_params() * sizeof(float));
      if (t > 1) adam.gather_moments(dump.m, dump.v);
    }
    model.zero_grads();
    double loss_sum = 0;
    for (int k = 0; k < tr.grad_accum; ++k) {
      loss_sum += model.train_micro_step(batch.data() + size_t(k) * mb_tokens, scale);
      if (dumping) {
        const auto& lg = model.last_logits();
        dump.logits.insert(dump.logits.end(), lg.begin(), lg.end());
        for (int l = 0; l < cfg.L; ++l) {
          const auto& o = model.atm_open(l);
          if (!o.empty()) dump.atm[l].insert(dump.atm[l].end(), o.begin(), o.end());
        }
      }
    }
    const double loss = loss_sum * scale;
    const double lr = lr_at(t, t_max, warmup, tr.lr_max, tr.lr_min);
    if (dumping) {
      dump.grads.resize(model.n_params());
      ops->download(dump.grads.data(), model.grads(), model.n_params() * sizeof(float));
    }
    const dist::StepResult res = adam.step(lr, adam.applied_steps() + 1);
    if (res.skipped) ++sum.skipped;
    if (dumping) {
      model.set_keep_logits(false);
      dump.loss = loss;
      dump.grad_norm = res.grad_norm;
      dump.params_after.resize(model.n_params());
      ops->download(dump.params_after.data(), model.params(), model.n_params() * sizeof(float));
      dump.float_attrs = {{"lr", lr}, {"lr_max", tr.lr_max}, {"lr_min", tr.lr_min},
                          {"beta1", tr.beta1}, {"beta2", tr.beta2}, {"adam_eps", tr.adam_eps},
                          {"weight_decay", tr.weight_decay}, {"clip", tr.clip}};
      dump.int_attrs = {{"step", t}, {"t_max", t_max}, {"warmup", warmup}};
      write_step_dump(dump_it->second, model.layout(), dump);
    }
    const double step_s = seconds_since(t0);
    train_s += step_s;
    ema_step_s = t == 1 ? step_s : 0.9 * ema_step_s + 0.1 * step_s;
    const double tps = double(GB * T) / step_s;
    if (t == 1) sum.first_loss = loss;
    sum.last_loss = loss;
    sum.steps = t;

    nlohmann::json j = {{"step", t}, {"loss", loss}, {"lr", lr}, {"grad_norm", res.grad_norm},
                        {"tokens", t * GB * T}, {"tokens_per_s", tps}, {"step_ms", step_s * 1e3},
                        {"skipped", sum.skipped}};
    if (!std::isfinite(loss)) j["loss"] = nullptr;
    if (!std::isfinite(res.grad_norm)) j["grad_norm"] = nullptr;
    const bool eval_now = val && (t % tr.eval_every == 0 || t == last_step);
    if (eval_now) {
      sum.val_loss = evaluate();
      j["val_loss"] = sum.val_loss;
    }
    metrics << j.dump() << '\n';
    metrics.flush();
    if (!opt.quiet && (t % tr.log_every == 0 || t == 1 || t == last_step || eval_now)) {
      std::printf("step %6lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | %.0f ms | ETA %s",
                  (long long)t, (long long)last_step, loss, lr, res.grad_norm, tps, step_s * 1e3,
                  human_duration(ema_step_s * double(last_step - t)).c_str());
      if (eval_now) std::printf(" | val %.4f", sum.val_loss);
      if (res.skipped) std::printf(" | SKIPPED (non-finite grad norm; %lld so far)", (long long)sum.skipped);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  sum.tokens_per_s = double(sum.steps * GB * T) / train_s;
  std::printf("done: %lld steps, loss %.4f -> %.4f", (long long)sum.steps, sum.first_loss, sum.last_loss);
  if (sum.val_loss >= 0) std::printf(", val %.4f", sum.val_loss);
  std::printf(", %.0f tokens/s, %lld skipped steps, peak RSS %.0f MiB\n", sum.tokens_per_s,
              (long long)sum.skipped, peak_rss_mib());
  for (const auto& s : model.atm_stats())
    std::printf("  ATM layer %d (last batch): mu = %.4f, visible attention pairs %.2f%% of causal\n",
                s.layer, s.mu, 100.0 * s.visible_fraction);
  std::printf("  metrics: %s\n", (run_dir / "metrics.jsonl").string().c_str());
  return sum;
}

}  // namespace wiola
