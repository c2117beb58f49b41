# Sourced by the launcher tests (netns_slurm, netns_mpirun, netns_torchrun, netns_k8s): their shared checks and the
# one-rank reference run.
#   FAIL MSG: records a failure ($fail=1) and prints it.   has FILE TEXT: FAIL unless FILE contains TEXT.
#   elapsed T0 T1: seconds between two `date +%s.%N` readings.
#   GEN: the generate flags every test uses (the same prompt ids, 12 greedy tokens, JSON lines);
#   ids FILE / text FILE: the token ids of every JSON line of FILE / the text of its first.
fail=0
FAIL() { echo "FAIL: $*"; fail=1; }
has() { grep -q -- "$2" "$1" || { FAIL "$1 lacks '$2'"; echo "--- $1"; tail -n 20 "$1"; }; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }
PROMPT=39,7,201,5,88
GEN=(--device cpu --json --ignore-eos --max-tokens 12 --prompt-ids "$PROMPT")
ids() { python3 -c 'import json, sys; print([json.loads(l)["token_ids"] for l in open(sys.argv[1]) if l.startswith("{")])' "$1"; }
text() { python3 -c 'import json, sys; print([json.loads(l)["text"] for l in open(sys.argv[1]) if l.startswith("{")][0])' "$1"; }
