/**
 * Test support: a scripted OpenAI-compatible server in this process, and `assay up --backend
 * openai` against it on free ports (every port 0, the gateway's read from the startup line).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** One chat request the scripted server received. */
export interface ChatCall {
  schema: string;
  prompt: string;
}

/** A request held until the test releases it (to keep a run busy). */
interface Held {
  release: () => void;
  closed: Promise<void>;
}

/**
 * An OpenAI-compatible server: chat/completions answered by the JSON-schema name of the request
 * (`checklist_answers`: YES to every `Q<n>:` line of the prompt; `section_verdict`: every criterion
 * at 0.5 and no issue), `/v1/embeddings` answered with
 * a small vector per input. A prompt containing `hold` as given to `holdOn` waits until released.
 */
export class ScriptedLlm {
  readonly calls: ChatCall[] = [];
  private readonly server: http.Server;
  private holdMarker: string | undefined;
  private readonly held: Held[] = [];
  private readonly unconsumed: Held[] = [];
  private heldWaiters: Array<(h: Held) => void> = [];

  private constructor(server: http.Server) {
    this.server = server;
  }

  /** Starts the server on a free loopback port. */
  static async start(): Promise<ScriptedLlm> {
    const server = http.createServer();
    const llm = new ScriptedLlm(server);
    server.on("request", (req, res) => void llm.handle(req, res));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return llm;
  }

  /** `http://127.0.0.1:<port>/v1`. */
  get baseUrl(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
  }

  /** Hold every chat request whose prompt contains `marker` until `releaseAll`. */
  holdOn(marker: string): void {
    this.holdMarker = marker;
  }

  /** Resolves with the next held request once it has arrived (at once if one is waiting). */
  nextHeld(): Promise<Held> {
    const waiting = this.unconsumed.shift();
    if (waiting !== undefined) {
      return Promise.resolve(waiting);
    }
    return new Promise((resolve) => this.heldWaiters.push(resolve));
  }

  /** Let every held request (and later ones) through. */
  releaseAll(): void {
    this.holdMarker = undefined;
    this.unconsumed.splice(0);
    for (const h of this.held.splice(0)) {
      h.release();
    }
  }

  async close(): Promise<void> {
    this.releaseAll();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) {
      chunks.push(c as Buffer);
    }
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}") as Record<string, any>;
    if (req.url?.endsWith("/embeddings")) {
      const inputs: string[] = Array.isArray(body.input) ? body.input : [body.input];
      return reply(res, {
        object: "list",
        model: body.model,
        data: inputs.map((text, index) => ({ object: "embedding", index, embedding: embed(text) })),
        usage: { prompt_tokens: inputs.length, total_tokens: inputs.length },
      });
    }
    if (!req.url?.endsWith("/chat/completions")) {
      res.writeHead(404).end();
      return;
    }
    const prompt = (body.messages as Array<{ content: string }>).map((m) => m.content).join("\n");
    const schema: string = body.response_format?.json_schema?.name ?? "";
    this.calls.push({ schema, prompt });
    if (this.holdMarker !== undefined && prompt.includes(this.holdMarker)) {
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      const closed = new Promise<void>((r) => res.on("close", () => r()));
      const h: Held = { release, closed };
      const waiter = this.heldWaiters.shift();
      this.held.push(h);
      if (waiter !== undefined) {
        waiter(h);
      } else {
        this.unconsumed.push(h);
      }
      await Promise.race([released, closed]);
      if (res.destroyed) {
        return;
      }
    }
    let content: unknown;
    switch (schema) {
      case "checklist_answers": {
        // NO to the first question of a response of grey stones (a responder's weak answer).
        const indices = [...prompt.matchAll(/^Q(\d+):/gm)].map((m) => Number(m[1]));
        const weak = prompt.includes("Grey stones");
        content = {
          answers: indices.map((question_index) => ({
            question_index,
            answer: weak && question_index === 1 ? "NO" : "YES",
          })),
        };
        break;
      }
      case "checklist": {
        // A generated checklist (a preset).
        content = { items: [{ question: "Does it mention leaves?" }, { question: "Is it an answer?" }] };
        break;
      }
      case "": {
        // A responder (free text): model-a mentions leaves, model-b on even topics only.
        const n = Number(/topic (\d+)/.exec(prompt)?.[1] ?? 0);
        const leaves = body.model === "model-a" || n % 2 === 0;
        content = `${leaves ? "Falling leaves" : "Grey stones"} for topic ${n}, by ${body.model}.`;
        break;
      }
      case "section_verdict": {
        // Every criterion at 0.5 and no issue: below every threshold with nothing to fix, so a
        // semi-auto refinement escalates to a human.
        const names: string[] = body.response_format?.json_schema?.schema?.properties?.criterion_scores?.required ?? [];
        content = { criterion_scores: Object.fromEntries(names.map((n) => [n, 0.5])), issues: [], section_scores: [] };
        break;
      }
      default:
        res.writeHead(400, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: `no script for schema "${schema}"` } }));
        return;
    }
    reply(res, {
      id: `chatcmpl-${this.calls.length}`,
      object: "chat.completion",
      model: body.model,
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: typeof content === "string" ? content : JSON.stringify(content) },
          finish_reason: "stop",
        },
      ],
      usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
    });
  }
}

function reply(res: http.ServerResponse, body: unknown): void {
  res.writeHead(200, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

/** A deterministic 8-dimensional vector of `text`. */
function embed(text: string): number[] {
  const v = new Array<number>(8).fill(0);
  for (let i = 0; i < text.length; i++) {
    v[i % 8]! += text.charCodeAt(i) / 1000;
  }
  return v;
}

/** The `assay` binary: `ASSAY_BIN`, else the workspace's release build. */
export function assayBinary(): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  // dist/test/support -> clients/typescript -> workspace root.
  return process.env.ASSAY_BIN ?? path.resolve(here, "../../../../../target/release/assay");
}

/** A running `assay up --backend openai`. */
export class Mesh {
  readonly target: string;
  private readonly child: ChildProcess;
  private readonly dir: string;
  private readonly exited: Promise<void>;
  stderr = "";

  private constructor(child: ChildProcess, dir: string, target: string, exited: Promise<void>) {
    this.child = child;
    this.dir = dir;
    this.target = target;
    this.exited = exited;
  }

  /** Starts the mesh against `llm`, with `authToken` when given; resolves once it is SERVING. */
  static async start(llm: ScriptedLlm, authToken?: string): Promise<Mesh> {
    const dir = mkdtempSync(path.join(tmpdir(), "assay-ts-"));
    const ports = ["GATEWAY", "GENERATOR", "REFINERS", "SCORER", "ARBITER", "DELTA_JUDGE", "DEBATE", "ADMIN"];
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      OPENAI_BASE_URL: llm.baseUrl,
      OPENAI_API_KEY: "x",
      ASSAY__GATEWAY__STORE: path.join(dir, "runs.db"),
      ASSAY__GATEWAY__DATA_DIR: dir,
      ASSAY__DRAIN_SECONDS: "1",
      ASSAY__AUTH_TOKEN: authToken ?? "",
      RUST_LOG: "warn",
    };
    for (const p of ports) {
      env[`ASSAY__PORTS__${p}`] = "0";
    }
    const child = spawn(assayBinary(), ["up", "--backend", "openai"], { env, stdio: ["ignore", "pipe", "pipe"] });
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    let out = "";
    const target = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill("SIGKILL");
        reject(new Error(`assay up was not serving after 120 s:\n${out}`));
      }, 120_000);
      const onData = (chunk: Buffer) => {
        out += chunk.toString("utf8");
        // The whole line: a chunk may end inside the address (then `\S+` would stop at the host).
        const m = /assay mesh is up: gateway on (\S+) \(/.exec(out);
        if (m !== null) {
          clearTimeout(timer);
          resolve(`http://${m[1]}`);
        }
      };
      child.stdout!.on("data", onData);
      child.stderr!.on("data", onData);
      child.once("error", reject);
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`assay up exited (${code}) before serving:\n${out}`));
      });
    });
    const mesh = new Mesh(child, dir, target, exited);
    child.stderr!.on("data", (c: Buffer) => (mesh.stderr += c.toString("utf8")));
    return mesh;
  }

  /** SIGTERM, wait for the exit (SIGKILL after 15 s), remove the temp directory. */
  async stop(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill("SIGTERM");
      const timer = setTimeout(() => this.child.kill("SIGKILL"), 15_000);
      await this.exited;
      clearTimeout(timer);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
