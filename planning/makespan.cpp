#include "planning/makespan.hpp"

#include "planning/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace oobleck::planning {

namespace {

/// Makespan for m microbatches, simulated pair by pair: in pair p stage s runs F(p) if p < m, then
/// B(p - K_s) if that microbatch exists. O(S (m + S)).
double simulate(std::span<const double> f, std::span<const double> b, int m) {
  const int S = static_cast<int>(f.size());
  std::vector<double> clock(S, 0.0), end_b(S, 0.0), next_end_b(S, 0.0);
  for (int p = 0; p < m + S - 1; ++p) {
    double above = 0;  // end of F(s - 1, p)
    if (p < m)
      for (int s = 0; s < S; ++s) above = clock[s] = std::max(clock[s], above) + f[s];
    for (int s = 0; s < S; ++s) {
      const int i = p - (S - 1 - s);
      if (i < 0 || i >= m) continue;
      const double below = s + 1 < S ? end_b[s + 1] : 0.0;  // B(s + 1, i) ended in pair p - 1
      next_end_b[s] = clock[s] = std::max(clock[s], below) + b[s];
    }
    std::swap(end_b, next_end_b);
  }
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace

pipeline_time::pipeline_time() : curve_(std::make_shared<curve>(curve{{}, {line{}}})) {}

pipeline_time pipeline_time::linear(double intercept, double slope) {
  return pipeline_time(std::make_shared<curve>(curve{{}, {line{intercept, slope}}}));
}

pipeline_time pipeline_time::one_f_one_b(std::span<const double> f, std::span<const double> b) {
  const int S = static_cast<int>(f.size());
  if (S == 0 || b.size() != f.size()) throw std::invalid_argument("pipeline_time: need one forward and backward per stage");
  for (int s = 0; s < S; ++s)
    if (!(f[s] >= 0 && b[s] >= 0 && std::isfinite(f[s]) && std::isfinite(b[s])))
      throw std::invalid_argument("pipeline_time: stage times must be finite and >= 0");
  std::vector<double> w(S);
  for (int s = 0; s < S; ++s) w[s] = f[s] + b[s];
  // Windows: the dwell starts by pair (S - 1) + (2S - 1) and ends within 2S - 1 pairs of the
  // cool-down (see the header); past head + tail + S microbatches the lines are exact.
  const int head = 3 * S + 2, tail = 2 * S + 2, table_size = head + tail + S;
  auto c = std::make_shared<curve>();
  c->table.resize(table_size);
  for (int m = 1; m < S - 1; ++m) c->table[m - 1] = simulate(f, b, m);

  // Cool-down: cool[s * S + j] = heaviest path from the start of B(s) in cool-down pair j (pair
  // Nb + j, where stage s runs B iff j < K_s) to the end. exit[s] = the same from the end of stage
  // s's last op of pair Nb - 1 (program order, or the up edge into stage s - 1).
  std::vector<double> cool(static_cast<std::size_t>(S) * S, 0.0);
  auto at_cool = [&](int s, int j) -> double& { return cool[static_cast<std::size_t>(s) * S + j]; };
  for (int j = S - 2; j >= 0; --j)
    for (int s = 0; s + 1 < S; ++s) {
      const int k = S - 1 - s;
      if (j >= k) continue;
      double next = 0;
      if (j + 1 < k) next = std::max(next, at_cool(s, j + 1));
      if (s >= 1) next = std::max(next, at_cool(s - 1, j + 1));  // j + 1 < K_{s-1} = k + 1
      at_cool(s, j) = b[s] + next;
    }
  std::vector<double> exit(S, 0.0);
  for (int s = 0; s < S; ++s) {
    if (s + 1 < S) exit[s] = std::max(exit[s], at_cool(s, 0));
    if (s >= 1) exit[s] = std::max(exit[s], at_cool(s - 1, 0));
  }

  // The schedule with unboundedly many microbatches, pair by pair: its first Nb pairs are those of
  // every schedule of Nb or more microbatches. start_f[k][p]: when F(k, p) starts, p <= head.
  std::vector<std::vector<double>> start_f(S, std::vector<double>(head + 1, 0.0));
  std::vector<double> clock(S, 0.0), end_b(S, 0.0), next_end_b(S, 0.0);
  for (int p = 0; p < table_size; ++p) {
    double above = 0;
    for (int s = 0; s < S; ++s) {
      const double start = std::max(clock[s], above);
      if (p <= head) start_f[s][p] = start;
      above = clock[s] = start + f[s];
    }
    for (int s = 0; s < S; ++s) {
      if (p < S - 1 - s) continue;  // still warming up
      const double below = s + 1 < S ? end_b[s + 1] : 0.0;
      next_end_b[s] = clock[s] = std::max(clock[s], below) + b[s];
    }
    std::swap(end_b, next_end_b);
    const int m = p + 1;
    if (m >= S - 1) {
      double t = 0;
      for (int s = 0; s < S; ++s) t = std::max(t, clock[s] + exit[s]);
      c->table[m - 1] = t;
    }
  }

  // tail_f[k][q]: heaviest path from the start of F(k) in pair Nb - q to the end (q <= tail).
  std::vector<std::vector<double>> tail_f(S, std::vector<double>(tail + 1, 0.0));
  std::vector<double> rb(S), prev_rb(S);
  for (int q = 1; q <= tail; ++q) {
    for (int s = 0; s < S; ++s) {
      const double next = q == 1 ? exit[s] : std::max(tail_f[s][q - 1], s >= 1 ? prev_rb[s - 1] : 0.0);
      rb[s] = b[s] + next;
    }
    for (int s = S - 1; s >= 0; --s) tail_f[s][q] = f[s] + std::max(rb[s], s + 1 < S ? tail_f[s + 1][q] : 0.0);
    std::swap(rb, prev_rb);
  }

  // One line per dwell stage: best head into F(k, p) plus best tail out of F(k, Nb - q), with the
  // w_k of the pairs between them.
  std::vector<line> lines;
  for (int k = 0; k < S; ++k) {
    double h = -INFINITY, t = -INFINITY;
    for (int p = S - 1; p <= head; ++p) h = std::max(h, start_f[k][p] - w[k] * p);
    for (int q = 1; q <= tail; ++q) t = std::max(t, tail_f[k][q] - w[k] * q);
    lines.push_back({h + t, w[k]});
  }
  // Drop lines another one beats on the whole range n > table_size. Equal slopes keep the one
  // largest intercept; otherwise only a strictly steeper line can beat one, so "beats" has no
  // cycles and the steepest line always stays. (Comparing values at `first` between lines of equal
  // slope is not transitive under rounding: stages of equal time, as transformer blocks have,
  // once made every line beat another and left none, so T stayed flat past the table.)
  const double first = table_size + 1;
  std::sort(lines.begin(), lines.end(), [](const line& a, const line& b) {
    return a.slope != b.slope ? a.slope > b.slope : a.intercept > b.intercept;
  });
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i > 0 && lines[i].slope == lines[i - 1].slope) continue;
    bool beaten = false;
    for (std::size_t j = 0; j < i && !beaten; ++j)
      beaten = lines[j].slope > lines[i].slope &&
               lines[j].intercept + lines[j].slope * first >= lines[i].intercept + lines[i].slope * first;
    if (!beaten) c->lines.push_back(lines[i]);
  }
  // Exact arithmetic makes T nondecreasing; keep it so under rounding too (searches rely on it).
  for (int n = 1; n < table_size; ++n) c->table[n] = std::max(c->table[n], c->table[n - 1]);
  return pipeline_time(std::move(c));
}

double pipeline_time::at(int num_microbatches) const {
  const auto& c = *curve_;
  if (num_microbatches >= 1 && num_microbatches <= static_cast<int>(c.table.size()))
    return c.table[num_microbatches - 1];
  double t = -INFINITY;
  for (const auto& l : c.lines) t = std::max(t, l.intercept + l.slope * num_microbatches);
  if (!c.table.empty()) t = std::max(t, c.table.back());
  return t;
}

int pipeline_time::most_below(double limit, int most) const {
  int lo = 0, hi = most;  // at(lo) < limit (or lo == 0); find the last such n
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (at(mid) < limit) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

double one_f_one_b_makespan(const std::vector<std::vector<double>>& forward_ms,
                            const std::vector<std::vector<double>>& backward_ms) {
  const auto S = forward_ms.size();
  if (S == 0 || backward_ms.size() != S) throw std::invalid_argument("a makespan needs the same stages forward and backward");
  const auto m = forward_ms.front().size();
  if (m == 0) throw std::invalid_argument("a makespan needs at least one microbatch");
  for (std::size_t s = 0; s < S; ++s) {
    if (forward_ms[s].size() != m || backward_ms[s].size() != m)
      throw std::invalid_argument("every stage of a makespan needs the same microbatches forward and backward");
    for (std::size_t i = 0; i < m; ++i)
      if (!(forward_ms[s][i] >= 0) || !(backward_ms[s][i] >= 0))
        throw std::invalid_argument("a makespan's op times must be non-negative");
  }
  // Each stage's compute ops in 1F1B order; an op can run once its stage is free and its input is
  // there: F(s, i) after F(s-1, i), B(s, i) after B(s+1, i) (the last stage: after its F(s, i)).
  constexpr double not_yet = -1;
  std::vector<std::vector<double>> f_end(S, std::vector<double>(m, not_yet)), b_end = f_end;
  std::vector<std::vector<schedule_op>> ops(S);
  std::vector<std::size_t> next(S, 0);
  std::vector<double> clock(S, 0);
  for (std::size_t s = 0; s < S; ++s)
    for (const auto& op : one_f_one_b(static_cast<int>(s), static_cast<int>(S), static_cast<int>(m)))
      if (op.kind == op_kind::forward || op.kind == op_kind::backward) ops[s].push_back(op);
  std::size_t remaining = 0;
  for (const auto& o : ops) remaining += o.size();
  while (remaining > 0) {
    bool progressed = false;
    for (std::size_t s = 0; s < S; ++s) {
      while (next[s] < ops[s].size()) {
        const auto& op = ops[s][next[s]];
        const auto i = static_cast<std::size_t>(op.microbatch);
        double ready = 0;
        if (op.kind == op_kind::forward) {
          if (s > 0) ready = f_end[s - 1][i];
        } else {
          ready = s + 1 < S ? b_end[s + 1][i] : f_end[s][i];
        }
        if (ready == not_yet) break;
        const double start = std::max(clock[s], ready);
        clock[s] = start + (op.kind == op_kind::forward ? forward_ms[s][i] : backward_ms[s][i]);
        (op.kind == op_kind::forward ? f_end : b_end)[s][i] = clock[s];
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) throw std::logic_error("the 1F1B schedule deadlocked in the makespan simulation");
  }
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace oobleck::planning
