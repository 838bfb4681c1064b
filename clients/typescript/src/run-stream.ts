/**
 * A pipeline run as an async iterator of its events, with the final result; reattaches with
 * WatchRun from the last sequence seen when the stream breaks (lost connection, reset stream).
 */
import { Code, ConnectError } from "@connectrpc/connect";

import type { RunCompleted, RunEvent } from "./gen/assay/gateway/v1/gateway_pb.js";
import { toAssayError } from "./errors.js";

/**
 * Codes of a stream that broke rather than failed: a lost connection or a reset HTTP/2 stream
 * (which Node reports as CANCEL when the caller did not abort), worth a reattachment.
 */
const BROKEN: ReadonlySet<Code> = new Set([Code.Unavailable, Code.Canceled, Code.Aborted, Code.Internal]);

/** Opens the event stream: the first call starts the run, later ones watch it after `after`. */
export type OpenStream = (
  runId: string | undefined,
  after: bigint,
  signal: AbortSignal,
) => AsyncIterable<{ event?: RunEvent }>;

/** How a {@link RunStream} behaves on abort and on a broken stream. */
export interface RunStreamOptions {
  /** Stops the stream; the run goes on in the gateway unless `cancelRunOnAbort` is set. */
  signal?: AbortSignal;
  /** On abort, also cancel the run in the gateway (ControlRun cancel). Default false. */
  cancelRunOnAbort?: boolean;
  /** Reattachments (WatchRun from the last sequence) after a broken stream. Default 3. */
  reconnects?: number;
}

/** Cancels a run in the gateway (what `cancelRunOnAbort` calls). */
export type CancelRun = (runId: string) => Promise<unknown>;

/**
 * The events of one run, in sequence order, each once (`for await (const ev of stream)`); the
 * typed payload is `ev.event` (`case` names the kind). Iterate it once; `result()` drains what
 * is left and returns the `RunCompleted` event (state and result); `started()` resolves to the
 * run's id (reading ahead to the first event, which the iteration still yields).
 */
export class RunStream implements AsyncIterable<RunEvent> {
  /** The run's id, known from the first event. */
  runId: string | undefined;
  /** The sequence of the last event delivered (0 before the first). */
  lastSequence: bigint;
  /** The final event, once seen. */
  completed: RunCompleted | undefined;
  /** Reattachments made after broken streams. */
  reattached = 0;

  private iterated = false;
  private source: AsyncGenerator<RunEvent> | undefined;
  /** Events read ahead by `started()`, yielded before any other. */
  private readonly early: RunEvent[] = [];
  private readonly open: OpenStream;
  private readonly cancelRun: CancelRun;
  private readonly options: RunStreamOptions;

  /** Used by the client; `runId` and `after` are set for a watch. */
  constructor(open: OpenStream, cancelRun: CancelRun, options: RunStreamOptions, runId?: string, after = 0n) {
    this.open = open;
    this.cancelRun = cancelRun;
    this.options = options;
    this.runId = runId;
    this.lastSequence = after;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<RunEvent> {
    if (this.iterated) {
      throw new Error("a RunStream is iterated once; use watch(runId, after) to read its events again");
    }
    this.iterated = true;
    const source = this.events();
    while (this.early.length > 0) {
      yield this.early.shift()!;
    }
    yield* source;
  }

  /**
   * The run's id. Before the first event has arrived the stream is read up to it (that event
   * stays for the iteration, which yields it first); rejects as the stream does when the gateway
   * refused the run. Call it before iterating (or once an event was yielded).
   */
  async started(): Promise<string> {
    if (this.runId !== undefined) {
      return this.runId;
    }
    if (this.iterated) {
      throw new Error("started(): the stream is being iterated; its first event carries the run id");
    }
    const first = await this.events().next();
    if (first.done === true || this.runId === undefined) {
      throw new ConnectError("the event stream ended before the run started", Code.Unavailable);
    }
    this.early.push(first.value);
    return this.runId;
  }

  /** The one reader of the stream (started by `started()` or the iteration). */
  private events(): AsyncGenerator<RunEvent> {
    this.source ??= this.read();
    return this.source;
  }

  private async *read(): AsyncGenerator<RunEvent> {
    const outer = this.options.signal;
    const reconnects = this.options.reconnects ?? 3;
    for (;;) {
      const local = new AbortController();
      const onAbort = () => local.abort(outer?.reason);
      outer?.addEventListener("abort", onAbort, { once: true });
      if (outer?.aborted) {
        local.abort(outer.reason);
      }
      try {
        for await (const msg of this.open(this.runId, this.lastSequence, local.signal)) {
          const ev = msg.event;
          if (ev === undefined || ev.sequence <= this.lastSequence) {
            continue;
          }
          this.runId = ev.runId;
          this.lastSequence = ev.sequence;
          if (ev.event.case === "completed") {
            this.completed = ev.event.value;
          }
          yield ev;
        }
        return;
      } catch (err) {
        const ce = ConnectError.from(err);
        if (outer?.aborted) {
          if (this.options.cancelRunOnAbort && this.runId !== undefined && this.completed === undefined) {
            await this.cancelRun(this.runId);
          }
          throw toAssayError(ce);
        }
        const broken = BROKEN.has(ce.code) && this.completed === undefined;
        if (!broken || this.runId === undefined || this.reattached >= reconnects) {
          throw toAssayError(ce);
        }
        this.reattached += 1;
      } finally {
        outer?.removeEventListener("abort", onAbort);
      }
    }
  }

  /** Reads every remaining event and returns the run's final event. */
  async result(): Promise<RunCompleted> {
    if (!this.iterated) {
      for await (const _ of this) {
        // Drained for its side effect: `completed`.
      }
    }
    if (this.completed === undefined) {
      throw new ConnectError("the event stream ended before the run completed", Code.Unavailable);
    }
    return this.completed;
  }
}
