// Each verb of the `tessera` binary is one function in its own cmd_<verb>.cpp.
#pragma once

namespace tessera::cli {
// argv[0] is the verb itself ("generate"), the rest are its flags.
int run_generate(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_tokenize(int argc, char** argv);
int run_chat_template(int argc, char** argv);
int run_cluster(int argc, char** argv);
int run_node(int argc, char** argv);
int run_serve(int argc, char** argv);
int run_plan(int argc, char** argv);
int run_doctor(int argc, char** argv);
}  // namespace tessera::cli
