# Sourced by the device scripts: first_ids (below) and the fixed prompt token ids every decode and prefill figure
# uses (deterministic, inside the Qwen3 vocabulary), so runs of different scripts compare.
#   P512: the decode prompt (512 tokens); P4K, P4K2: two different 4,096-token prompts (the
#   first warms up, the second is the timed prefill).
prompt_ids() { python3 -c "print(','.join(str((i*$2)%150000+100) for i in range($1)))"; }
P512=$(prompt_ids 512 7919)
P4K=$(prompt_ids 4096 104729)
P4K2=$(prompt_ids 4096 7907)
# The generated ids of a `tessera generate --json` output's first request.
first_ids() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['token_ids'])" "$1"; }
