#include "token_tree.h"

#include <algorithm>

namespace token_tree {

namespace {

float clamp01(float p) {
  return p > 0.0f ? (p < 1.0f ? p : 1.0f) : 0.0f;  // NaN -> 0
}

// Max-heap order: larger value first, then earlier push.
bool later(const TreeQueueEntry &a, const TreeQueueEntry &b) {
  if (a.value != b.value) return a.value < b.value;
  return a.seq > b.seq;
}

}  // namespace

double pass_cost(const TreeSpec &spec, int32_t n) {
  if (n < 0) n = 0;
  if (spec.pass_cost && spec.n_pass_cost > 0) {
    if (n < spec.n_pass_cost) return spec.pass_cost[n];
    const int32_t last = spec.n_pass_cost - 1;
    double step = kDefaultPassStep;
    if (last >= 1) step = std::max(0.0, double(spec.pass_cost[last]) - spec.pass_cost[last - 1]);
    return spec.pass_cost[last] + step * (n - last);
  }
  return 1.0 + kDefaultPassStep * n;
}

void build_tree(const TreeSpec &spec, Tree &out, std::vector<TreeQueueEntry> &queue) {
  out.tokens.clear();
  out.parents.clear();
  out.values.clear();
  out.origins.clear();
  queue.clear();
  uint32_t seq = 0;
  const int32_t n_levels = static_cast<int32_t>(spec.levels.size());
  const int32_t n_chains = std::min<int32_t>(static_cast<int32_t>(spec.chains.size()), kMaxChains);
  auto chain_at = [&](int32_t c, int32_t depth) -> const Candidate * {
    const std::vector<Candidate> &ch = spec.chains[static_cast<size_t>(c)];
    return depth < static_cast<int32_t>(ch.size()) ? &ch[static_cast<size_t>(depth)] : nullptr;
  };
  auto first_chain = [](uint32_t mask) { return mask ? __builtin_ctz(mask) : -1; };

  auto push = [&](float value, int32_t parent, int32_t token, int32_t depth, int32_t rank,
                  uint32_t chains, bool on_path) {
    if (!(value > 0.0f)) return;
    queue.push_back({value, parent, token, NodeOrigin{depth, rank, first_chain(chains)}, chains,
                     seq++, on_path});
    std::push_heap(queue.begin(), queue.end(), later);
  };
  // Pushes the children of node `parent` (-1: the root) at depth `depth` with value `value`,
  // lying on the paths of the chains in `on` (and on the levels' first path: on_path).
  auto expand = [&](int32_t parent, int32_t depth, float value, uint32_t on, bool on_path) {
    uint32_t merged = 0;  // chains whose token here is a head's candidate
    if (depth < n_levels && (on_path || !spec.path_levels)) {
      const std::vector<Candidate> &level = spec.levels[static_cast<size_t>(depth)];
      for (size_t r = 0; r < level.size(); ++r) {
        const Candidate &c = level[r];
        bool repeated = false;
        for (size_t q = 0; q < r && !repeated; ++q) repeated = level[q].token == c.token;
        if (repeated) continue;
        float p = clamp01(c.p);
        uint32_t chains = 0;
        for (uint32_t m = on; m; m &= m - 1) {
          const int32_t ch = __builtin_ctz(m);
          const Candidate *t = chain_at(ch, depth);
          if (t && t->token == c.token) {
            p = std::max(p, clamp01(t->p));
            chains |= 1u << ch;
          }
        }
        merged |= chains;
        push(value * p, parent, c.token, depth + 1, static_cast<int32_t>(r), chains,
             on_path && r == 0);
      }
    }
    // Chain tokens no head proposed, one node per distinct token.
    uint32_t left = on & ~merged;
    while (left) {
      const int32_t ch = __builtin_ctz(left);
      const Candidate *t = chain_at(ch, depth);
      left &= left - 1;
      if (!t) continue;
      float p = clamp01(t->p);
      uint32_t chains = 1u << ch;
      for (uint32_t m = left; m; m &= m - 1) {
        const int32_t other = __builtin_ctz(m);
        const Candidate *u = chain_at(other, depth);
        if (u && u->token == t->token) {
          p = std::max(p, clamp01(u->p));
          chains |= 1u << other;
        }
      }
      left &= ~chains;
      push(value * p, parent, t->token, depth + 1, -1, chains, false);
    }
  };

  const int32_t cap = std::max<int32_t>(0, spec.max_nodes);
  expand(-1, 0, 1.0f, n_chains >= 32 ? ~0u : (1u << n_chains) - 1, true);
  while (static_cast<int32_t>(out.tokens.size()) < cap && !queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), later);
    const TreeQueueEntry e = queue.back();
    queue.pop_back();
    const int32_t id = static_cast<int32_t>(out.tokens.size());
    out.tokens.push_back(e.token);
    out.parents.push_back(e.parent);
    out.values.push_back(e.value);
    out.origins.push_back(e.origin);
    if (!spec.allow_tree) queue.clear();  // a chain: only the best child of the last node
    expand(id, e.origin.depth, e.value, e.chains, e.on_path);
  }

  // Keep the prefix (values are in non-increasing order) with the most tokens per unit of time.
  const double draft = std::max(0.0f, spec.draft_cost);
  double sum = 0.0;
  size_t best_n = 0;
  double best_rate = 1.0 / (draft + pass_cost(spec, 0));
  double best_sum = 0.0;
  for (size_t n = 1; n <= out.values.size(); ++n) {
    sum += out.values[n - 1];
    const double rate = (1.0 + sum) / (draft + pass_cost(spec, static_cast<int32_t>(n)));
    if (rate > best_rate) {
      best_rate = rate;
      best_n = n;
      best_sum = sum;
    }
  }
  out.tokens.resize(best_n);
  out.parents.resize(best_n);
  out.values.resize(best_n);
  out.origins.resize(best_n);
  out.expected_tokens = 1.0 + best_sum;
  out.cost = draft + pass_cost(spec, static_cast<int32_t>(best_n));
}

void DraftClock::start() {
  start_ = Clock::now();
  if (last_valid_ && last_pass_cost_ > 0) {
    const double round_ms = std::chrono::duration<double, std::milli>(start_ - last_start_).count();
    const double p1 = (round_ms - last_draft_ms_) / last_pass_cost_;
    // Skip gaps in which the application did something else between rounds.
    if (p1 > 0 && (pass1_ms_ == 0 || p1 < 4 * pass1_ms_))
      pass1_ms_ = pass1_ms_ == 0 ? p1 : 0.9 * pass1_ms_ + 0.1 * p1;
  }
  last_valid_ = false;
}

void DraftClock::drafted(double pass_cost, bool timed) {
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
  if (timed) draft_ms_ = draft_ms_ == 0 ? ms : 0.9 * draft_ms_ + 0.1 * ms;
  last_start_ = start_;
  last_draft_ms_ = ms;
  last_pass_cost_ = pass_cost;
  last_valid_ = pass_cost > 0;
}

float DraftClock::cost() const {
  return pass1_ms_ > 0 ? static_cast<float>(std::min(draft_ms_ / pass1_ms_, 2.0)) : 0.0f;
}

}  // namespace token_tree
