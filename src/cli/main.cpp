#include <cstdio>
#include <cstring>
#include <string_view>

#include "backend/devices.h"
#include "cli/flag_parsing.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/stack_dump.h"
#include "core/version.h"

namespace {

struct Verb {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

// One line per verb.
constexpr Verb kVerbs[] = {
    {"serve", tessera::cli::run_serve, "OpenAI- and Anthropic-compatible HTTP server (flags as vllm serve)"},
    {"generate", tessera::cli::run_generate, "offline generation from token ids, text or a JSONL batch"},
    {"bench", tessera::cli::run_bench, "load generator and report for any OpenAI-compatible server"},
    {"tokenize", tessera::cli::run_tokenize, "token ids of stdin with a model's tokenizer (--decode: ids to text)"},
    {"node", tessera::cli::run_node,
     "start a cluster once, like `ray start`: node start --head here, node start --address HEAD:PORT elsewhere"},
    {"cluster", tessera::cli::run_cluster,
     "status of a multi-node cluster from its head (nodes, ranks, GPUs, NIC, IP)"},
    {"plan", tessera::cli::run_plan, "will a model fit these GPUs with these flags? weights, KV cache, TP/PP layouts"},
    {"doctor", tessera::cli::run_doctor,
     "preflight of a node or a cluster: GPUs, versions, /dev/shm, NICs, ports, bandwidth, model files"},
    {"chat-template", tessera::cli::run_chat_template, "the prompt a model's chat template makes of a chat request"},
};

void usage(FILE* f) {
  std::fprintf(f, "tessera %s: serve large language models on GPUs, CPUs and clusters\n\n", TESSERA_VERSION_STRING);
  std::fprintf(f, "usage: tessera <command> [flags]   (tessera <command> --help for its flags)\n\ncommands:\n");
  for (const Verb& v : kVerbs) std::fprintf(f, "  %-14s %s\n", v.name, v.help);
  std::fprintf(f, "  %-14s %s\n", "version", "print the version");
}

}  // namespace

int main(int argc, char** argv) {
  tessera::init_logging();
  tessera::install_stack_dump_on_sigquit();  // kill -QUIT: every thread's stack, then go on
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string_view verb = argv[1];
  if (verb == "version" || verb == "--version") {
    std::printf("tessera %s (%s)\n", TESSERA_VERSION_STRING, TESSERA_GIT_COMMIT);
    const std::string_view archs = tessera::cuda_built_architectures();
    std::printf("CUDA kernels: %s\n",
                archs.empty() ? "none (a CPU-only build)" : tessera::describe_cuda_architectures(archs).c_str());
    return 0;
  }
  for (const Verb& v : kVerbs) {
    if (verb == v.name) {
      try {
        return v.run(argc - 1, argv + 1);
      } catch (const tessera::cli::FlagError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;  // a mistake on the command line: argparse's (and so vLLM's) exit code
      } catch (const tessera::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: internal: %s\n", e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "error: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
