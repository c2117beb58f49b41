#!/usr/bin/env bash
# A remote shell for mpirun across network namespaces on one machine (mpirun --mca
# plm_rsh_agent netns_rsh_agent.sh): called as `netns_rsh_agent.sh [OPTIONS] HOST COMMAND...`
# like ssh, it runs COMMAND with sh in the namespace that NETNS_RSH_MAP names for HOST
# ("tnodeA=ns_a,tnodeB=ns_b"), under the host name HOST (its own UTS namespace). Options
# (ssh's -x and the like) are ignored.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
host="${1:?usage: netns_rsh_agent.sh HOST COMMAND...}"
shift
ns=""
IFS=, read -ra pairs <<<"${NETNS_RSH_MAP:?set NETNS_RSH_MAP=host=namespace,...}"
for p in "${pairs[@]}"; do [ "${p%%=*}" = "$host" ] && ns="${p#*=}"; done
[ -n "$ns" ] || { echo "netns_rsh_agent: no namespace for host $host in NETNS_RSH_MAP=$NETNS_RSH_MAP" >&2; exit 255; }
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
