// The real coding agents from npm against `tessera serve` (started by tests/integration/tool_model_run.sh
// on the hand-set model of make_tool_model.mjs with a 40k context and the access log on): `claude -p`
// (Anthropic Messages, @anthropic-ai/claude-code) and `codex exec` (Responses API, @openai/codex) each
// run a whole agent turn: the model calls get_weather, the agent (which has no such tool) sends back
// an error result, the model answers "Warm", the agent prints it and exits 0; every request they sent
// got a 2xx (read from the server's access log). Codex sends its full request (about 6k tokens of
// instructions and tools).
// Both run with a dead HTTPS proxy and NO_PROXY=127.0.0.1, so they can reach nothing but the server,
// and with their telemetry and update checks off.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const LOG = process.env.TESSERA_LOG;
const MODEL = 'qwen3-tiny';
const bin = path.join(path.dirname(fileURLToPath(import.meta.url)), 'node_modules', '.bin');
const isolated = {
  PATH: process.env.PATH,
  HTTPS_PROXY: 'http://127.0.0.1:9', HTTP_PROXY: 'http://127.0.0.1:9',
  https_proxy: 'http://127.0.0.1:9', http_proxy: 'http://127.0.0.1:9',
  NO_PROXY: '127.0.0.1,localhost', no_proxy: '127.0.0.1,localhost',
};

// Access-log lines: `127.0.0.1:PORT - "POST /v1/responses HTTP/1.1" 200`, from `from` bytes on.
function requests(from) {
  const text = fs.readFileSync(LOG, 'utf8').slice(from);
  return [...text.matchAll(/"([A-Z]+) (\S+) HTTP\/1\.1" (\d{3})/g)].map((m) => ({ method: m[1], target: m[2], status: +m[3] }));
}
function run(cmd, args, env, cwd) {
  const r = spawnSync(cmd, args, { env: { ...isolated, ...env }, cwd, encoding: 'utf8', timeout: process.env.TESSERA_AGENTS_FULL === '1' ? 600_000 : 240_000 });
  return { ...r, all: `${r.stdout}\n${r.stderr}` };
}
// The client exited 0 and printed the model's answer, posted to `target` at least twice (the tool call,
// then the tool result), and no request it sent got a 4xx or 5xx.
function checkRun(cmd, r, from, target) {
  console.log(`${version(cmd)}: exit ${r.status}; output: ${r.all.trim().slice(-400)}`);
  const reqs = requests(from);
  console.log(reqs.map((q) => `${q.method} ${q.target} ${q.status}`).join('\n'));
  assert.equal(r.status, 0, r.all);
  assert.match(r.stdout, /Warm/, r.all);
  const posts = reqs.filter((q) => q.method === 'POST' && q.target === target && q.status === 200);
  assert.ok(posts.length >= 2, `${posts.length} POST ${target}`);
  for (const q of reqs) assert.ok(q.status < 400, `${q.method} ${q.target} answered ${q.status}`);
}
function version(cmd) { return run(path.join(bin, cmd), ['--version'], { HOME: os.tmpdir() }).stdout.trim(); }

test('claude -p (Claude Code) completes a run against tessera', { skip: !fs.existsSync(path.join(bin, 'claude')) }, () => {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'tessera-claude-'));
  const from = fs.statSync(LOG).size;
  // Five of its built-in tools (Agent brings the mid-conversation system message) keep the first request
  // near 4k tokens; TESSERA_AGENTS_FULL=1 sends all of them (about 18k tokens: minutes of CPU prefill).
  const tools = process.env.TESSERA_AGENTS_FULL === '1' ? [] : ['--tools', 'Agent,Bash,Read,Edit,Write'];
  const r = run(path.join(bin, 'claude'), ['-p', 'Say hi.', ...tools], {
    HOME: home,
    ANTHROPIC_BASE_URL: URL,
    ANTHROPIC_API_KEY: KEY,
    ANTHROPIC_MODEL: MODEL,
    ANTHROPIC_SMALL_FAST_MODEL: MODEL,
    ANTHROPIC_DEFAULT_HAIKU_MODEL: MODEL,
    ANTHROPIC_DEFAULT_SONNET_MODEL: MODEL,
    ANTHROPIC_DEFAULT_OPUS_MODEL: MODEL,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    DISABLE_AUTOUPDATER: '1', DISABLE_TELEMETRY: '1', DISABLE_ERROR_REPORTING: '1', DISABLE_BUG_COMMAND: '1',
  }, home);
  fs.rmSync(home, { recursive: true, force: true });
  checkRun('claude', r, from, '/v1/messages?beta=true');
});

test('codex exec (Codex) completes a run against tessera', { skip: !fs.existsSync(path.join(bin, 'codex')) }, () => {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'tessera-codex-'));
  fs.writeFileSync(path.join(home, 'config.toml'), [
    `model = "${MODEL}"`,
    'model_provider = "tessera"',
    'model_context_window = 40960',
    'check_for_update_on_startup = false',
    '[analytics]',
    'enabled = false',
    '[model_providers.tessera]',
    'name = "tessera"',
    `base_url = "${URL}/v1"`,
    'env_key = "TESSERA_API_KEY"',
    'wire_api = "responses"',
    'request_max_retries = 0',
    'stream_max_retries = 0',
    '',
  ].join('\n'));
  const from = fs.statSync(LOG).size;
  const r = run(path.join(bin, 'codex'), ['exec', '--skip-git-repo-check', '-s', 'read-only', 'Say hi.'],
    { HOME: home, CODEX_HOME: home, TESSERA_API_KEY: KEY }, home);
  fs.rmSync(home, { recursive: true, force: true });
  checkRun('codex', r, from, '/v1/responses');
});
