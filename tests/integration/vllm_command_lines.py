#!/usr/bin/env python3
"""Runs every `vllm serve` command line of vllm_serve_command_lines.txt as `tessera serve`, with the model swapped
for a copy of models/tessera-demo (max_position_embeddings raised to 262144, so the lines' context lengths fit) and
--host/--port for a free local port; nothing else changes. A `start` line must come up (/health answers 200) and
stop cleanly on SIGTERM; a `refuse FLAG` line must exit 2 with a first line "error: ..." that names FLAG and says
what to do, and no parser's raw words. Two at a time (the lines' TP 2 ranks included).

  vllm_command_lines.py TESSERA_BIN
"""
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests/integration/vllm_serve_command_lines.txt")
# Words of an instruction: a refusal must say what to do, not only what is wrong.
ADVICE = re.compile(r"\b(use|drop|give|lower|raise|put|start|serve|pass|leave|edit|set|point|add|ask|merge|"
                    r"choose|read|did you mean|run|terminate|size)\b", re.I)
RAW = re.compile(r"Run with --help|Could not convert|required .* missing|The following argument|"
                 r"is not a flag of tessera serve \(see")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_copy(tmp):
    src = os.path.join(ROOT, "models/tessera-demo")
    dst = os.path.join(tmp, "model")
    os.makedirs(dst)
    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["max_position_embeddings"] = 262144
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


def corpus():
    out = []
    with open(CORPUS) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            expect, command = (part.strip() for part in line.split("|", 1))
            out.append((number, expect, command))
    return out


def tessera_argv(binary, command, model, config_yaml):
    args = shlex.split(command)
    assert args[:2] == ["vllm", "serve"], command
    args = args[2:]
    args[0] = model  # the positional model
    port = str(free_port())
    for flag, value in (("--host", "127.0.0.1"), ("--port", port)):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    args = [config_yaml if a == "CONFIG_YAML" else a for a in args]
    return [binary, "serve"] + args, port


def run_one(binary, model, config_yaml, entry):
    # The free port is found before the server binds it: another test of the same ctest run may take it
    # in between ("Address already in use"); that start is tried again on a new port.
    for _ in range(3):
        result = run_once(binary, model, config_yaml, entry)
        if "cannot listen on" not in result[5] or "Address already in use" not in result[5]:
            break
    return result


def run_once(binary, model, config_yaml, entry):
    number, expect, command = entry
    argv, port = tessera_argv(binary, command, model, config_yaml)
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = False
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                started = r.status == 200
        except OSError:
            pass
        if started:
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log.seek(0)
    output = log.read().decode(errors="replace")
    return number, expect, command, started, proc.returncode, output


def verdict(expect, command, started, rc, output):
    if expect == "start":
        if not started:
            return f"did not start (exit {rc})"
        if rc != 0:
            return f"started but exited {rc} on SIGTERM"
        # --config's file acted: its values, with the command line's own flags after them.
        if "CONFIG_YAML" in command and not ("max-model-len=8192" in output and "max-num-seqs=16" in output
                                             and "served-model-name=from-config" in output):
            return "the --config file's values were not used"
        return None
    flag = expect.split()[1]
    if started:
        return "started, but should refuse"
    lines = [l for l in output.splitlines() if l.startswith("error: ")]
    if rc not in (1, 2) or not lines:
        return f"exit {rc}, want 2 (a flag) or 1 (a configuration) with an 'error: ...' line"
    first = lines[0]
    if flag not in first:
        return f"the error does not name {flag}: {first}"
    if not ADVICE.search(first):
        return f"the error does not say what to do: {first}"
    if RAW.search(output):
        return f"a parser's raw words: {first}"
    return None


def main():
    binary = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="tessera-vllm-lines-")
    try:
        model = demo_copy(tmp)
        config_yaml = os.path.join(tmp, "serve.yaml")
        with open(config_yaml, "w") as f:
            f.write("# vLLM's --config example\nmax-model-len: 8192\nmax_num_seqs: 16\nenable-prefix-caching: true\n"
                    "served-model-name:\n  - from-config\nuvicorn-log-level: \"info\"\n")
        entries = corpus()
        assert len(entries) >= 60, f"only {len(entries)} command lines"
        failures = 0
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            results = pool.map(lambda e: run_one(binary, model, config_yaml, e), entries)
            for number, expect, command, started, rc, output in results:
                problem = verdict(expect, command, started, rc, output)
                status = "ok  " if problem is None else "FAIL"
                print(f"{status} line {number}: {expect}: {command}")
                if problem:
                    failures += 1
                    print(f"     {problem}")
                    print("     " + "\n     ".join(output.strip().splitlines()[-6:]))
        print(f"{len(entries) - failures}/{len(entries)} command lines behave as expected")
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
