#include "session/budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace specinfer {

namespace {

// A plan's totals, kept as the greedy moves.
struct Totals {
  double value = 0, tokens = 0, draft = 0;
};

// saving: what the plan's prompt chunks take off the pass time (S in the header).
double goodput(const Totals &t, const PassTime &pass_ms, double saving) {
  const double ms = std::max(0.0, pass_ms(t.tokens) - saving) + t.draft;
  return ms > 0 ? t.value / ms : 0.0;
}

}  // namespace

PassTime interpolated_pass_time(std::vector<double> table) {
  return [table = std::move(table)](double tokens) {
    if (table.empty()) return 0.0;
    const double last = static_cast<double>(table.size() - 1);
    if (tokens >= last) {
      const double step = table.size() >= 2 ? table.back() - table[table.size() - 2] : 0.0;
      return table.back() + step * (tokens - last);
    }
    const double lo = std::floor(std::max(tokens, 0.0));
    const size_t i = static_cast<size_t>(lo);
    return table[i] + (table[i + 1] - table[i]) * (tokens - lo);
  };
}

DraftBudget choose_drafts(const std::vector<DraftOffer> &offers, double fixed_tokens,
                          const PassTime &pass_ms, double fixed_saving_ms) {
  DraftBudget b;
  const double saving = fixed_tokens > 0 ? std::max(0.0, fixed_saving_ms) : 0.0;
  b.k.resize(offers.size());
  Totals cur;
  cur.tokens = std::max(0.0, fixed_tokens);
  for (size_t i = 0; i < offers.size(); ++i) {
    const DraftOffer &o = offers[i];
    const int32_t k = std::clamp(o.least, 0, std::max(o.most, 0));
    b.k[i] = k;
    cur.value += o.value ? o.value[k] : 1.0;
    cur.tokens += 1.0 + (o.nodes ? o.nodes[k] : 0.0);
    cur.draft += o.draft_ms ? o.draft_ms[k] : 0.0;
  }
  const auto finish = [&](const std::vector<int32_t> &k, const Totals &t, double plain) {
    b.k = k;
    b.value = t.value;
    b.pass_tokens = t.tokens;
    b.fixed_tokens = std::max(0.0, fixed_tokens);
    b.fixed_saving_ms = saving;
    b.pass_ms = std::max(0.0, pass_ms(t.tokens) - saving);
    b.draft_ms = t.draft;
    b.goodput = goodput(t, pass_ms, saving);
    b.plain_goodput = plain;
    return b;
  };
  const double plain = goodput(cur, pass_ms, saving);
  if (!(pass_ms(cur.tokens) > 0)) return finish(b.k, cur, plain);
  // What a step's added time must buy at least: the plain goodput of the step without its prompt
  // chunks (see the header).
  Totals decode = cur;
  decode.tokens -= std::max(0.0, fixed_tokens);
  const double floor_rate = std::max(plain, goodput(decode, pass_ms, 0.0));

  std::vector<int32_t> k = b.k, best_k = b.k;
  Totals best = cur;
  double best_g = plain;
  for (;;) {
    // The step of largest added value per added time.
    size_t step_i = offers.size();
    int32_t step_k = 0;
    double step_ratio = -1, step_dv = 0, step_dn = 0, step_dd = 0;
    const double t0 = pass_ms(cur.tokens);
    for (size_t i = 0; i < offers.size(); ++i) {
      const DraftOffer &o = offers[i];
      if (!o.value || !o.nodes || !o.draft_ms) continue;
      const int32_t from = k[i];
      for (int32_t to = from + 1; to <= o.most; ++to) {
        const double dv = o.value[to] - o.value[from];
        if (!(dv > 0)) continue;
        const double dn = o.nodes[to] - o.nodes[from], dd = o.draft_ms[to] - o.draft_ms[from];
        const double dt = std::max(0.0, pass_ms(cur.tokens + dn) - t0) + std::max(0.0, dd);
        const double ratio = dt > 0 ? dv / dt : std::numeric_limits<double>::max();
        if (!(ratio > floor_rate)) continue;
        if (ratio > step_ratio) {
          step_ratio = ratio;
          step_i = i;
          step_k = to;
          step_dv = dv;
          step_dn = dn;
          step_dd = dd;
        }
      }
    }
    if (step_i == offers.size()) break;
    k[step_i] = step_k;
    cur.value += step_dv;
    cur.tokens += step_dn;
    cur.draft += step_dd;
    const double g = goodput(cur, pass_ms, saving);
    // A plan must beat the best so far clearly: a draft that gains nothing is not worth running.
    if (g > best_g * 1.0001) {
      best_g = g;
      best = cur;
      best_k = k;
    }
  }
  return finish(best_k, best, plain);
}

void group_pass_cost(const DraftBudget &budget, const std::vector<DraftOffer> &offers, size_t i,
                     const PassTime &pass_ms, float *out) {
  const DraftOffer &o = offers[i];
  const int32_t k = budget.k[i];
  const double nodes = o.nodes ? o.nodes[k] : 0.0, value = o.value ? o.value[k] : 1.0,
               draft = o.draft_ms ? o.draft_ms[k] : 0.0;
  // The step without this session's draft: its pass, the others' drafting, the tokens expected.
  const double base = std::max(1.0, budget.pass_tokens - nodes);
  const double t_base = std::max(0.0, pass_ms(base) - budget.fixed_saving_ms);
  const double others_ms = t_base + std::max(0.0, budget.draft_ms - draft);
  const double others_tokens = std::max(1.0, budget.value - value + (o.value ? o.value[0] : 1.0));
  // The step's time per expected token, at most a step's without prompt chunks (see the header).
  const double decode_ms =
      pass_ms(std::max(1.0, base - budget.fixed_tokens)) + std::max(0.0, budget.draft_ms - draft);
  const double unit = std::min(others_ms, decode_ms) / others_tokens;
  for (int32_t n = 0; n <= k; ++n)
    out[n] =
        unit > 0
            ? static_cast<float>(
                  1.0 + std::max(0.0, pass_ms(base + n) - budget.fixed_saving_ms - t_base) / unit)
            : 1.0f;
}

}  // namespace specinfer
