#!/usr/bin/env python3
"""Renders the pods a manifest of this folder makes, as their controllers would, without a cluster.

For a LeaderWorkerSet: each group's leader (<name>-<group>) and workers (<name>-<group>-<index>)
with the variables the LeaderWorkerSet controller adds (LWS_LEADER_ADDRESS =
<name>-<group>.<name>.<namespace>, LWS_GROUP_SIZE, LWS_WORKER_INDEX). For a StatefulSet: pods
<name>-<ordinal> with the apps.kubernetes.io/pod-index and statefulset.kubernetes.io/pod-name
labels. Each container's env is resolved (value, secretKeyRef from the manifest's Secrets,
fieldRef to status.podIP, metadata.name, metadata.namespace, metadata.labels['...']) and
$(VAR) references in command and args are expanded as the kubelet does. Prints a JSON list:
{"pod", "role", "env", "argv", "readiness", "ports"} per pod.

  render_pods.py MANIFEST [--namespace default] [--pod-ip POD=IP ...]
"""
import argparse
import base64
import json
import re
import sys

import yaml


def secrets_of(docs):
    out = {}
    for d in docs:
        if d.get("kind") != "Secret":
            continue
        values = {k: str(v) for k, v in (d.get("stringData") or {}).items()}
        for k, v in (d.get("data") or {}).items():
            values[k] = base64.b64decode(v).decode()
        out[d["metadata"]["name"]] = values
    return out


def expand(text, env):
    """The kubelet's $(VAR) expansion: known variables replaced, $$ an escaped $, others kept."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


def field(path, pod):
    if path == "status.podIP":
        return pod["ip"]
    if path == "metadata.name":
        return pod["name"]
    if path == "metadata.namespace":
        return pod["namespace"]
    m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if m:
        if m.group(1) not in pod["labels"]:
            sys.exit(f"render_pods: pod {pod['name']} has no label {m.group(1)} (fieldRef {path})")
        return pod["labels"][m.group(1)]
    sys.exit(f"render_pods: fieldRef {path} is not rendered here")


def render_container(c, pod, secrets, injected):
    env = dict(injected)
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
            continue
        src = e.get("valueFrom") or {}
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            if ref["name"] not in secrets or ref["key"] not in secrets[ref["name"]]:
                sys.exit(f"render_pods: secret {ref['name']}/{ref['key']} is not in the manifest")
            env[e["name"]] = secrets[ref["name"]][ref["key"]]
        elif "fieldRef" in src:
            env[e["name"]] = field(src["fieldRef"]["fieldPath"], pod)
        else:
            sys.exit(f"render_pods: env {e['name']}: valueFrom {list(src)} is not rendered here")
    argv = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
    return {"pod": pod["name"], "role": pod["role"], "env": env, "argv": argv,
            "readiness": c.get("readinessProbe"), "ports": [p["containerPort"] for p in c.get("ports") or []]}


def pod_of(name, role, labels, namespace, ips, index):
    return {"name": name, "role": role, "labels": labels, "namespace": namespace,
            "ip": ips.get(name, f"10.0.0.{index + 1}")}


def render(docs, namespace, ips):
    secrets = secrets_of(docs)
    pods = []
    for d in docs:
        kind, name = d.get("kind"), d.get("metadata", {}).get("name")
        if kind == "LeaderWorkerSet":
            t = d["spec"]["leaderWorkerTemplate"]
            size = int(t["size"])
            for g in range(int(d["spec"].get("replicas", 1))):
                for i in range(size):
                    tmpl = t.get("leaderTemplate") if i == 0 and t.get("leaderTemplate") else t["workerTemplate"]
                    pod_name = f"{name}-{g}" if i == 0 else f"{name}-{g}-{i}"
                    labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
                    labels.update({"leaderworkerset.sigs.k8s.io/name": name,
                                   "leaderworkerset.sigs.k8s.io/worker-index": str(i)})
                    pod = pod_of(pod_name, "leader" if i == 0 else "worker", labels, namespace, ips, len(pods))
                    injected = {"LWS_LEADER_ADDRESS": f"{name}-{g}.{name}.{namespace}",
                                "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(i)}
                    for c in tmpl["spec"]["containers"]:
                        pods.append(render_container(c, pod, secrets, injected))
        elif kind == "StatefulSet":
            tmpl = d["spec"]["template"]
            for i in range(int(d["spec"].get("replicas", 1))):
                labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
                labels.update({"apps.kubernetes.io/pod-index": str(i),
                               "statefulset.kubernetes.io/pod-name": f"{name}-{i}"})
                pod = pod_of(f"{name}-{i}", "head" if i == 0 else "node", labels, namespace, ips, len(pods))
                for c in tmpl["spec"]["containers"]:
                    pods.append(render_container(c, pod, secrets, {}))
    return pods


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("manifest")
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--pod-ip", action="append", default=[], help="POD=IP (default 10.0.0.N)")
    a = ap.parse_args()
    ips = dict(p.split("=", 1) for p in a.pod_ip)
    with open(a.manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    print(json.dumps(render(docs, a.namespace, ips), indent=1))


if __name__ == "__main__":
    main()
