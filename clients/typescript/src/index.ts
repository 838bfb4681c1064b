/**
 * `@assay/client`: a typed client for the Assay gateway (`assay.gateway.v1.GatewayService`) over
 * gRPC (HTTP/2). `new Assay({ target })`, then `evaluate`, `run` (an async iterator of events),
 * `watch`, `getRun`, `listRuns`, the run controls, `compare`, `refine`, `debate`, `selfRefine`;
 * for large runs `run(..., { open: true })`, `appendRecords` and `listRunResults`.
 * The generated messages are re-exported under `pb`.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { type Client, Code, ConnectError, type Interceptor, type Transport, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { debuglog } from "node:util";

import { ChecklistSchema } from "./gen/assay/common/v1/common_pb.js";
import { Preset } from "./gen/assay/generator/v1/generator_pb.js";
import type { SelfRefineRequestSchema } from "./gen/assay/refiners/v1/refiners_pb.js";
import {
  type AppendRecordsRequestSchema,
  type AppendRecordsResponse,
  type ChecklistEvalPipelineSchema,
  CompareMetric,
  type CompareRunsResponse,
  type DebatePipelineSchema,
  type EvalRecordSchema,
  type EvaluateResponse,
  GatewayService,
  type ListRunsResponse,
  type PipelineKind,
  type RecordResult,
  RefinementMode,
  type ResponderSchema,
  type Run,
  type RunPipelineRequestSchema,
  type RunState,
  type TargetedRefinementPipelineSchema,
} from "./gen/assay/gateway/v1/gateway_pb.js";
import { AUTO_CHECK_ATTEMPTS, AUTO_CHECK_TIMEOUT_MS, differences, emitServerNewer, reflectFiles } from "./compat.js";
import { decorated, toAssayError } from "./errors.js";
import { RunStream, type RunStreamOptions } from "./run-stream.js";

export { type AssayError, fieldViolations } from "./errors.js";
export { PROTO_VERSION, differences, emitServerNewer } from "./compat.js";
export { RunStream, type RunStreamOptions } from "./run-stream.js";
export { Code, ConnectError } from "@connectrpc/connect";
export * as pb from "./gen/assay/gateway/v1/gateway_pb.js";
export * as common from "./gen/assay/common/v1/common_pb.js";
export * as generator from "./gen/assay/generator/v1/generator_pb.js";
export * as refiners from "./gen/assay/refiners/v1/refiners_pb.js";

/** TLS settings: PEM contents (not paths). */
export interface TlsOptions {
  /** CA bundle the server's certificate must chain to (default: Node's roots). */
  ca?: string | Buffer;
  /** Client certificate chain and key, for mutual TLS. */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** Name checked in the server's certificate (default: the target's host). */
  serverName?: string;
}

/** How to reach the gateway. */
export interface AssayOptions {
  /** The gateway's URL, e.g. `http://127.0.0.1:50051` (`https://` or `tls` for TLS). */
  target: string;
  /** Bearer token (the mesh's `auth_token`). */
  token?: string;
  /** TLS: `true` for Node's roots, or the certificates. */
  tls?: boolean | TlsOptions;
  /** Default deadline of every unary call, milliseconds (none when unset). */
  timeoutMs?: number;
  /**
   * Compare the server's protos with the client's (by reflection) once, when the first call
   * starts, without delaying it (default true). A server without reflection or a failed check
   * never fails a call (set `NODE_DEBUG=assay` to see why a check failed).
   */
  checkServer?: boolean;
  /**
   * Called with what a newer server has and this client lacks (by the automatic check, once per
   * client, and by `checkServer()`). Default: `process.emitWarning` of type `ServerNewerWarning`
   * (code `ASSAY_SERVER_NEWER`).
   */
  onServerNewer?: (differences: string[]) => void;
}

/** Per-call options. */
export interface CallOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

/** One record to evaluate (`id` defaults to its index). */
export type RecordInit = MessageInitShape<typeof EvalRecordSchema>;

/** A checklist preset by name (`"tick"`, `"rocketeval"`, `"rlcf_direct"`, ...) or value. */
export type PresetName = Lowercase<Exclude<keyof typeof Preset, "UNSPECIFIED">> | Preset;

/**
 * A model under test: `"openai:MODEL"` / `"local:"` / `"MODEL@BACKEND"` / `"MODEL"`, or a
 * Responder (`name`, `model`, `systemPrompt`, `template`, `samples`).
 */
export type ResponderInit = string | MessageInitShape<typeof ResponderSchema>;

/**
 * What `evaluate` scores with: a preset, or a checklist (questions, or a full Checklist). With
 * `respond` (models under test, the first the baseline) each answers every record's `input`, its
 * answers are scored, and the response has `responders` (aggregate and cost of each) and
 * `comparisons` (each against the first, as `compareRuns` computes it).
 */
export type EvaluateOptions = CallOptions &
  Omit<MessageInitShape<typeof ChecklistEvalPipelineSchema>, "records" | "source" | "$typeName"> & {
    preset?: PresetName;
    checklist?: string[] | MessageInitShape<typeof ChecklistSchema>;
    respond?: ResponderInit[];
  };

/** A responder's model from `BACKEND:MODEL` (built-in backends), `MODEL@BACKEND` or `MODEL`. */
export function responderInit(value: ResponderInit): MessageInitShape<typeof ResponderSchema> {
  if (typeof value !== "string") {
    return value;
  }
  const colon = value.indexOf(":");
  if (!value.includes("@") && colon > 0 && ["openai", "local"].includes(value.slice(0, colon))) {
    return { model: { backend: value.slice(0, colon), model: value.slice(colon + 1).trim() } };
  }
  const at = value.lastIndexOf("@");
  return at >= 0
    ? { model: { model: value.slice(0, at).trim(), backend: value.slice(at + 1).trim() } }
    : { model: { model: value.trim() } };
}

/** Who acts on a run, for its audit log. */
export interface ControlOptions extends CallOptions {
  actor?: string;
  reason?: string;
}

/** Pipeline fields of a targeted refinement besides the sections, with `mode` by name. */
export type RefineOptions = RunStreamOptions &
  Omit<MessageInitShape<typeof TargetedRefinementPipelineSchema>, "sections" | "mode" | "$typeName"> & {
    mode?: "full_auto" | "semi_auto" | RefinementMode;
    label?: string;
  };

/** A section of a document to refine (`index` defaults to its position). */
export interface SectionInit {
  id: string;
  title?: string;
  content: string;
  index?: number;
}

/** A debate problem: its text, or the full message. */
export type ProblemInit = string | { id?: string; problem: string; reference?: string };

/** Debate settings besides the problems. */
export type DebateOptions = RunStreamOptions &
  Omit<MessageInitShape<typeof DebatePipelineSchema>, "problems" | "$typeName"> & { label?: string };

/** Self-refine settings besides the draft. */
export type SelfRefineOptions = RunStreamOptions &
  Omit<MessageInitShape<typeof SelfRefineRequestSchema>, "draft" | "$typeName"> & { label?: string };

/** Options of `compare`. */
export interface CompareOptions extends CallOptions {
  metric?: "primary" | "pass_rate" | "weighted" | "normalized" | CompareMetric;
  /** Significance level (default 0.05). */
  alpha?: number;
  /** Regression gate: the smallest drop that counts. */
  minEffect?: number;
  bootstrapSeed?: bigint | number;
}

/** Options of `run`. */
export type RunOptions = RunStreamOptions & {
  /**
   * checklist_eval only: create the run open (`RunPipelineRequest.open`). Its records (the
   * pipeline's, possibly none, then `appendRecords`) are kept in the run store and scored as they
   * arrive; it finishes once sealed, and its results are read with `listRunResults`.
   */
  open?: boolean;
};

/** Records per AppendRecords message at most (as `pipeline.records`). */
export const MAX_APPEND_BATCH = 10_000;
/** Bytes of record text per AppendRecords message at most (the gateway takes up to 64 MiB): a
 * batch goes out early when its records reach this, however few they are. */
export const MAX_APPEND_BYTES = 16 * 1024 * 1024;

/** About how many bytes a record takes on the wire: its texts. */
function recordBytes(r: RecordInit): number {
  const text = (v: unknown) => (typeof v === "string" ? Buffer.byteLength(v) : 0);
  const o = r as Record<string, unknown>;
  let n = 16;
  for (const k of ["id", "input", "target", "reference", "history"]) n += text(o[k]);
  if (Array.isArray(o.candidates)) {
    for (const c of o.candidates) n += typeof c === "string" ? text(c) : text((c as Record<string, unknown>)?.text);
  }
  return n;
}

/** Options of `appendRecords`. */
export interface AppendRecordsOptions {
  /** End the run's records: the last message carries it, and the run finishes once they are scored. */
  seal?: boolean;
  /** Records per message, 1 to 10,000 (default 10,000). */
  batchSize?: number;
  signal?: AbortSignal;
  /** Deadline of the whole call (none by default: the client's `timeoutMs` is for unary calls). */
  timeoutMs?: number;
}

/** Filters and paging of `listRuns`. */
export interface ListRunsOptions extends CallOptions {
  pageSize?: number;
  pageToken?: string;
  kind?: PipelineKind;
  state?: RunState;
}

function presetValue(p: PresetName): Preset {
  if (typeof p === "number") {
    return p;
  }
  const v = Preset[p.toUpperCase() as keyof typeof Preset];
  if (v === undefined) {
    throw new TypeError(`unknown preset "${p}"`);
  }
  return v;
}

function checklistInit(c: string[] | MessageInitShape<typeof ChecklistSchema>): MessageInitShape<typeof ChecklistSchema> {
  if (Array.isArray(c)) {
    return { items: c.map((question, i) => ({ id: `q${i + 1}`, question })) };
  }
  return c;
}

function enumByName<E extends Record<string, string | number>>(e: E, name: string | number, what: string): number {
  if (typeof name === "number") {
    return name;
  }
  const v = e[name.toUpperCase() as keyof E];
  if (typeof v !== "number") {
    throw new TypeError(`unknown ${what} "${name}"`);
  }
  return v;
}

const debug = debuglog("assay");

/**
 * The AppendRecords messages of `records`, `batchSize` each, built as they are read (one message
 * held at a time). A full message goes out once the next record exists, so the last one holds the
 * last records and carries `seal`; no records at all make one empty message.
 */
async function* appendRequests(
  runId: string,
  records: Iterable<RecordInit> | AsyncIterable<RecordInit>,
  seal: boolean,
  batchSize: number,
): AsyncGenerator<MessageInitShape<typeof AppendRecordsRequestSchema>> {
  let batch: RecordInit[] = [];
  let bytes = 0;
  for await (const record of records) {
    const size = recordBytes(record);
    if (batch.length > 0 && (batch.length === batchSize || bytes + size > MAX_APPEND_BYTES)) {
      yield { runId, records: batch };
      batch = [];
      bytes = 0;
    }
    batch.push(record);
    bytes += size;
  }
  yield { runId, records: batch, seal };
}

/** A connection to one gateway. */
export class Assay {
  /** The generated client, for anything the helpers below do not cover. */
  readonly client: Client<typeof GatewayService>;
  private readonly timeoutMs: number | undefined;
  private readonly transport: Transport;
  private readonly onServerNewer: (differences: string[]) => void;
  private checkPending: boolean;
  private checkAttempts = 0;
  private check: Promise<string[] | undefined> | undefined;

  constructor(options: AssayOptions) {
    const tls = options.tls;
    let baseUrl = options.target.includes("://") ? options.target : `http://${options.target}`;
    if (tls !== undefined && tls !== false && baseUrl.startsWith("http://")) {
      baseUrl = `https://${baseUrl.slice("http://".length)}`;
    }
    const interceptors: Interceptor[] = [
      (next) => (req) => {
        if (req.service.typeName === GatewayService.typeName) {
          this.autoCheck();
        }
        return next(req);
      },
    ];
    const token = options.token;
    if (token !== undefined && token !== "") {
      interceptors.push((next) => (req) => {
        req.header.set("authorization", `Bearer ${token}`);
        return next(req);
      });
    }
    const nodeOptions =
      typeof tls === "object" ? { ca: tls.ca, cert: tls.cert, key: tls.key, servername: tls.serverName } : undefined;
    this.transport = createGrpcTransport({ baseUrl, interceptors, nodeOptions });
    this.client = createClient(GatewayService, this.transport);
    this.timeoutMs = options.timeoutMs;
    this.checkPending = options.checkServer ?? true;
    this.onServerNewer = options.onServerNewer ?? emitServerNewer;
  }

  /**
   * The automatic check, once the first call started it: resolves (never rejects) with what
   * the server has and this client lacks, or `undefined` when the check could not be made.
   */
  get serverCheck(): Promise<string[] | undefined> | undefined {
    return this.check;
  }

  /**
   * Compare the server's protos (by reflection) with the client's: the messages, fields, enum
   * values and methods the server has and this client lacks (empty: compatible). A non-empty
   * answer also goes to `onServerNewer`: `v1` only grows, so the client still works, without
   * the new parts. Rejects when the server has no reflection (UNIMPLEMENTED) or refuses the call.
   */
  async checkServer(options: CallOptions = {}): Promise<string[]> {
    const files = await decorated(() =>
      this.serverFiles({ signal: options.signal, timeoutMs: options.timeoutMs ?? AUTO_CHECK_TIMEOUT_MS }),
    );
    this.checkPending = false;
    const found = differences(files);
    if (found.length > 0) {
      this.onServerNewer(found);
    }
    return found;
  }

  /** The server's protos as its reflection serves them (the gateway's file and its imports). */
  protected serverFiles(options: { signal?: AbortSignal; timeoutMs?: number }): Promise<FileDescriptorProto[]> {
    return reflectFiles(this.transport, options);
  }

  /** Starts the automatic check unless it ran (or runs) already. */
  private autoCheck(): void {
    if (!this.checkPending || this.check !== undefined) {
      return;
    }
    this.checkAttempts += 1;
    const started = this.serverFiles({ timeoutMs: AUTO_CHECK_TIMEOUT_MS }).then(
      (files) => {
        if (!this.checkPending) {
          return undefined; // an explicit checkServer() reported already
        }
        this.checkPending = false;
        const found = differences(files);
        if (found.length === 0) {
          debug("the server's protos match this client's");
          return found;
        }
        try {
          this.onServerNewer(found);
        } catch (err) {
          debug("onServerNewer threw: %s", err); // nothing may fail a call from here
        }
        return found;
      },
      (err: unknown) => {
        const ce = ConnectError.from(err);
        debug("server check failed (%s); calls go on", ce.message);
        if (ce.code === Code.Unavailable && this.checkAttempts < AUTO_CHECK_ATTEMPTS) {
          this.check = undefined; // the next call tries again
        } else {
          this.checkPending = false;
        }
        return undefined;
      },
    );
    this.check = started;
  }

  private call(o: CallOptions | undefined): { signal?: AbortSignal; timeoutMs?: number } {
    return { signal: o?.signal, timeoutMs: o?.timeoutMs ?? this.timeoutMs };
  }

  /** Checklist evaluation of `records`, waited for (aborting `signal` stops the work). */
  evaluate(records: RecordInit[], options: EvaluateOptions = {}): Promise<EvaluateResponse> {
    const { signal, timeoutMs, preset, checklist, respond, ...pipeline } = options;
    if (respond !== undefined) {
      pipeline.responders = [...(pipeline.responders ?? []), ...respond.map(responderInit)];
    }
    const source =
      checklist !== undefined
        ? { source: { case: "checklist" as const, value: checklistInit(checklist) } }
        : { source: { case: "preset" as const, value: presetValue(preset ?? "tick") } };
    return decorated(() =>
      this.client.evaluate({ pipeline: { ...pipeline, records, source } }, this.call({ signal, timeoutMs })),
    );
  }

  /**
   * Start any pipeline and iterate its events; `await stream.result()` for the outcome. With
   * `open: true` (checklist_eval only) the run is created open: `await stream.started()` gives its
   * id, `appendRecords` feeds it, and `listRunResults` reads its results.
   */
  run(request: MessageInitShape<typeof RunPipelineRequestSchema>, options: RunOptions = {}): RunStream {
    if (options.open === true) {
      request = { ...request, open: true };
    }
    return new RunStream(
      (runId, after, signal) =>
        runId === undefined
          ? this.client.runPipeline(request, { signal })
          : this.client.watchRun({ runId, afterSequence: after }, { signal }),
      (runId) => this.cancel(runId, { reason: "aborted by the client" }),
      options,
    );
  }

  /** Reattach to a run's events after sequence `after` (0: from the start), live ones followed. */
  watch(runId: string, after: bigint | number = 0, options: RunStreamOptions = {}): RunStream {
    return new RunStream(
      (id, seq, signal) => this.client.watchRun({ runId: id ?? runId, afterSequence: seq }, { signal }),
      (id) => this.cancel(id, { reason: "aborted by the client" }),
      options,
      runId,
      BigInt(after),
    );
  }

  /** A run's state, progress and result. */
  async getRun(runId: string, options?: CallOptions): Promise<Run> {
    const res = await decorated(() => this.client.getRun({ runId }, this.call(options)));
    if (res.run === undefined) {
      throw new Error(`the gateway returned no run for ${runId}`);
    }
    return res.run;
  }

  /**
   * Delete a finished run with its events and audit entries; resolves to the run as it was
   * (without its result). An `AssayError` FAILED_PRECONDITION while it has not finished (cancel
   * it first), NOT_FOUND when there is no such run.
   */
  async deleteRun(runId: string, options?: CallOptions): Promise<Run> {
    const res = await decorated(() => this.client.deleteRun({ runId }, this.call(options)));
    if (res.run === undefined) {
      throw new Error(`the gateway returned no run for ${runId}`);
    }
    return res.run;
  }

  /**
   * Add `records` to an open run (`run(..., { open: true })`; `runId` may be its `RunStream`) over
   * one AppendRecords client stream, in messages of `batchSize` records (at most 10,000). The
   * records (an array, a generator, an async iterable) are read as the messages are sent, never
   * held whole. `seal` ends the run's records (the last message carries it). Resolves to what the
   * run holds: `appended` by this call, `recordsTotal`, `sealed`. Rejects FAILED_PRECONDITION for a
   * sealed run or one not created open, NOT_FOUND for no such run, INVALID_ARGUMENT for a refused
   * record; an error thrown by `records` cancels the call and rejects as it was thrown (messages
   * sent before it may have been added).
   */
  async appendRecords(
    runId: string | RunStream,
    records: Iterable<RecordInit> | AsyncIterable<RecordInit>,
    options: AppendRecordsOptions = {},
  ): Promise<AppendRecordsResponse> {
    const { seal, batchSize, signal, timeoutMs } = options;
    const size = batchSize ?? MAX_APPEND_BATCH;
    if (!Number.isInteger(size) || size < 1 || size > MAX_APPEND_BATCH) {
      throw new RangeError(`batchSize: must be an integer between 1 and ${MAX_APPEND_BATCH}, got ${size}`);
    }
    if (records == null || (typeof records !== "object" && typeof records !== "function")) {
      throw new TypeError(`records: expected an iterable of records, got ${typeof records}`);
    }
    if (!(Symbol.iterator in records) && !(Symbol.asyncIterator in records)) {
      throw new TypeError("records: expected an iterable or an async iterable of records");
    }
    const id = typeof runId === "string" ? runId : await runId.started();
    let failed: { error: unknown } | undefined;
    async function* guarded() {
      try {
        yield* appendRequests(id, records, seal ?? false, size);
      } catch (error) {
        failed = { error };
        throw error;
      }
    }
    try {
      return await this.client.appendRecords(guarded(), { signal, timeoutMs });
    } catch (err) {
      if (failed !== undefined) {
        throw failed.error;
      }
      throw toAssayError(err);
    }
  }

  /**
   * A checklist_eval run's record results in record order, every page: ListRunResults `pageSize`
   * results at a time (default 1000, at most 10,000) as the iteration goes, following
   * `nextPageToken` to the last page. Any run, small or open; while the run executes it ends with
   * the results stored so far. Rejects (on iteration) NOT_FOUND for no such run.
   */
  async *listRunResults(
    runId: string | RunStream,
    pageSize = 1000,
    options?: CallOptions,
  ): AsyncGenerator<RecordResult, void, undefined> {
    const id = typeof runId === "string" ? runId : await runId.started();
    let pageToken = "";
    for (;;) {
      const page = await decorated(() => this.client.listRunResults({ runId: id, pageSize, pageToken }, this.call(options)));
      yield* page.results;
      pageToken = page.nextPageToken;
      if (pageToken === "") {
        return;
      }
    }
  }

  /** A page of runs, newest first. */
  listRuns(options: ListRunsOptions = {}): Promise<ListRunsResponse> {
    const { signal, timeoutMs, ...req } = options;
    return decorated(() => this.client.listRuns(req, this.call({ signal, timeoutMs })));
  }

  private async control(
    runId: string,
    action: MessageInitShape<typeof GatewayService.method.controlRun.input>["action"],
    o: ControlOptions = {},
  ): Promise<Run> {
    const res = await decorated(() =>
      this.client.controlRun({ runId, action, actor: o.actor ?? "", reason: o.reason ?? "" }, this.call(o)),
    );
    if (res.run === undefined) {
      throw new Error(`the gateway returned no run for ${runId}`);
    }
    return res.run;
  }

  /** Pause after the current task. */
  pause(runId: string, o?: ControlOptions): Promise<Run> {
    return this.control(runId, { case: "pause", value: {} }, o);
  }

  /** Resume a paused or interrupted run. */
  resume(runId: string, o?: ControlOptions): Promise<Run> {
    return this.control(runId, { case: "resume", value: {} }, o);
  }

  /** Cancel the run. */
  cancel(runId: string, o?: ControlOptions): Promise<Run> {
    return this.control(runId, { case: "cancel", value: {} }, o);
  }

  /** Targeted refinement: accept the content as it stands. */
  accept(runId: string, o?: ControlOptions): Promise<Run> {
    return this.control(runId, { case: "accept", value: {} }, o);
  }

  /** Targeted refinement: mark an escalation as reviewed. */
  review(runId: string, o?: ControlOptions): Promise<Run> {
    return this.control(runId, { case: "review", value: {} }, o);
  }

  /** Targeted refinement: replace a section's content (while paused or awaiting a human). */
  editSection(runId: string, sectionId: string, content: string, o?: ControlOptions): Promise<Run> {
    return this.control(runId, { case: "editSection", value: { sectionId, content } }, o);
  }

  /** The paired comparison of two checklist_eval runs (candidate minus baseline). */
  compare(baselineRunId: string, candidateRunId: string, options: CompareOptions = {}): Promise<CompareRunsResponse> {
    const { signal, timeoutMs, metric, alpha, minEffect, bootstrapSeed } = options;
    return decorated(() =>
      this.client.compareRuns(
        {
          baselineRunId,
          candidateRunId,
          metric: metric === undefined ? CompareMetric.UNSPECIFIED : enumByName(CompareMetric, metric, "metric"),
          alpha: alpha ?? 0,
          minEffect,
          bootstrapSeed: bootstrapSeed === undefined ? undefined : BigInt(bootstrapSeed),
        },
        this.call({ signal, timeoutMs }),
      ),
    );
  }

  /** Judge-targeted refinement of a sectioned document, as a run. */
  refine(sections: SectionInit[], options: RefineOptions = {}): RunStream {
    const { signal, cancelRunOnAbort, reconnects, label, mode, ...pipeline } = options;
    return this.run(
      {
        label: label ?? "",
        pipeline: {
          case: "targetedRefinement",
          value: {
            ...pipeline,
            mode: mode === undefined ? RefinementMode.UNSPECIFIED : enumByName(RefinementMode, mode, "mode"),
            sections: sections.map((s, i) => ({ id: s.id, title: s.title ?? "", content: s.content, index: s.index ?? i })),
          },
        },
      },
      { signal, cancelRunOnAbort, reconnects },
    );
  }

  /** A multi-LLM debate over `problems`, as a run. */
  debate(problems: ProblemInit[], options: DebateOptions = {}): RunStream {
    const { signal, cancelRunOnAbort, reconnects, label, ...pipeline } = options;
    return this.run(
      {
        label: label ?? "",
        pipeline: {
          case: "debate",
          value: { ...pipeline, problems: problems.map((p) => (typeof p === "string" ? { problem: p } : p)) },
        },
      },
      { signal, cancelRunOnAbort, reconnects },
    );
  }

  /** Self-refine a draft (critique, revise, until converged), as a run. */
  selfRefine(draft: string, options: SelfRefineOptions = {}): RunStream {
    const { signal, cancelRunOnAbort, reconnects, label, ...request } = options;
    return this.run(
      { label: label ?? "", pipeline: { case: "selfRefine", value: { request: { ...request, draft } } } },
      { signal, cancelRunOnAbort, reconnects },
    );
  }
}

/** Build a Checklist message (for `evaluate({ checklist })` or a pipeline). */
export function checklist(questions: string[], id = ""): ReturnType<typeof create<typeof ChecklistSchema>> {
  return create(ChecklistSchema, { id, items: questions.map((question, i) => ({ id: `q${i + 1}`, question })) });
}
