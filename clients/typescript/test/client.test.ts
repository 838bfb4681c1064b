/**
 * The client against a real mesh: `assay up --backend openai` over a scripted OpenAI-compatible
 * server, with a bearer token.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { type FileDescriptorProto, FieldDescriptorProto_Type, FieldDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";

import { Assay, Code, ConnectError, type RunStream, fieldViolations, pb } from "../src/index.js";
import { Mesh, ScriptedLlm } from "./support/mesh.js";

const TOKEN = "ts-client-secret";
const QUESTIONS = ["Is the answer polite?", "Does it answer the question?"];

let llm: ScriptedLlm;
let mesh: Mesh;
let assay: Assay;

before(async () => {
  llm = await ScriptedLlm.start();
  mesh = await Mesh.start(llm, TOKEN);
  assay = new Assay({ target: mesh.target, token: TOKEN, timeoutMs: 60_000 });
});

after(async () => {
  await mesh?.stop();
  await llm?.close();
});

function records(tag: string): Array<{ id: string; input: string; target: string }> {
  return [
    { id: `${tag}-a`, input: "Say hello.", target: `Hello there (${tag}).` },
    { id: `${tag}-b`, input: "What is 2+2?", target: `4 (${tag})` },
  ];
}

function evalRun(tag: string): Parameters<Assay["run"]>[0] {
  return {
    label: tag,
    pipeline: {
      case: "checklistEval",
      value: { records: records(tag), source: { source: { case: "checklist", value: { items: QUESTIONS.map((question, i) => ({ id: `q${i + 1}`, question })) } } } },
    },
  };
}

/** Iterates `stream` until the run has started and the scripted server holds its model call. */
async function untilHeld(stream: RunStream): Promise<{ it: AsyncIterator<pb.RunEvent>; runId: string }> {
  const it = stream[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.done, false);
  assert.equal(first.value.event.case, "started");
  await llm.nextHeld();
  return { it, runId: first.value.runId };
}

/** Reads `it` after an abort (events already received may still come) until it rejects. */
async function rejection(it: AsyncIterator<pb.RunEvent>): Promise<unknown> {
  for (;;) {
    try {
      const r = await it.next();
      assert.equal(r.done, false, "the stream must fail, not end, when aborted");
      assert.notEqual(r.value.event.case, "completed");
    } catch (e) {
      return e;
    }
  }
}

const isCanceled = (e: unknown): boolean => e instanceof ConnectError && e.code === Code.Canceled;

/** A run id of the gateway's form that no run has. */
const UNKNOWN_RUN = "00000000-0000-7000-8000-000000000000";

/** Records start..stop-1, made as they are read. */
function* openRecords(start: number, stop: number, prefix = "o"): Generator<{ id: string; input: string; target: string }> {
  for (let i = start; i < stop; i++) {
    yield { id: `${prefix}${i}`, input: "Say hello.", target: `Hello there (${i}).` };
  }
}

/** An open checklist_eval run of `records` (none by default), with the test's checklist. */
function openRun(tag: string, records: Array<{ id: string; input: string; target: string }> = []): RunStream {
  const source = { source: { case: "checklist" as const, value: { items: QUESTIONS.map((question, i) => ({ id: `q${i + 1}`, question })) } } };
  return assay.run({ label: tag, pipeline: { case: "checklistEval", value: { records, source } } }, { open: true });
}

/** The code of the rejection of `p`. */
async function codeOf(p: Promise<unknown>): Promise<Code | undefined> {
  const err = await p.then(
    () => assert.fail("the call must be refused"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ConnectError, String(err));
  return err.code;
}

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) {
    out.push(x);
  }
  return out;
}

describe("@assay/client against assay up", () => {
  test("evaluate with responders scores each model's answers and compares them", async () => {
    const before = llm.calls.length;
    const inputs = [0, 1, 2, 3, 4, 5].map((i) => ({ id: `t${i}`, input: `Write about topic ${i}?` }));
    const res = await assay.evaluate(inputs, {
      preset: "tick",
      respond: ["openai:model-a", { name: "b", model: { backend: "openai", model: "model-b" } }],
    });
    const calls = llm.calls.slice(before);
    assert.equal(calls.filter((c) => c.schema === "checklist").length, 6, "one checklist per input, shared");
    assert.equal(calls.filter((c) => c.schema === "").length, 12, "one answer per input and responder");
    assert.equal(res.results.length, 12);
    assert.deepEqual(
      res.results.slice(0, 2).map((r) => r.responder),
      ["model-a", "b"],
    );
    assert.equal(res.results[0]?.response, "Falling leaves for topic 0, by model-a.");
    assert.deepEqual(
      res.responders.map((r) => r.name),
      ["model-a", "b"],
    );
    assert.equal(res.comparisons.length, 1);
    assert.equal(res.comparisons[0]?.candidateRunId, "b");
    assert.equal(res.comparisons[0]?.nPairs, 6);
    assert.ok((res.comparisons[0]?.diff ?? 0) < 0);
  });

  test("evaluate with stopWhenDecided stops asking once the comparison is decided", async () => {
    const before = llm.calls.length;
    const inputs = Array.from({ length: 200 }, (_, i) => ({ id: `s${i}`, input: `Write about topic ${1000 + i}?` }));
    const res = await assay.evaluate(inputs, {
      preset: "tick",
      respond: ["openai:model-a", "openai:model-b"],
      stopWhenDecided: { seed: 5n },
    });
    const s = res.sequential;
    assert.ok(s?.stoppedEarly, "stopped early");
    assert.equal(s?.seed, 5n);
    assert.equal(s?.comparisons[0]?.decision, pb.SequentialDecision.WORSE);
    const asked = 200 - (s?.recordsNotAsked.length ?? 0);
    const answers = llm.calls.slice(before).filter((c) => c.schema === "").length;
    assert.equal(answers, 2 * asked, "two answers per record asked");
    assert.ok(answers < 200, `${answers} answers of a full run's 400`);
  });

  test("evaluate with a given checklist scores every record on every question", async () => {
    const before = llm.calls.length;
    const res = await assay.evaluate(records("eval"), { checklist: QUESTIONS });
    assert.equal(res.results.length, 2);
    for (const r of res.results) {
      assert.equal(r.error, "");
      assert.equal(r.score?.answeredCount, 2);
      assert.equal(r.score?.passRate, 1);
    }
    assert.deepEqual(
      res.results.map((r) => r.recordId),
      ["eval-a", "eval-b"],
    );
    assert.equal(res.aggregate?.targets, 2);
    const scoring = llm.calls.slice(before).filter((c) => c.schema === "checklist_answers");
    assert.equal(scoring.length, 2, "one batch scoring call per record");
    for (const c of scoring) {
      assert.match(c.prompt, /^Q1: Is the answer polite\?$/m);
      assert.match(c.prompt, /^Q2: Does it answer the question\?$/m);
    }
    const run = await assay.getRun(res.runId);
    assert.equal(run.state, pb.RunState.SUCCEEDED);
    const page = await assay.listRuns({ kind: pb.PipelineKind.CHECKLIST_EVAL });
    assert.ok(page.runs.some((r) => r.runId === res.runId));
  });

  test("run streams typed events in sequence to the final result, and watch replays them", async () => {
    const stream = assay.run(evalRun("stream"));
    const events: pb.RunEvent[] = [];
    for await (const ev of stream) {
      events.push(ev);
    }
    assert.deepEqual(
      events.map((e) => e.sequence),
      events.map((_, i) => BigInt(i + 1)),
      "sequences 1..n without gaps",
    );
    assert.equal(events[0]?.event.case, "started");
    assert.equal(events.filter((e) => e.event.case === "recordScored").length, 2);
    const last = events.at(-1)!;
    assert.equal(last.event.case, "completed");
    const done = await stream.result();
    assert.equal(done.state, pb.RunState.SUCCEEDED);
    assert.equal(done.result?.result.case, "checklistEval");
    if (done.result?.result.case === "checklistEval") {
      assert.deepEqual(
        done.result.result.value.results.map((r) => r.score?.passRate),
        [1, 1],
      );
    }
    assert.equal(stream.runId, last.runId);

    const replay: bigint[] = [];
    for await (const ev of assay.watch(last.runId, 2)) {
      replay.push(ev.sequence);
    }
    assert.deepEqual(replay, events.slice(2).map((e) => e.sequence), "watch replays after the sequence given");
  });

  test("cancel via ControlRun ends the streamed run CANCELLED", async () => {
    llm.holdOn("HOLD-CONTROL");
    try {
      const stream = assay.run(evalRun("HOLD-CONTROL"));
      const { it, runId } = await untilHeld(stream);
      const cancelled = await assay.cancel(runId, { actor: "ts-test", reason: "test" });
      assert.equal(cancelled.runId, runId);
      for (let r = await it.next(); !r.done; r = await it.next()) {
        // Drain to the end.
      }
      assert.equal(stream.completed?.state, pb.RunState.CANCELLED);
      const run = await assay.getRun(runId);
      assert.equal(run.state, pb.RunState.CANCELLED);
      assert.ok(run.auditLog.some((a) => a.actor === "ts-test" && a.action.includes("cancel")));
    } finally {
      llm.releaseAll();
    }
  });

  test("aborting a run's signal stops the stream, and cancels the run only when asked", async () => {
    llm.holdOn("HOLD-ABORT");
    try {
      // cancelRunOnAbort: the gateway cancels the run.
      const controller = new AbortController();
      const stream = assay.run(evalRun("HOLD-ABORT-1"), { signal: controller.signal, cancelRunOnAbort: true });
      const { it, runId } = await untilHeld(stream);
      controller.abort();
      assert.ok(isCanceled(await rejection(it)));
      const end = await assay.watch(runId).result();
      assert.equal(end.state, pb.RunState.CANCELLED);

      // Without it, the run goes on and finishes once the model answers.
      const c2 = new AbortController();
      const s2 = assay.run(evalRun("HOLD-ABORT-2"), { signal: c2.signal });
      const h2 = await untilHeld(s2);
      c2.abort();
      assert.ok(isCanceled(await rejection(h2.it)));
      assert.notEqual((await assay.getRun(h2.runId)).state, pb.RunState.CANCELLED);
      llm.releaseAll();
      const end2 = await assay.watch(h2.runId).result();
      assert.equal(end2.state, pb.RunState.SUCCEEDED);
    } finally {
      llm.releaseAll();
    }
  });

  test("a broken stream is reattached with WatchRun from the last sequence", async () => {
    // A TCP proxy in front of the gateway whose connections the test cuts.
    const gateway = new URL(mesh.target);
    const sockets = new Set<net.Socket>();
    const proxy = net.createServer((client) => {
      const upstream = net.connect(Number(gateway.port), gateway.hostname);
      for (const s of [client, upstream]) {
        sockets.add(s);
        s.on("error", () => undefined);
        s.on("close", () => sockets.delete(s));
      }
      client.pipe(upstream).pipe(client);
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    llm.holdOn("HOLD-BREAK");
    try {
      const port = (proxy.address() as net.AddressInfo).port;
      const viaProxy = new Assay({ target: `http://127.0.0.1:${port}`, token: TOKEN });
      const stream = viaProxy.run(evalRun("HOLD-BREAK"));
      const { it, runId } = await untilHeld(stream);
      const seen: bigint[] = [1n];
      for (const s of sockets) {
        s.destroy();
      }
      llm.releaseAll();
      for (let r = await it.next(); !r.done; r = await it.next()) {
        seen.push(r.value.sequence);
      }
      assert.equal(stream.reattached, 1);
      assert.deepEqual(seen, seen.map((_, i) => BigInt(i + 1)), "every event once, in order");
      assert.equal(stream.completed?.state, pb.RunState.SUCCEEDED);
      assert.equal(stream.runId, runId);
    } finally {
      llm.releaseAll();
      proxy.close();
      for (const s of sockets) {
        s.destroy();
      }
    }
  });

  test("aborting evaluate rejects CANCELLED and drops the model call", async () => {
    llm.holdOn("HOLD-EVAL");
    try {
      const controller = new AbortController();
      const call = assay.evaluate(records("HOLD-EVAL"), { checklist: QUESTIONS, signal: controller.signal });
      const held = await llm.nextHeld();
      controller.abort();
      await assert.rejects(call, (e: unknown) => e instanceof ConnectError && e.code === Code.Canceled);
      await held.closed;
    } finally {
      llm.releaseAll();
    }
  });

  test("compare pairs two evaluations by record id", async () => {
    const a = await assay.evaluate(records("cmp"), { checklist: QUESTIONS });
    const b = await assay.evaluate(records("cmp"), { checklist: QUESTIONS });
    const cmp = await assay.compare(a.runId, b.runId, { metric: "pass_rate", minEffect: 0.1 });
    assert.equal(cmp.baselineRunId, a.runId);
    assert.equal(cmp.candidateRunId, b.runId);
    assert.equal(cmp.metric, pb.CompareMetric.PASS_RATE);
    assert.equal(cmp.paired, true);
    assert.equal(cmp.nPairs, 2);
    assert.equal(cmp.diff, 0);
    assert.equal(cmp.gate?.regressed, false);
  });

  test("a finished run is deleted, and is then not found", async () => {
    const done = await assay.evaluate(records("del"), { checklist: QUESTIONS });
    const deleted = await assay.deleteRun(done.runId);
    assert.equal(deleted.runId, done.runId);
    assert.equal(deleted.state, pb.RunState.SUCCEEDED);
    for (const call of [(id: string) => assay.getRun(id), (id: string) => assay.deleteRun(id)]) {
      const err = await call(done.runId).then(
        () => assert.fail("a deleted run must be NOT_FOUND"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof ConnectError);
      assert.equal(err.code, Code.NotFound);
    }
    const page = await assay.listRuns({ pageSize: 500 });
    assert.ok(page.runs.every((r) => r.runId !== done.runId));
  });

  test("an open run takes 2,500 records in batches of 1,000, sealed, and pages its results", async () => {
    const stream = openRun("open 2500");
    const runId = await stream.started();
    const first = await assay.appendRecords(stream, openRecords(0, 2000), { batchSize: 1000 });
    assert.deepEqual([first.runId, first.appended, first.recordsTotal, first.sealed], [runId, 2000n, 2000n, false]);
    assert.equal((await assay.getRun(runId)).open, true, "the run takes records until sealed");
    const last = await assay.appendRecords(runId, openRecords(2000, 2500), { seal: true, batchSize: 1000 });
    assert.deepEqual([last.appended, last.recordsTotal, last.sealed], [500n, 2500n, true]);

    const done = await stream.result();
    assert.equal(done.state, pb.RunState.SUCCEEDED);
    assert.equal(done.result?.result.case, "checklistEval");
    if (done.result?.result.case === "checklistEval") {
      assert.equal(done.result.result.value.resultsPaged, true);
      assert.equal(done.result.result.value.results.length, 0, "an open run's results are read with ListRunResults");
    }
    const stored = await assay.getRun(runId);
    assert.deepEqual([stored.open, stored.recordsTotal, stored.recordsDone], [false, 2500, 2500]);

    // A client whose ListRunResults calls are counted.
    const spied = new Assay({ target: mesh.target, token: TOKEN, timeoutMs: 60_000 });
    const pages: number[] = [];
    const real = spied.client.listRunResults.bind(spied.client);
    (spied.client as { listRunResults: typeof real }).listRunResults = async (...args: Parameters<typeof real>) => {
      const page = await real(...args);
      pages.push(page.results.length);
      assert.equal(page.recordsTotal, 2500n);
      return page;
    };
    const results = await collect(spied.listRunResults(runId, 1000));
    assert.deepEqual(pages, [1000, 1000, 500]);
    assert.equal(results.length, 2500);
    assert.deepEqual(
      results.map((r) => r.index),
      [...Array(2500).keys()],
    );
    assert.deepEqual(
      results.map((r) => r.recordId),
      [...openRecords(0, 2500)].map((r) => r.id),
    );
    const unscored = results.filter((r) => r.error !== "" || r.score === undefined).map((r) => r.index);
    assert.deepEqual(unscored, [], "every record scored");
    assert.ok(results.every((r) => r.score?.passRate === 1 && r.checklistId !== ""));

    assert.equal(await codeOf(assay.appendRecords(runId, [{ id: "late", input: "Say hello.", target: "Hi." }])), Code.FailedPrecondition);
    assert.equal(await codeOf(assay.appendRecords(runId, [], { seal: true })), Code.FailedPrecondition);
    assert.equal((await assay.getRun(runId)).recordsTotal, 2500);
  });

  test("listRunResults and appendRecords of an unknown run are NOT_FOUND", async () => {
    assert.equal(await codeOf(collect(assay.listRunResults(UNKNOWN_RUN))), Code.NotFound);
    assert.equal(await codeOf(assay.appendRecords(UNKNOWN_RUN, openRecords(0, 3), { seal: true })), Code.NotFound);
  });

  test("listRunResults reads a small run's inline results too; a run not created open takes no records", async () => {
    const stream = assay.run(evalRun("inline"));
    const done = await stream.result();
    assert.equal(done.result?.result.case, "checklistEval");
    const inline = done.result?.result.case === "checklistEval" ? done.result.result.value.results : [];
    assert.equal(inline.length, 2);
    const paged = await collect(assay.listRunResults(stream.runId!, 1));
    assert.deepEqual(
      paged.map((r) => [r.index, r.recordId, r.score?.passRate]),
      inline.map((r) => [r.index, r.recordId, r.score?.passRate]),
    );
    assert.equal(await codeOf(assay.appendRecords(stream, openRecords(0, 1))), Code.FailedPrecondition);
  });

  test("an open run fed from an async iterable; an error of the records rejects as thrown", async () => {
    async function* asyncRecords(n: number) {
      for (const r of openRecords(0, n, "a")) {
        yield r;
      }
    }
    const stream = openRun("open async");
    const appended = await assay.appendRecords(stream, asyncRecords(250), { seal: true, batchSize: 100 });
    assert.deepEqual([appended.appended, appended.recordsTotal, appended.sealed], [250n, 250n, true]);
    const events = await collect(stream);
    assert.equal(events[0]?.event.case, "started", "the event read by started() is still yielded");
    assert.equal(events.at(-1)?.event.case, "completed");
    assert.equal(stream.completed?.state, pb.RunState.SUCCEEDED);
    const results = await collect(assay.listRunResults(stream, 100));
    assert.deepEqual(
      results.map((r) => r.recordId),
      [...openRecords(0, 250, "a")].map((r) => r.id),
    );
    assert.ok(results.every((r) => r.score !== undefined && r.error === ""));

    const broken = openRun("open broken");
    const boom = new Error("the source broke");
    function* failing() {
      yield* openRecords(0, 2, "b");
      throw boom;
    }
    await assert.rejects(assay.appendRecords(broken, failing(), { batchSize: 1 }), (e: unknown) => e === boom);
    await assert.rejects(assay.appendRecords(broken, [], { batchSize: 0 }), RangeError);
    await assay.cancel(await broken.started(), { reason: "test done" });
    assert.equal((await broken.result()).state, pb.RunState.CANCELLED);
  });

  test("pause and resume a run, watched to its end", async () => {
    llm.holdOn("HOLD-PAUSE");
    try {
      const stream = assay.run(evalRun("HOLD-PAUSE"));
      const { runId } = await untilHeld(stream);
      const paused = await assay.pause(runId, { actor: "ts-test" });
      assert.equal(paused.runId, runId);
      assert.equal(paused.state, pb.RunState.PAUSED);
      const resumed = await assay.resume(runId, { actor: "ts-test" });
      assert.equal(resumed.state, pb.RunState.RUNNING);
      llm.releaseAll();
      const end = await assay.watch(runId).result();
      assert.equal(end.state, pb.RunState.SUCCEEDED);
      const actions = (await assay.getRun(runId)).auditLog.map((e) => e.action);
      assert.ok(actions.some((a) => a.includes("pause")) && actions.some((a) => a.includes("resume")), actions.join(","));
    } finally {
      llm.releaseAll();
    }
  });

  test("a refused request carries its field violations", async () => {
    const bad = [
      { input: "Say hello.", target: "Hello." },
      { input: "Say hello.", target: "" },
    ];
    const err = await assay.evaluate(bad, { checklist: QUESTIONS }).then(
      () => assert.fail("an empty target must be refused"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ConnectError);
    assert.equal(err.code, Code.InvalidArgument);
    const fields = fieldViolations(err);
    assert.deepEqual(Object.keys(fields), ["pipeline.records[1].target"]);
    assert.deepEqual((err as ConnectError & { fields: Record<string, string> }).fields, fields);
    assert.deepEqual(fieldViolations(new Error("not a gRPC error")), {});
  });

  test("a semi-auto refinement escalates to a human, who edits a section and accepts", async () => {
    const doc = [
      { id: "intro", title: "Introduction", content: "Autumn is a season." },
      { id: "why", title: "Why leaves fall", content: "Trees drop leaves to save water in winter." },
    ];
    const edited = "Autumn is the season between summer and winter, when leaves turn red and fall.";
    const stream = assay.refine(doc, { mode: "semi_auto", brief: { audience: "children" }, label: "ts human edit" });
    const kinds: string[] = [];
    for await (const ev of stream) {
      kinds.push(ev.event.case ?? "");
      if (ev.event.case === "stateChanged" && ev.event.value.state === pb.RunState.AWAITING_HUMAN) {
        const run = await assay.editSection(ev.runId, "intro", edited, { actor: "editor", reason: "clearer" });
        assert.equal(run.runId, ev.runId);
        await assay.accept(ev.runId, { actor: "editor", reason: "good enough" });
      }
    }
    assert.ok(kinds.includes("refinement"), kinds.join(","));
    assert.equal(kinds.at(-1), "completed");
    const done = await stream.result();
    assert.equal(done.state, pb.RunState.SUCCEEDED);
    assert.equal(done.result?.result.case, "targetedRefinement");
    if (done.result?.result.case === "targetedRefinement") {
      const refined = done.result.result.value;
      assert.equal(refined.outcome, pb.RefinementOutcome.ACCEPTED_MANUAL);
      assert.deepEqual(
        refined.sections.map((s) => [s.id, s.content]),
        [
          ["intro", edited],
          ["why", doc[1]!.content],
        ],
      );
      assert.ok(refined.changedSectionIds.includes("intro"));
      assert.ok(refined.auditLog.some((a) => a.actor === "editor" && a.action === "accept"));
    }
  });

  test("bearer auth: without the token or with a wrong one UNAUTHENTICATED", async () => {
    for (const token of [undefined, "wrong"]) {
      const other = new Assay({ target: mesh.target, token });
      await assert.rejects(other.listRuns(), (e: unknown) => e instanceof ConnectError && e.code === Code.Unauthenticated);
      await assert.rejects(
        other.run(evalRun("auth")).result(),
        (e: unknown) => e instanceof ConnectError && e.code === Code.Unauthenticated,
      );
    }
    const page = await assay.listRuns({ pageSize: 1 });
    assert.equal(page.runs.length, 1);
  });
});

/** A client that counts its reflection calls and can make the server look newer or reflection-less. */
class Probed extends Assay {
  reflections = 0;
  constructor(
    options: ConstructorParameters<typeof Assay>[0],
    private readonly serverIs: "current" | "newer" | "without reflection" = "current",
  ) {
    super(options);
  }

  protected override async serverFiles(options: Parameters<Assay["checkServer"]>[0]): Promise<FileDescriptorProto[]> {
    this.reflections += 1;
    if (this.serverIs === "without reflection") {
      throw new ConnectError("unknown service grpc.reflection.v1.ServerReflection", Code.Unimplemented);
    }
    const files = await super.serverFiles(options ?? {});
    if (this.serverIs === "newer") {
      // What a grown v1 looks like: one more field in Run.
      const gateway = files.find((f) => f.name === "assay/gateway/v1/gateway.proto")!;
      const run = gateway.messageType.find((m) => m.name === "Run")!;
      run.field.push(create(FieldDescriptorProtoSchema, { name: "owner", number: 99, type: FieldDescriptorProto_Type.STRING }));
    }
    return files;
  }
}

describe("the server's protos are checked once per client", () => {
  test("a current server: one check, started by the first call, and no report", async () => {
    const reports: string[][] = [];
    const c = new Probed({ target: mesh.target, token: TOKEN, onServerNewer: (d) => reports.push(d) });
    assert.equal(c.serverCheck, undefined, "nothing is sent before the first call");
    const res = await c.evaluate(records("chk"), { checklist: QUESTIONS });
    await c.getRun(res.runId);
    await c.listRuns({ pageSize: 1 });
    assert.deepEqual(await c.serverCheck, []);
    await c.run(evalRun("chk")).result();
    assert.equal(c.reflections, 1);
    assert.deepEqual(reports, []);
    // The real reflection answer holds the gateway's contract.
    assert.deepEqual(await c.checkServer(), []);
  });

  test("a newer server is reported once across calls; a second client reports again", async () => {
    const reports: string[][] = [];
    const c = new Probed({ target: mesh.target, token: TOKEN, onServerNewer: (d) => reports.push(d) }, "newer");
    const res = await c.evaluate(records("newer"), { checklist: QUESTIONS });
    assert.equal(res.results.length, 2, "the call itself is unaffected");
    await Promise.all([c.listRuns({ pageSize: 1 }), c.getRun(res.runId), c.run(evalRun("newer")).result()]);
    assert.deepEqual(await c.serverCheck, ["field assay.gateway.v1.Run.owner = 99"]);
    await c.listRuns({ pageSize: 1 });
    assert.equal(c.reflections, 1);
    assert.deepEqual(reports, [["field assay.gateway.v1.Run.owner = 99"]]);

    // The default report: one process warning of type ServerNewerWarning.
    const warned: Error[] = [];
    const onWarning = (w: Error) => {
      if (w.name === "ServerNewerWarning") {
        warned.push(w);
      }
    };
    process.on("warning", onWarning);
    try {
      const d = new Probed({ target: mesh.target, token: TOKEN }, "newer");
      await d.listRuns({ pageSize: 1 });
      await d.serverCheck;
      await d.listRuns({ pageSize: 1 });
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
      assert.equal(warned.length, 1);
      assert.match(warned[0]!.message, /newer than this client's: field assay\.gateway\.v1\.Run\.owner = 99/);
      assert.equal((warned[0] as Error & { code?: string }).code, "ASSAY_SERVER_NEWER");
    } finally {
      process.off("warning", onWarning);
    }
  });

  test("checkServer: false makes no automatic check; checkServer() still reports", async () => {
    const reports: string[][] = [];
    const c = new Probed({ target: mesh.target, token: TOKEN, checkServer: false, onServerNewer: (d) => reports.push(d) }, "newer");
    await c.listRuns({ pageSize: 1 });
    await c.evaluate(records("quiet"), { checklist: QUESTIONS });
    assert.equal(c.serverCheck, undefined);
    assert.equal(c.reflections, 0);
    assert.deepEqual(await c.checkServer(), ["field assay.gateway.v1.Run.owner = 99"]);
    assert.deepEqual(reports, [["field assay.gateway.v1.Run.owner = 99"]]);
  });

  test("a server without reflection never fails a call, and is not asked twice", async () => {
    const reports: string[][] = [];
    const c = new Probed({ target: mesh.target, token: TOKEN, onServerNewer: (d) => reports.push(d) }, "without reflection");
    const res = await c.evaluate(records("noreflect"), { checklist: QUESTIONS });
    assert.equal(res.results.length, 2);
    assert.equal(await c.serverCheck, undefined);
    await c.listRuns({ pageSize: 1 });
    assert.equal(c.reflections, 1);
    await assert.rejects(c.checkServer(), (e: unknown) => e instanceof ConnectError && e.code === Code.Unimplemented);
    assert.deepEqual(reports, []);
  });

  test("an unreachable server fails the call, not the check, which is retried a bounded number of times", async () => {
    const closed = net.createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = (closed.address() as net.AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const c = new Probed({ target: `http://127.0.0.1:${port}`, token: TOKEN, timeoutMs: 5_000 });
    for (let i = 0; i < 5; i++) {
      await assert.rejects(c.listRuns(), (e: unknown) => e instanceof ConnectError && e.code === Code.Unavailable);
      await c.serverCheck;
    }
    assert.equal(c.reflections, 3);
  });
});
