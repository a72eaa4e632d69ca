#include "apps/http_status.hpp"

#include <iostream>
#include <optional>
#include <string_view>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "apps/dashboard.hpp"
#include "messages/input_error.hpp"

namespace oobleck::apps {

// Named, not anonymous: http_status_server::impl holds a core, and a unity batch would otherwise
// give that member a type of another file's anonymous namespace (-Wsubobject-linkage).
namespace http_status_detail {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

/// What the server's sessions share. Status callbacks hold it (they post their answer to its
/// io_context), so it may outlive the server by a pending request: a session never outlives it.
struct core {
  explicit core(http_limits l) : limits(l) {}
  net::io_context ioc{1};
  http_limits limits;
  status_source source;
  history_source history;
  std::size_t connections = 0;  // touched on the server's thread only
};

/// A response, as a source's answer becomes one.
struct answer {
  http::status status;
  const char* type;
  std::string body;
};

/// GET /status (JSON) or /metrics (Prometheus text), or 503 with why there is no status.
answer status_answer(status_reply r, bool metrics) {
  if (!r.status)
    return {http::status::service_unavailable, metrics ? "text/plain; charset=utf-8" : "application/json",
            metrics ? "no status: " + r.error + "\n" : nlohmann::json{{"error", r.error}}.dump() + "\n"};
  if (metrics) return {http::status::ok, "text/plain; version=0.0.4; charset=utf-8", prometheus_metrics(*r.status)};
  return {http::status::ok, "application/json", status_json(*r.status).dump(2) + "\n"};
}

bool is_parse_error(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_method).category();
}

/// One connection: read a request (deadline, size cap), answer it, repeat while it keeps alive.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, const std::shared_ptr<core>& c)
      : core_(*c), weak_core_(c), stream_(std::move(socket)), buffer_(c->limits.max_request_bytes),
        timer_(c->ioc) {
    ++core_.connections;
  }
  ~session() { --core_.connections; }

  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(core_.limits.max_request_bytes));
    parser_->body_limit(core_.limits.max_request_bytes);
    stream_.expires_after(core_.limits.read_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit || ec == http::error::body_limit || ec == http::error::buffer_overflow)
      return fail(http::status::payload_too_large, "request too large\n");
    if (ec && is_parse_error(ec) && ec != http::error::end_of_stream && ec != http::error::partial_message)
      return fail(http::status::bad_request, "bad request: " + ec.message() + "\n");
    if (ec) return close();  // closed by the client, timed out, reset
    stream_.expires_never();
    const auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get)
      return respond(http::status::method_not_allowed, "text/plain; charset=utf-8",
                     "method not allowed: only GET\n");
    if (path == "/") return respond(http::status::ok, "text/html; charset=utf-8", std::string(dashboard_html()));
    if (path == "/status" || path == "/metrics") {
      const bool metrics = path == "/metrics";
      return ask(
          [c = weak_core_.lock(), metrics](std::function<void(answer)> done) {
            c->source([metrics, done = std::move(done)](status_reply r) { done(status_answer(std::move(r), metrics)); });
          },
          metrics);
    }
    if (path == "/history" && core_.history) {
      return ask(
          [c = weak_core_.lock()](std::function<void(answer)> done) {
            c->history([done = std::move(done)](std::string json) {
              done({http::status::ok, "application/json", std::move(json)});
            });
          },
          false);
    }
    respond(http::status::not_found, "text/plain; charset=utf-8",
            "not found: GET / (dashboard), /status (JSON), /history (JSON) or /metrics (Prometheus)\n");
  }

  /// Asks a source (`query`); whichever comes first, its answer or status_timeout, is the response.
  void ask(std::function<void(std::function<void(answer)>)> query, bool plain_text) {
    const std::uint64_t id = ++asked_;
    timer_.expires_after(core_.limits.status_timeout);
    timer_.async_wait([self = shared_from_this(), id, plain_text](beast::error_code ec) {
      if (!ec) self->on_answer(id, status_answer({std::nullopt, "the coordinator did not answer in time"}, plain_text));
    });
    std::weak_ptr<session> weak = shared_from_this();
    query([c = weak_core_.lock(), weak, id](answer a) {
      net::post(c->ioc, [weak, id, a = std::move(a)]() mutable {
        if (auto s = weak.lock()) s->on_answer(id, std::move(a));
      });
    });
  }

  void on_answer(std::uint64_t id, answer a) {
    if (id != asked_ || id == answered_) return;
    answered_ = id;
    timer_.cancel();
    respond(a.status, a.type, std::move(a.body));
  }

  /// A request we cannot read on from: answer and close.
  void fail(http::status status, std::string body) {
    keep_alive_ = false;
    respond(status, "text/plain; charset=utf-8", std::move(body));
  }

  void respond(http::status status, const char* type, std::string body) {
    response_.emplace(status, version_);
    response_->set(http::field::server, "oobleck");
    response_->set(http::field::content_type, type);
    response_->set(http::field::cache_control, "no-store");  // every answer is of now
    response_->set("X-Content-Type-Options", "nosniff");
    // The dashboard loads nothing from elsewhere, and a page it is framed in cannot overlay it.
    if (std::string_view(type).rfind("text/html", 0) == 0)
      response_->set("Content-Security-Policy",
                     "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                     "frame-ancestors 'none'");
    if (status == http::status::method_not_allowed) response_->set(http::field::allow, "GET");
    response_->keep_alive(keep_alive_);
    response_->body() = std::move(body);
    response_->prepare_payload();
    stream_.expires_after(core_.limits.write_timeout);
    http::async_write(stream_, *response_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      if (!self->keep_alive_) return self->linger();
      self->read();
    });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  /// Closes after a response: our side first, then whatever the client still sends is read and
  /// dropped for at most a second (closing with unread bytes would reset the connection, and the
  /// client could lose the response).
  void linger() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(1));  // for the whole drain, not per read
    drain();
  }

  void drain() {
    stream_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }

  core& core_;
  std::weak_ptr<core> weak_core_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> response_;
  net::steady_timer timer_;
  bool keep_alive_ = false;
  unsigned version_ = 11;
  std::uint64_t asked_ = 0, answered_ = 0;
  char scratch_[1024];
};

}  // namespace http_status_detail

using namespace http_status_detail;

struct http_status_server::impl {
  std::shared_ptr<core> c;
  tcp::acceptor acceptor;
  net::steady_timer retry;
  std::thread thread;

  impl(const std::string& host, std::uint16_t port, http_limits limits)
      : c(std::make_shared<core>(limits)), acceptor(c->ioc), retry(c->ioc) {
    const std::string where = host + ":" + std::to_string(port);
    beast::error_code ec;
    tcp::resolver resolver(c->ioc);
    const auto found = resolver.resolve(host, std::to_string(port),
                                        tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || found.empty())
      throw messages::input_error("cannot serve HTTP on " + where + ": " +
                                  (ec ? ec.message() : std::string("no such address")));
    const tcp::endpoint at = *found.begin();
    acceptor.open(at.protocol(), ec);
    if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(at, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) throw messages::input_error("cannot serve HTTP on " + where + ": " + ec.message());
  }

  ~impl() {
    if (thread.joinable()) {
      c->ioc.stop();
      thread.join();
    }
  }

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted) return;
      if (ec) {  // out of descriptors, say: try again shortly rather than spin
        retry.expires_after(std::chrono::milliseconds(100));
        retry.async_wait([this](beast::error_code e) {
          if (!e) accept();
        });
        return;
      }
      if (c->connections < c->limits.max_connections) std::make_shared<session>(std::move(socket), c)->read();
      accept();  // a connection over the limit closes as `socket` goes
    });
  }
};

http_status_server::http_status_server(const std::string& host, std::uint16_t port, http_limits limits)
    : impl_(std::make_unique<impl>(host, port, limits)) {}

http_status_server::~http_status_server() = default;

std::uint16_t http_status_server::port() const { return impl_->acceptor.local_endpoint().port(); }

void http_status_server::start(status_source source, history_source history) {
  impl_->c->source = std::move(source);
  impl_->c->history = std::move(history);
  impl_->accept();
  impl_->thread = std::thread([c = impl_->c] {
    for (;;) {
      try {
        c->ioc.run();
        return;
      } catch (const std::exception& e) {  // a handler failed (out of memory): keep serving
        std::cerr << "[http] error: " << e.what() << std::endl;
      }
    }
  });
}

}  // namespace oobleck::apps
