#include "support/job_events.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "messages/event_json.hpp"
#include "messages/protocol.hpp"

namespace oobleck::testing {

using messages::event_kind;
using messages::job_event;

namespace {

std::string ids(const std::vector<std::int64_t>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? " " : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace

bool event_match::operator()(const job_event& e) const {
  return (!kind || e.kind == *kind) && (!epoch || e.epoch == *epoch) && (!step || e.step == *step) &&
         (!node || e.node == *node) && (!detail || e.detail == *detail) && (!lost || e.lost == *lost) &&
         (!joined || e.joined == *joined) && (!outcome || e.outcome == *outcome) &&
         (!committed || e.committed == *committed);
}

std::string describe(const job_event& e) {
  std::string out = to_string(e.kind) + " epoch " + std::to_string(e.epoch) + " step " + std::to_string(e.step);
  if (e.node >= 0) out += " node " + std::to_string(e.node);
  if (e.kind == event_kind::step_committed) out += " loss " + std::to_string(static_cast<double>(e.loss));
  if (e.kind == event_kind::epoch_forming) out += " lost " + ids(e.lost) + " joined " + ids(e.joined);
  if (e.kind == event_kind::stopped)
    out += " outcome " + to_string(e.outcome) + " committed " + std::to_string(e.committed);
  if (!e.detail.empty()) out += " detail '" + e.detail + "'";
  return out;
}

std::string describe(const std::vector<job_event>& events) {
  std::string out;
  for (const auto& e : events) out += describe(e) + "\n";
  return out.empty() ? "(no events)\n" : out;
}

std::string describe(const event_match& m) {
  std::string out = m.kind ? to_string(*m.kind) : "any event";
  if (m.epoch) out += " epoch " + std::to_string(*m.epoch);
  if (m.step) out += " step " + std::to_string(*m.step);
  if (m.node) out += " node " + std::to_string(*m.node);
  if (m.lost) out += " lost " + ids(*m.lost);
  if (m.joined) out += " joined " + ids(*m.joined);
  if (m.outcome) out += " outcome " + to_string(*m.outcome);
  if (m.committed) out += " committed " + std::to_string(*m.committed);
  if (m.detail) out += " detail '" + *m.detail + "'";
  return out;
}

std::size_t position(const std::vector<job_event>& events, const event_match& m, std::size_t from) {
  for (std::size_t i = from; i < events.size(); ++i)
    if (m(events[i])) return i;
  return events.size();
}

bool contains(const std::vector<job_event>& events, const event_match& m) { return position(events, m) < events.size(); }

std::size_t loss_in_step(const std::vector<job_event>& events, std::int64_t node, std::uint64_t step) {
  if (const auto at = position(events, {.kind = event_kind::node_lost, .step = step, .node = node}); at < events.size())
    return at;
  if (step == 0) return events.size();
  const auto at = position(events, {.kind = event_kind::node_lost, .step = step - 1, .node = node});
  if (at < events.size() &&
      position(events, {.kind = event_kind::commit_stood, .step = step - 1, .node = node}, at) < events.size())
    return at;
  return events.size();
}

std::size_t count(const std::vector<job_event>& events, const event_match& m) {
  return static_cast<std::size_t>(std::count_if(events.begin(), events.end(), m));
}

std::vector<job_event> all_of(const std::vector<job_event>& events, const event_match& m) {
  std::vector<job_event> out;
  std::copy_if(events.begin(), events.end(), std::back_inserter(out), m);
  return out;
}

const job_event& stop_of(const std::vector<job_event>& events) {
  const job_event* stop = nullptr;
  for (const auto& e : events)
    if (e.kind == event_kind::stopped) {
      if (stop) throw std::runtime_error("two stopped events:\n" + describe(events));
      stop = &e;
    }
  if (!stop) throw std::runtime_error("no stopped event:\n" + describe(events));
  return *stop;
}

event_match finished(std::uint64_t steps) {
  return {.kind = event_kind::stopped, .outcome = messages::stop_outcome::finished, .committed = steps};
}

std::vector<job_event> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  // Only complete lines: the coordinator may be in the middle of writing the last one.
  std::vector<messages::timed_event> timed;
  messages::take_complete_events(text, timed);
  std::vector<job_event> out;
  for (auto& t : timed) out.push_back(std::move(t.event));
  return out;
}

job_event wait_for_event(const std::string& path, const event_match& m, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto events = read_event_file(path);
    const auto at = position(events, m);
    if (at < events.size()) return events[at];
    if (contains(events, {.kind = event_kind::stopped}))
      throw std::runtime_error("the job stopped without " + describe(m) + "; events:\n" + describe(events));
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("no " + describe(m) + " within " + std::to_string(timeout.count()) + " ms; events:\n" +
                               describe(events));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string worker_name(const std::string& events_path, std::int64_t node, std::chrono::milliseconds timeout) {
  return wait_for_event(events_path, {.kind = event_kind::node_joined, .node = node}, timeout).detail;
}

std::string wait_for_address(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    // Written whole (by a rename): once it exists, it holds the address and its newline.
    std::ifstream in(path);
    std::string address;
    if (in && std::getline(in, address) && !address.empty()) return address;
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("no address in " + path + " within " + std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace oobleck::testing
