// specinfer serve: an OpenAI-compatible HTTP server (serve_http.cpp) on one or more named models
// (serve_models.h), each model's requests run by a serve::Worker of its own (serve_engine.h),
// several at once.
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli_options.h"
#include "commands.h"
#include "serve_chat.h"
#include "serve_engine.h"
#include "serve_http.h"
#include "serve_models.h"
#include "specinfer.h"

namespace {

int g_signal_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const ssize_t n = write(g_signal_pipe[1], &b, 1);
  (void)n;
}

// The chat template of `m` (its target's, whose info is `info`, or its --chat-template file) into
// *e; false after printing why not.
bool load_chat_template(const serve::ModelSpec &m, specinfer_target *target,
                        const specinfer_model_info &info, serve::ModelEntry *e) {
  serve::chat_template_of(target, info, &e->chat);
  if (!m.chat_template.empty()) {
    std::ifstream in(m.chat_template, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "specinfer serve: cannot read %s\n", m.chat_template.c_str());
      return false;
    }
    e->chat.source.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (!serve::chat_templates_available()) {
    e->chat.source.clear();
    e->chat_unavailable =
        "chat completions are not available: this build has no chat-template engine (cargo was "
        "not found when it was built); use /v1/completions";
  } else if (e->chat.source.empty()) {
    e->chat_unavailable = "chat completions are not available: the model " + m.name +
                          " has no chat template (start the server with --chat-template " + m.name +
                          "=FILE); use /v1/completions";
  }
  return true;
}

// Renders the chat in the JSON file `path` with e's template to stdout (--print-chat-prompt).
int print_chat_prompt(const serve::ModelEntry &e, const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  const nlohmann::json messages = nlohmann::json::parse(in, nullptr, false);
  std::string text, error;
  if (!in || messages.is_discarded() || !messages.is_array()) {
    std::fprintf(stderr, "specinfer serve: %s is not a JSON list of messages\n", path.c_str());
    return 1;
  }
  if (e.chat.source.empty() || !e.chat.render(messages, nullptr, &text, &error)) {
    std::fprintf(stderr, "specinfer serve: %s\n",
                 e.chat.source.empty() ? e.chat_unavailable.c_str() : error.c_str());
    return 1;
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

// A served model's open target and engine.
struct Loaded {
  specinfer_target *target = nullptr;
  std::unique_ptr<serve::Worker> worker;
};

// The command line of specinfer serve.
struct ServeOptions {
  cli::RunOptions run;
  serve::ModelOptions mo;
  std::string host = "127.0.0.1";
  int32_t port = 8080, queue = 16, parallel = 4, prefill_chunk = 64;
  std::string print_chat;
};

void define_options(cli::App &app, ServeOptions *so) {
  cli::add_run_options(app, &so->run, 1);
  app.get_option("--target")
      ->required(false)
      ->description("the model to serve, e.g. gguf:path=model.gguf (or give models with --model)");
  app.add_option("--model", so->mo.models,
                 "serve the model at PATH (a GGUF file, or a target spec PLUGIN:K=V,...) under "
                 "NAME; repeat for more models. A bare NAME names the --target model (default: "
                 "its file's name)")
      ->type_name("NAME=PATH")
      ->default_str("")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--drafter", so->mo.drafters,
                 "drafter of every model, e.g. ngram or draft-model:path=draft.gguf; NAME=SPEC "
                 "for model NAME only (repeatable; none: plain decoding). auto: Medusa heads with "
                 "prompt lookup when MODEL.medusa.gguf is beside the model's MODEL.gguf, else "
                 "prompt lookup (ngram); a request drafts only where that pays in its batch")
      ->type_name("[NAME=]" + std::string(cli::kSpec))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->default_str("auto");
  app.add_option("--host", so->host, "address to listen on")->capture_default_str();
  cli::add_number(app, "--port", so->port, "TCP port (0: any free port; the one chosen is printed)",
                  "N", 0, 65535)
      ->capture_default_str();
  cli::add_number(app, "--queue", so->queue, "most requests waiting, per model; more get 429", "N",
                  0, 1 << 20)
      ->capture_default_str();
  cli::add_number(app, "--parallel", so->parallel, "most requests generating at once, per model",
                  "N", 1, 64)
      ->capture_default_str();
  cli::add_number(app, "--prefill-chunk", so->prefill_chunk,
                  "most prompt tokens a request scores per step while others generate (0: a "
                  "whole prompt at once)",
                  "N", 0, 1 << 20)
      ->capture_default_str();
  app.add_option("--chat-template", so->mo.templates,
                 "Jinja chat template file of every model, or NAME=FILE for model NAME only "
                 "(default: each GGUF's tokenizer.chat_template)")
      ->type_name("[NAME=]FILE")
      ->default_str("")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--print-chat-prompt", so->print_chat,
                 "print what the first model's chat template makes of the messages in FILE (a "
                 "JSON list of {role, content}) and exit, without loading the model")
      ->type_name("FILE");
}

// The registry and every served model, closed in this order: every engine (its slots' drafters
// hold draft models, maybe shared from a served model), then the targets, then the registry.
struct ServedModels {
  specinfer_registry *reg = nullptr;
  std::vector<Loaded> loaded;
  ServedModels() = default;
  ServedModels(const ServedModels &) = delete;
  ServedModels &operator=(const ServedModels &) = delete;
  ~ServedModels() {
    for (Loaded &l : loaded) l.worker.reset();  // the drafters (and their draft models) first
    for (Loaded &l : loaded) specinfer_target_destroy(l.target);
    specinfer_registry_destroy(reg);
  }
};

// Opens every target with its chat template into m->loaded and entries; false after printing why
// not.
bool open_targets(const std::vector<serve::ModelSpec> &specs, ServedModels *m,
                  std::vector<serve::ModelEntry> *entries) {
  char *err = nullptr;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (cli::open_target(m->reg, specs[i].target, &m->loaded[i].target, &err) != SPECINFER_OK) {
      std::fprintf(stderr, "specinfer serve: cannot open model %s (%s): %s\n",
                   specs[i].name.c_str(), specs[i].target.c_str(), err);
      specinfer_free(err);
      return false;
    }
    specinfer_model_info info;
    specinfer_model_info_init(&info);
    specinfer_target_info(m->loaded[i].target, &info);
    (*entries)[i].n_ctx = info.n_ctx;
    if (!load_chat_template(specs[i], m->loaded[i].target, info, &(*entries)[i])) return false;
  }
  return true;
}

// One engine per opened model; false after printing why not.
bool start_workers(const ServeOptions &so, const std::vector<serve::ModelSpec> &specs,
                   ServedModels *m, std::vector<serve::ModelEntry> *entries) {
  for (size_t i = 0; i < specs.size(); ++i) {
    serve::Worker::Options wo;
    wo.drafter_spec = specs[i].drafter;
    wo.defaults = cli::session_params(so.run);
    wo.max_queue = so.queue;
    wo.parallel = so.parallel;
    wo.prefill_chunk = so.prefill_chunk;
    std::string werr;
    m->loaded[i].worker = serve::Worker::create(m->reg, m->loaded[i].target, wo, &werr);
    if (!m->loaded[i].worker) {
      std::fprintf(stderr, "specinfer serve: model %s: %s\n", specs[i].name.c_str(), werr.c_str());
      return false;
    }
    (*entries)[i].engine = m->loaded[i].worker.get();
  }
  return true;
}

// Threads, payload limit and socket options of the server.
// listen_fd receives the listening socket when the server binds.
void configure_server(httplib::Server &server, std::shared_ptr<int> listen_fd) {
  // A thread per open connection (serve::ConnectionPool), as many as the process may open files
  // for, at most kMaxConnectionThreads; the file limit is raised to its hard limit first.
  constexpr rlim_t kMaxConnectionThreads = 4096;
  struct rlimit files {};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    getrlimit(RLIMIT_NOFILE, &files);
  }
  const size_t threads = static_cast<size_t>(std::clamp<rlim_t>(
      files.rlim_cur > 64 ? files.rlim_cur - 64 : 16, 16, kMaxConnectionThreads));
  server.new_task_queue = [threads] { return new serve::ConnectionPool(threads); };
  server.set_payload_max_length(16 << 20);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server on the
  // same port would start and share the connections instead of failing. TCP_DEFER_ACCEPT: the
  // kernel hands a connection over once its client has sent something (or after
  // kDeferAcceptSeconds), so idle and half-open clients hold no connection thread; httplib's
  // threads poll their socket every 10 ms while they wait, and a thousand of them fill two cores.
  static constexpr int kDeferAcceptSeconds = 10;
  server.set_socket_options([listen_fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    setsockopt(sock, IPPROTO_TCP, TCP_DEFER_ACCEPT, &kDeferAcceptSeconds,
               sizeof kDeferAcceptSeconds);
    *listen_fd = sock;
  });
}

// httplib listens with a backlog of 5, so a burst of new connections overflows the accept queue
// and their clients retry the handshake after 1 s, 3 s, ...; listen() again on the bound socket
// widens it to the system's limit.
void widen_backlog(int listen_fd) {
  if (listen_fd >= 0 && listen(listen_fd, SOMAXCONN) != 0)
    std::fprintf(stderr, "specinfer serve: warning: listen backlog stays at 5: %s\n",
                 std::strerror(errno));
}

void print_listening(const ServeOptions &so, const std::vector<serve::ModelSpec> &specs,
                     int bound) {
  for (const serve::ModelSpec &m : specs)
    std::fprintf(stderr, "specinfer serve: model %s: %s%s%s\n", m.name.c_str(), m.target.c_str(),
                 m.drafter.empty() ? "" : ", drafter ", m.drafter.c_str());
  std::string names;
  for (const serve::ModelSpec &m : specs) names += (names.empty() ? "" : ", ") + m.name;
  std::fprintf(stderr, "specinfer serve: model%s %s, listening on http://%s:%d\n",
               specs.size() == 1 ? "" : "s", names.c_str(), so.host.c_str(), bound);
  std::fflush(stderr);
}

// Serves until SIGINT or SIGTERM, then stops every engine; false after printing why it could not
// start. The handler (any thread may run it; libraries start threads of their own) writes the
// signal to a pipe that a thread of ours reads.
bool listen_until_signal(httplib::Server &server, std::vector<Loaded> &loaded) {
  const auto stop_all = [&loaded] {
    for (Loaded &l : loaded) l.worker->stop();
  };
  if (pipe(g_signal_pipe) != 0) {
    std::fprintf(stderr, "specinfer serve: pipe: %s\n", std::strerror(errno));
    return false;
  }
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::thread on_signal([&server, &stop_all] {
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // the server ended by itself
    std::fprintf(stderr, "specinfer serve: stopping (signal %d)\n", sig);
    stop_all();
    server.stop();
  });
  server.listen_after_bind();
  stop_all();
  const unsigned char end = 0;
  while (write(g_signal_pipe[1], &end, 1) < 0 && errno == EINTR) {
  }
  on_signal.join();
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  close(g_signal_pipe[0]);
  close(g_signal_pipe[1]);
  return true;
}

// Binds the HTTP server with cfg's routes and serves until a stop signal; the exit code.
int serve_http(const ServeOptions &so, const std::vector<serve::ModelSpec> &specs,
               const serve::ServerConfig &cfg, std::vector<Loaded> &loaded) {
  httplib::Server server;
  const auto listen_fd = std::make_shared<int>(-1);
  configure_server(server, listen_fd);
  const auto routes = serve::install_routes(server, cfg);
  int bound = so.port;
  if (so.port == 0)
    bound = server.bind_to_any_port(so.host.c_str());
  else if (!server.bind_to_port(so.host.c_str(), so.port))
    bound = -1;
  if (bound < 0) {
    std::fprintf(stderr, "specinfer serve: cannot listen on %s:%d\n", so.host.c_str(), so.port);
    return 1;
  }
  widen_backlog(*listen_fd);
  print_listening(so, specs, bound);
  return listen_until_signal(server, loaded) ? 0 : 1;
}

}  // namespace

int cmd_serve(int argc, char **argv) {
  cli::App app{
      "Serves one or more models over HTTP with an OpenAI-compatible API: /v1/completions, "
      "/v1/chat/completions (both with streaming), /v1/models, /health, /metrics. A request's "
      "`model` field picks the model by name (it may be left out when one model is served). "
      "Each model has up to --parallel requests running at once, their sessions on its one "
      "loaded model stepped together (continuous batching, speculation inside the batch); more "
      "wait in arrival order. A draft-model drafter whose draft model is also served uses the "
      "served model's weights (loaded once). -n, --temp, --top-p and --seed are the defaults of "
      "fields a request leaves out.",
      "specinfer serve"};
  ServeOptions so;
  define_options(app, &so);
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  so.mo.target = so.run.target;

  std::vector<serve::ModelSpec> specs;
  if (std::string error; !serve::read_models(so.mo, &specs, &error))
    return cli::usage_error(app, error);

  std::signal(SIGPIPE, SIG_IGN);  // a client gone away is an error on its socket, not the end

  serve::ServerConfig cfg;
  cfg.max_tokens = so.run.max_tokens;
  cfg.temperature = so.run.temp;
  cfg.top_p = so.run.top_p;
  cfg.seed = so.run.seed;
  std::vector<serve::ModelEntry> entries(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    entries[i].name = specs[i].name;
    entries[i].max_queue = so.queue;
    entries[i].parallel = std::max(so.parallel, 1);
  }

  for (const std::string &note : serve::share_draft_models(&specs))
    std::fprintf(stderr, "specinfer serve: %s\n", note.c_str());

  ServedModels m;
  m.reg = cli::create_registry(so.run, "specinfer serve");
  if (!m.reg) return 1;
  m.loaded.resize(specs.size());
  // Every target first, so that a drafter whose draft model is served finds it open.
  if (!open_targets(specs, &m, &entries)) return 1;
  if (!so.print_chat.empty()) return print_chat_prompt(entries[0], so.print_chat);
  if (!start_workers(so, specs, &m, &entries)) return 1;
  cfg.models = entries;
  return serve_http(so, specs, cfg, m.loaded);
}
