// Sparse token trees for tree drafters (medusa, draft-model with tree=1): which candidates the
// target verifies in one pass. A pure function of its inputs, tested white-box.
//
// Every node stands for a path of drafted tokens after the last committed one; its value is the
// estimated probability that the target accepts the whole path: the product, along the path, of
// each token's estimated probability of being the target's token given that its parent was
// accepted. Levels give the candidates at each depth: the same under every parent (Medusa heads
// read one hidden state) or, with path_levels, only under the path of the levels' first
// candidates (a draft model run down its own best path). Chains (prompt lookup's continuations)
// add paths of their own: a chain's token at depth d is a child only of the nodes on that chain's
// path. Where several sources propose one token under one parent they are one node, with the
// largest estimate.
//
// Values never grow down a path (estimates are at most 1), so the n nodes of largest value form a
// tree (every ancestor of one of them is among them, ties going to the ancestor): best-first
// search, popping the node of largest value and pushing its children, yields them in order, parents
// before children. The expected number of tokens a round emits with those n nodes is
// 1 + (sum of their values) (each accepted node, plus the target's own token after the accepted
// path); the round costs draft_cost + pass_cost(n) one-token passes. The tree keeps the n
// (at most max_nodes) that maximize expected tokens per unit of time.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace token_tree {

// A token proposed at some depth, with the estimated probability that it is the target's token
// there given that its parent was accepted (clamped to [0, 1]; 0 = never proposed).
struct Candidate {
  int32_t token = 0;
  float p = 0.0f;
};

// Where a node came from (for learning the estimates from what the target accepted).
struct NodeOrigin {
  int32_t depth = 0;   // 1 = a child of the last committed token
  int32_t rank = -1;   // index in levels[depth - 1], -1 when no head proposed it
  int32_t chain = -1;  // the first chain whose path the node lies on, -1 = none
};

// At most this many chains.
constexpr int32_t kMaxChains = 32;

struct TreeSpec {
  // levels[d]: the candidates for depth d + 1, under every parent at depth d. Distinct tokens
  // (a repeated token is skipped); any order.
  std::vector<std::vector<Candidate>> levels;
  // Chains: chains[c][i] follows chains[c][0 .. i) after the last committed token (at most
  // kMaxChains; a token with p = 0 is proposed only where a head proposes it too).
  std::vector<std::vector<Candidate>> chains;
  // true: levels[d] (d >= 1) are children only of the node of levels[d - 1][0]'s token that lies
  // on the path of such nodes from the root (heads that read the path they extend were run down
  // that one path).
  bool path_levels = false;
  int32_t max_nodes = 0;   // at most this many nodes
  bool allow_tree = true;  // false: a chain (each node at most one child, the best)
  // pass_cost[i]: the time of a pass over i + 1 tokens relative to a one-token pass, for
  // i < n_pass_cost; beyond (or when NULL) the cost grows by the last known step, or by
  // kDefaultPassStep per token with nothing known.
  const float *pass_cost = nullptr;
  int32_t n_pass_cost = 0;
  float draft_cost = 0.0f;  // the drafter's own time, in one-token passes
};

constexpr float kDefaultPassStep = 0.05f;

struct Tree {
  std::vector<int32_t> tokens, parents;  // parents[j] < j; -1 = the last committed token
  std::vector<float> values;             // estimated probability that the path to j is accepted
  std::vector<NodeOrigin> origins;
  double expected_tokens = 1.0;  // 1 + sum of values
  double cost = 1.0;             // draft_cost + pass cost of the nodes, in one-token passes
};

// The cost of a pass over the last committed token and n nodes, per the spec's pass costs.
double pass_cost(const TreeSpec &spec, int32_t n);

// Builds the tree (see above) into `out` (its vectors are reused). Scratch memory is kept in
// `queue` between calls.
struct TreeQueueEntry {
  float value;
  int32_t parent;  // index in the output, -1 = the root
  int32_t token;
  NodeOrigin origin;
  uint32_t chains;  // bit c: the node lies on chain c's path
  uint32_t seq;     // push order: ties pop first-pushed first
  bool on_path;     // the node lies on the path of the levels' first candidates
};
void build_tree(const TreeSpec &spec, Tree &out, std::vector<TreeQueueEntry> &queue);

// A tree drafter's own time in one-token target passes (TreeSpec::draft_cost), measured from its
// rounds: the time from one draft's start to the next is the draft plus the target's pass over
// the tree, whose cost in one-token passes the builder predicted (pass_cost(spec, n)), so the two
// give the time of a one-token pass. Both times are running averages.
class DraftClock {
 public:
  using Clock = std::chrono::steady_clock;
  // A draft starts: the round that ends here teaches the time of a one-token pass.
  void start();
  // The draft is made; its pass is predicted to cost `pass_cost` one-token passes (0: nothing to
  // verify). `timed`: the draft's time goes into the average (false for a draft that skipped
  // the costly part, such as a prompt-lookup match).
  void drafted(double pass_cost, bool timed);
  // The next draft starts a new text: the time until then is no round.
  void forget() { last_valid_ = false; }
  // The draft's time in one-token passes, at most 2; 0 until both times are known.
  float cost() const;

 private:
  Clock::time_point start_{}, last_start_{};
  double draft_ms_ = 0, pass1_ms_ = 0, last_draft_ms_ = 0, last_pass_cost_ = 0;
  bool last_valid_ = false;
};

}  // namespace token_tree
