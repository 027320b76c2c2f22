// specinfer serve: an OpenAI-compatible HTTP server (serve_http.cpp) on one loaded model, requests
// run by a serve::Worker (serve_engine.h), several at once.
#include <httplib.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "cli_options.h"
#include "commands.h"
#include "serve_chat.h"
#include "serve_engine.h"
#include "serve_http.h"
#include "specinfer.h"

namespace {

int g_signal_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const ssize_t n = write(g_signal_pipe[1], &b, 1);
  (void)n;
}

// The value of `key` in a PLUGIN:key=value,... config; "" when absent.
std::string config_value(const std::string &spec, const std::string &key) {
  std::string plugin, config;
  cli::split_spec(spec, &plugin, &config);
  for (const std::string &kv : cli::split(config, ','))
    if (kv.compare(0, key.size() + 1, key + "=") == 0) return kv.substr(key.size() + 1);
  return "";
}

// "dir/qwen2.5-coder-0.5b.gguf" -> "qwen2.5-coder-0.5b".
std::string model_name_of(const std::string &path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
    name.resize(name.size() - 5);
  return name;
}

}  // namespace

int cmd_serve(int argc, char **argv) {
  cli::App app{
      "Serves the target over HTTP with an OpenAI-compatible API: /v1/completions, "
      "/v1/chat/completions (both with streaming), /v1/models, /health, /metrics. Up to "
      "--parallel requests run at once, their sessions on one loaded model stepped together "
      "(continuous batching, speculation inside the batch); more wait in arrival order. -n, "
      "--temp, --top-p and --seed are the defaults of fields a request leaves out.",
      "specinfer serve"};
  cli::RunOptions run;
  std::string drafter_spec, host = "127.0.0.1", model, chat_template_file;
  int32_t port = 8080, queue = 16, parallel = 4, prefill_chunk = 64;
  cli::add_run_options(app, &run, 1);
  app.add_option("--drafter", drafter_spec, "drafter, e.g. ngram or draft-model:path=draft.gguf")
      ->type_name(cli::kSpec)
      ->default_str("none");
  app.add_option("--host", host, "address to listen on")->capture_default_str();
  cli::add_number(app, "--port", port, "TCP port (0: any free port; the one chosen is printed)",
                  "N", 0, 65535)
      ->capture_default_str();
  cli::add_number(app, "--queue", queue, "most requests waiting; more get 429", "N", 0, 1 << 20)
      ->capture_default_str();
  cli::add_number(app, "--parallel", parallel, "most requests generating at once", "N", 1, 64)
      ->capture_default_str();
  cli::add_number(app, "--prefill-chunk", prefill_chunk,
                  "most prompt tokens a request scores per step while others generate (0: a "
                  "whole prompt at once)",
                  "N", 0, 1 << 20)
      ->capture_default_str();
  app.add_option("--model", model, "the model's name in the API (default: the file's name)")
      ->type_name("NAME");
  app.add_option("--chat-template", chat_template_file,
                 "Jinja chat template file (default: the GGUF's tokenizer.chat_template)")
      ->type_name("FILE");
  std::string print_chat;
  app.add_option("--print-chat-prompt", print_chat,
                 "print what the chat template makes of the messages in FILE (a JSON list of "
                 "{role, content}) and exit, without loading the model")
      ->type_name("FILE");
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  if (drafter_spec == "none") drafter_spec.clear();

  std::signal(SIGPIPE, SIG_IGN);  // a client gone away is an error on its socket, not the end

  serve::ServerConfig cfg;
  const std::string path = config_value(run.target, "path");
  cfg.model = !model.empty() ? model : !path.empty() ? model_name_of(path) : "specinfer";
  cfg.max_queue = queue;
  cfg.max_tokens = run.max_tokens;
  cfg.temperature = run.temp;
  cfg.top_p = run.top_p;
  cfg.seed = run.seed;
  std::string plugin, unused;
  cli::split_spec(run.target, &plugin, &unused);
  if (plugin == "gguf" && !path.empty()) {
    std::string error;
    if (!serve::chat_template_from_gguf(path, &cfg.chat, &error)) {
      std::fprintf(stderr, "specinfer serve: cannot read %s: %s\n", path.c_str(), error.c_str());
      return 1;
    }
  }
  if (!chat_template_file.empty()) {
    std::ifstream in(chat_template_file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "specinfer serve: cannot read %s\n", chat_template_file.c_str());
      return 1;
    }
    cfg.chat.source.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (!serve::chat_templates_available()) {
    cfg.chat.source.clear();
    cfg.chat_unavailable =
        "chat completions are not available: this build has no chat-template engine (cargo was "
        "not found when it was built); use /v1/completions";
  } else if (cfg.chat.source.empty()) {
    cfg.chat_unavailable =
        "chat completions are not available: the model has no chat template (start the server "
        "with --chat-template FILE); use /v1/completions";
  }

  if (!print_chat.empty()) {
    std::ifstream in(print_chat, std::ios::binary);
    const nlohmann::json messages = nlohmann::json::parse(in, nullptr, false);
    std::string text, error;
    if (!in || messages.is_discarded() || !messages.is_array()) {
      std::fprintf(stderr, "specinfer serve: %s is not a JSON list of messages\n",
                   print_chat.c_str());
      return 1;
    }
    if (cfg.chat.source.empty() || !cfg.chat.render(messages, &text, &error)) {
      std::fprintf(stderr, "specinfer serve: %s\n",
                   cfg.chat.source.empty() ? cfg.chat_unavailable.c_str() : error.c_str());
      return 1;
    }
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }

  specinfer_registry *reg = cli::create_registry(run, "specinfer serve");
  if (!reg) return 1;
  specinfer_target *target = nullptr;
  char *err = nullptr;
  int rc = 1;
  do {
    if (cli::open_target(reg, run.target, &target, &err) != SPECINFER_OK) {
      std::fprintf(stderr, "specinfer serve: cannot open target: %s\n", err);
      break;
    }

    specinfer_model_info info;
    specinfer_model_info_init(&info);
    specinfer_target_info(target, &info);
    cfg.n_ctx = info.n_ctx;
    cfg.chat.model_adds_bos = info.add_bos != 0;

    serve::Worker::Options wo;
    wo.drafter_spec = drafter_spec;
    wo.defaults = cli::session_params(run);
    wo.max_queue = queue;
    wo.parallel = parallel;
    wo.prefill_chunk = prefill_chunk;
    std::string werr;
    std::unique_ptr<serve::Worker> engine = serve::Worker::create(reg, target, wo, &werr);
    if (!engine) {
      std::fprintf(stderr, "specinfer serve: %s\n", werr.c_str());
      break;
    }
    serve::Worker &worker = *engine;
    httplib::Server server;
    // Every running or waiting request holds an HTTP thread, and idle keep-alive connections hold
    // some more.
    const size_t threads = static_cast<size_t>(queue) + static_cast<size_t>(parallel) + 16;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.set_payload_max_length(16 << 20);
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server on the
    // same port would start and share the connections instead of failing.
    server.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    const auto routes = serve::install_routes(server, worker, cfg);
    int bound = port;
    if (port == 0)
      bound = server.bind_to_any_port(host.c_str());
    else if (!server.bind_to_port(host.c_str(), port))
      bound = -1;
    if (bound < 0) {
      std::fprintf(stderr, "specinfer serve: cannot listen on %s:%d\n", host.c_str(), port);
      break;
    }
    std::fprintf(stderr, "specinfer serve: model %s, listening on http://%s:%d\n",
                 cfg.model.c_str(), host.c_str(), bound);
    std::fflush(stderr);
    // SIGINT and SIGTERM stop the server: the handler (any thread may run it; libraries start
    // threads of their own) writes the signal to a pipe that this thread reads.
    if (pipe(g_signal_pipe) != 0) {
      std::fprintf(stderr, "specinfer serve: pipe: %s\n", std::strerror(errno));
      break;
    }
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    std::thread on_signal([&server, &worker] {
      unsigned char sig = 0;
      while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
      }
      if (sig == 0) return;  // the server ended by itself
      std::fprintf(stderr, "specinfer serve: stopping (signal %d)\n", sig);
      worker.stop();
      server.stop();
    });
    server.listen_after_bind();
    worker.stop();
    const unsigned char end = 0;
    while (write(g_signal_pipe[1], &end, 1) < 0 && errno == EINTR) {
    }
    on_signal.join();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    close(g_signal_pipe[0]);
    close(g_signal_pipe[1]);
    rc = 0;
  } while (false);
  specinfer_free(err);
  specinfer_target_destroy(target);
  specinfer_registry_destroy(reg);
  return rc;
}
