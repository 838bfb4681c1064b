//! The run store's contract, run against both implementations: SQLite (in memory and on disk) and
//! PostgreSQL (a real server started on loopback by the test; skipped with a message when none is
//! installed, required when `ASSAY_REQUIRE_POSTGRES=1`). Then what only a shared store does:
//! leases, fenced writes, takeover and controls posted between gateways.

use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_runs::RunStore;
use assay_runs::store::RunWrite;
use assay_testkit::TempPostgres;

fn run(id: &str, created: i64, state: gw::RunState, kind: gw::PipelineKind) -> gw::Run {
    gw::Run {
        run_id: id.into(),
        state: state as i32,
        kind: kind as i32,
        label: format!("label of {id}"),
        created_at: Some(prost_types::Timestamp { seconds: created, nanos: 0 }),
        ..Default::default()
    }
}

fn request(label: &str) -> gw::RunPipelineRequest {
    gw::RunPipelineRequest { open: false, label: label.into(), pipeline: None, budget: None }
}

async fn append(store: &RunStore, event: gw::RunEvent) -> Result<(), assay_domain::StageError> {
    store.write(&event.run_id.clone(), vec![RunWrite::Event(Box::new(event))]).await
}

async fn put(store: &RunStore, run_id: &str, key: &str, value: &[u8]) -> Result<(), assay_domain::StageError> {
    store.write(run_id, vec![RunWrite::Checkpoint { key: key.into(), value: value.to_vec() }]).await
}

async fn update(store: &RunStore, run: gw::Run) -> Result<(), assay_domain::StageError> {
    store.write(&run.run_id.clone(), vec![RunWrite::Summary(Box::new(run))]).await
}

fn event(run_id: &str, sequence: u64) -> gw::RunEvent {
    gw::RunEvent {
        run_id: run_id.into(),
        sequence,
        time: None,
        event: Some(gw::run_event::Event::StateChanged(gw::RunStateChanged {
            state: gw::RunState::Running as i32,
            reason: format!("event {sequence}"),
        })),
    }
}

/// Everything a store of any kind must do.
async fn contract(store: &RunStore) {
    use gw::PipelineKind::{ChecklistEval, GenerateChecklist};
    use gw::RunState::{Running, Succeeded};
    assert!(store.get("nope").await.unwrap().is_none());
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let kind = if i == 1 { GenerateChecklist } else { ChecklistEval };
        store.create(run(id, 100 + i as i64, Running, kind), request(id)).await.unwrap();
    }
    assert_eq!(store.count_by_state().await.unwrap(), vec![(Running as i32, 3)], "runs by state");
    // A second create of the same id is refused, the first kept.
    assert!(store.create(run("a", 1, Running, ChecklistEval), request("dup")).await.is_err());
    let a = store.get("a").await.unwrap().unwrap();
    assert_eq!((a.run.label.as_str(), a.request.label.as_str()), ("label of a", "a"));

    // Events: gap-free appends, read after a sequence, no duplicate sequence.
    for seq in 1..=5 {
        append(store, event("a", seq)).await.unwrap();
    }
    assert!(append(store, event("a", 3)).await.is_err(), "a sequence is written once");
    let after: Vec<u64> = store.events_after("a", 2).await.unwrap().iter().map(|e| e.sequence).collect();
    assert_eq!(after, vec![3, 4, 5]);
    assert!(store.events_after("a", u64::MAX).await.unwrap().is_empty());
    assert!(store.events_after("b", 0).await.unwrap().is_empty());

    // Checkpoints: replaced under a key, listed by prefix in key order (prefixes are literal).
    put(store, "a", "rec/2", b"two").await.unwrap();
    put(store, "a", "rec/1", b"one").await.unwrap();
    put(store, "a", "rec/1", b"uno").await.unwrap();
    put(store, "a", "rec_x", b"other").await.unwrap();
    put(store, "a", "%rec", b"pct").await.unwrap();
    let cps = store.checkpoints("a", "rec/").await.unwrap();
    assert_eq!(cps, vec![("rec/1".to_string(), b"uno".to_vec()), ("rec/2".to_string(), b"two".to_vec())]);
    assert_eq!(store.checkpoints("a", "%").await.unwrap().len(), 1);
    assert_eq!(store.checkpoints("a", "").await.unwrap().len(), 4);
    assert!(store.checkpoints("b", "rec/").await.unwrap().is_empty());

    // Summary updates.
    let mut done = a.run.clone();
    done.state = Succeeded as i32;
    done.records_done = 7;
    update(store, done).await.unwrap();
    let a = store.get("a").await.unwrap().unwrap();
    assert_eq!((a.run.state, a.run.records_done), (Succeeded as i32, 7));

    // Batched writes (the run writer's group commit): applied in order in one transaction, all or
    // none. A later checkpoint of the batch replaces an earlier one of the same key.
    let mut c = store.get("c").await.unwrap().unwrap().run;
    c.records_done = 2;
    let batch = vec![
        RunWrite::Event(Box::new(event("c", 1))),
        RunWrite::Checkpoint { key: "rec/1".into(), value: b"first".to_vec() },
        RunWrite::Event(Box::new(event("c", 2))),
        RunWrite::Checkpoint { key: "rec/1".into(), value: b"second".to_vec() },
        RunWrite::Summary(Box::new(c.clone())),
    ];
    store.write("c", batch).await.unwrap();
    store.write("c", Vec::new()).await.unwrap();
    let seqs = |events: Vec<gw::RunEvent>| events.into_iter().map(|e| e.sequence).collect::<Vec<_>>();
    assert_eq!(seqs(store.events_after("c", 0).await.unwrap()), [1, 2]);
    assert_eq!(store.checkpoints("c", "rec/").await.unwrap(), vec![("rec/1".to_string(), b"second".to_vec())]);
    assert_eq!(store.get("c").await.unwrap().unwrap().run.records_done, 2);
    // A batch with a sequence already stored fails whole: its checkpoint, new event and summary
    // are not kept either.
    c.records_done = 9;
    let bad = vec![
        RunWrite::Checkpoint { key: "rec/2".into(), value: b"lost".to_vec() },
        RunWrite::Event(Box::new(event("c", 3))),
        RunWrite::Event(Box::new(event("c", 2))),
        RunWrite::Summary(Box::new(c.clone())),
    ];
    assert!(store.write("c", bad).await.is_err(), "a sequence is written once, in a batch too");
    assert_eq!(seqs(store.events_after("c", 0).await.unwrap()), [1, 2], "nothing of a failed batch is kept");
    assert_eq!(store.checkpoints("c", "rec/").await.unwrap().len(), 1);
    assert_eq!(store.get("c").await.unwrap().unwrap().run.records_done, 2);

    // Expected states (a control's state check and its audit entry, atomic): the writes apply
    // only while the stored state is one of them, else none does and the error names the state.
    let mut paused = c.clone();
    paused.state = gw::RunState::Paused as i32;
    let control = |expect: gw::RunState, key: &str, run: &gw::Run| {
        vec![
            RunWrite::Expect(vec![expect as i32]),
            RunWrite::Checkpoint { key: key.into(), value: b"audit".to_vec() },
            RunWrite::Summary(Box::new(run.clone())),
        ]
    };
    store.write("c", control(Running, "audit/1", &paused)).await.unwrap();
    assert_eq!(store.get("c").await.unwrap().unwrap().run.state, gw::RunState::Paused as i32);
    let err = store.write("c", control(Running, "audit/2", &paused)).await.unwrap_err();
    assert!(
        matches!(&err, assay_domain::StageError::FailedPrecondition(m) if m.contains("RUN_STATE_PAUSED")),
        "the state found is named: {err:?}"
    );
    let audit: Vec<String> = store.checkpoints("c", "audit/").await.unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(audit, ["audit/1"], "a refused write keeps nothing");
    store.write("c", control(gw::RunState::Paused, "audit/2", &c)).await.unwrap();
    assert_eq!(store.get("c").await.unwrap().unwrap().run.state, Running as i32);
    assert_eq!(store.checkpoints("c", "audit/").await.unwrap().len(), 2);

    // Listing: newest first, filtered by kind and state, paged by cursor.
    let ids = |runs: Vec<gw::Run>| runs.into_iter().map(|r| r.run_id).collect::<Vec<_>>();
    assert_eq!(ids(store.list(0, 0, None, 10).await.unwrap()), ["c", "b", "a"]);
    assert_eq!(ids(store.list(ChecklistEval as i32, 0, None, 10).await.unwrap()), ["c", "a"]);
    assert_eq!(ids(store.list(0, Succeeded as i32, None, 10).await.unwrap()), ["a"]);
    assert_eq!(ids(store.list(0, 0, None, 2).await.unwrap()), ["c", "b"]);
    assert_eq!(ids(store.list(0, 0, Some((101, "b".into())), 10).await.unwrap()), ["a"]);

    // A finished run stored at once (Evaluate) takes its one event.
    store.create(run("e", 99, Succeeded, ChecklistEval), request("e")).await.unwrap();
    append(store, event("e", 1)).await.unwrap();

    // At startup the unfinished runs are this gateway's to resume, oldest first.
    let orphans: Vec<String> = store.claim_orphans(true).await.unwrap().into_iter().map(|s| s.run.run_id).collect();
    assert_eq!(orphans, ["b", "c"]);

    records_as_rows(store).await;
    deletion(store).await;
}

fn rows(ids: &[&str]) -> Vec<assay_runs::store::NewRecord> {
    ids.iter()
        .map(|id| assay_runs::store::NewRecord { id: (*id).into(), record: format!("body of {id}").into_bytes() })
        .collect()
}

/// Open runs' records as rows: appended in order, atomically, ids unique, sealed once; read a
/// page at a time; checkpoints read by key and by page; deleted with the run.
async fn records_as_rows(store: &RunStore) {
    use assay_domain::StageError;
    use gw::PipelineKind::ChecklistEval;
    use gw::RunState::{Cancelled, Running};
    let open = gw::RunPipelineRequest { open: true, ..request("open") };
    store.create(run("open", 200, Running, ChecklistEval), open).await.unwrap();
    let empty = store.records("open", 0, 10).await.unwrap();
    assert_eq!((empty.records.len(), empty.total, empty.sealed), (0, 0, false));
    let a = store.append_records("open", rows(&["x", "y", ""]), false, 10).await.unwrap();
    assert_eq!((a.first, a.total, a.sealed), (0, 3, false));
    // A duplicate id (with one already held, or earlier in the call): nothing of the call is kept.
    match store.append_records("open", rows(&["z", "y"]), false, 10).await {
        Err(StageError::InvalidArgument(v)) => {
            assert_eq!(v[0].field, "records[1].id");
            assert!(v[0].description.contains("\"y\""), "{v:?}");
        }
        other => panic!("a duplicate id is refused: {other:?}"),
    }
    // Empty ids are not ids (the index stands in): several are fine.
    let b = store.append_records("open", rows(&["z", ""]), false, 10).await.unwrap();
    assert_eq!((b.first, b.total), (3, 5));
    match store.append_records("open", rows(&["1", "2", "3", "4", "5", "6"]), false, 10).await {
        Err(StageError::InvalidArgument(v)) => {
            assert_eq!(v[0].field, "records");
            assert!(v[0].description.contains("11") && v[0].description.contains("limit is 10"), "{v:?}");
        }
        other => panic!("past the run's ceiling: {other:?}"),
    }
    let page = store.records("open", 1, 3).await.unwrap();
    let got: Vec<(u64, String)> =
        page.records.iter().map(|(i, b)| (*i, String::from_utf8(b.clone()).unwrap())).collect();
    assert_eq!(got, [(1, "body of y".into()), (2, "body of ".into()), (3, "body of z".into())]);
    assert_eq!((page.total, page.sealed), (5, false));
    let sealed = store.append_records("open", rows(&["w"]), true, 10).await.unwrap();
    assert_eq!((sealed.first, sealed.total, sealed.sealed), (5, 6, true));
    assert!(store.records("open", 0, 100).await.unwrap().sealed);
    match store.append_records("open", rows(&["v"]), false, 10).await {
        Err(StageError::FailedPrecondition(m)) => assert!(m.contains("sealed"), "{m}"),
        other => panic!("a sealed run takes no more: {other:?}"),
    }
    match store.append_records("a", rows(&["v"]), false, 10).await {
        Err(StageError::FailedPrecondition(m)) => assert!(m.contains("not created open"), "{m}"),
        other => panic!("a run not created open takes no records: {other:?}"),
    }
    assert!(matches!(store.append_records("nope", rows(&["v"]), false, 10).await, Err(StageError::NotFound(_))));
    assert!(matches!(store.records("a", 0, 10).await, Err(StageError::NotFound(_))));
    // Checkpoints by key and a page at a time.
    for i in [0u32, 1, 2, 10, 11] {
        put(store, "open", &format!("record:{i:08}"), &i.to_le_bytes()).await.unwrap();
    }
    put(store, "open", "checklist:k", b"c").await.unwrap();
    put(store, "open", "recorded", b"not a result").await.unwrap();
    let keys = |page: Vec<(String, Vec<u8>)>| page.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(
        keys(store.checkpoints_page("open", "record:", "", 3).await.unwrap()),
        ["record:00000000", "record:00000001", "record:00000002"]
    );
    assert_eq!(
        keys(store.checkpoints_page("open", "record:", "record:00000002", 3).await.unwrap()),
        ["record:00000010", "record:00000011"]
    );
    assert!(store.checkpoints_page("open", "record:", "record:00000011", 3).await.unwrap().is_empty());
    let got = store.checkpoints_get("open", vec!["checklist:k".into(), "checklist:none".into()]).await.unwrap();
    assert_eq!(got, [("checklist:k".to_string(), b"c".to_vec())]);
    // Ended: no more records; deleted: its rows go with it.
    let mut ended = run("open", 200, Cancelled, ChecklistEval);
    ended.label = "label of open".into();
    update(store, ended).await.unwrap();
    store
        .create(run("open2", 201, Running, ChecklistEval), gw::RunPipelineRequest { open: true, ..request("o") })
        .await
        .unwrap();
    update(store, run("open2", 201, Cancelled, ChecklistEval)).await.unwrap();
    match store.append_records("open2", rows(&["v"]), false, 10).await {
        Err(StageError::FailedPrecondition(m)) => assert!(m.contains("CANCELLED"), "{m}"),
        other => panic!("an ended run takes no records: {other:?}"),
    }
    store.delete("open").await.unwrap();
    store.delete("open2").await.unwrap();
    assert!(matches!(store.records("open", 0, 10).await, Err(StageError::NotFound(_))));
    assert!(store.checkpoints_page("open", "record:", "", 10).await.unwrap().is_empty());
}

/// Deleting: finished runs only, with their events; listed by age for the retention sweep.
async fn deletion(store: &RunStore) {
    use assay_domain::StageError;
    use gw::PipelineKind::ChecklistEval;
    use gw::RunState::{Cancelled, Running, Succeeded};
    assert!(matches!(store.delete("nope").await, Err(StageError::NotFound(m)) if m == "run nope"));
    match store.delete("b").await {
        Err(StageError::FailedPrecondition(m)) => assert_eq!(m, "run b is RUN_STATE_RUNNING"),
        other => panic!("an unfinished run is not deleted: {other:?}"),
    }
    assert!(store.get("b").await.unwrap().is_some());
    // Finished runs by age, oldest first, before the cutoff only, running ones never.
    store.create(run("old", 10, Cancelled, ChecklistEval), request("old")).await.unwrap();
    store.create(run("older-running", 5, Running, ChecklistEval), request("x")).await.unwrap();
    assert_eq!(store.finished_before(100, 10).await.unwrap(), ["old", "e"]);
    assert_eq!(store.finished_before(100, 1).await.unwrap(), ["old"]);
    assert_eq!(store.finished_before(99, 10).await.unwrap(), ["old"]);
    assert!(store.finished_before(10, 10).await.unwrap().is_empty());
    // The run goes with its events; its summary is returned as it was.
    let deleted = store.delete("e").await.unwrap();
    assert_eq!((deleted.run_id.as_str(), deleted.label.as_str()), ("e", "label of e"));
    assert_eq!(deleted.state, Succeeded as i32);
    assert!(store.get("e").await.unwrap().is_none());
    assert!(store.events_after("e", 0).await.unwrap().is_empty());
    assert!(matches!(store.delete("e").await, Err(StageError::NotFound(_))), "deleted once");
    assert_eq!(store.finished_before(100, 10).await.unwrap(), ["old"]);
    // Other runs keep what they had.
    assert_eq!(store.events_after("a", 0).await.unwrap().len(), 5);
    assert!(store.hold_store_lease("retention", 60.0).await.unwrap(), "the only gateway holds the sweep lease");
    assert!(store.hold_store_lease("retention", 60.0).await.unwrap(), "and keeps it");
}

#[tokio::test]
async fn sqlite_in_memory_keeps_the_contract() {
    let store = RunStore::open(":memory:").unwrap();
    assert!(!store.shared());
    contract(&store).await;
    assert!(store.claim_orphans(false).await.unwrap().is_empty(), "one gateway: nothing to take over later");
    assert!(store.renew(&["b".into()]).await.unwrap().is_empty());
}

/// A SQLite file is one gateway's: while another process holds it (here `flock`, as a gateway
/// holds `<file>.lock`), opening it as a gateway is refused, naming the file and PostgreSQL for
/// several gateways; reading beside it is allowed; once the other lets go, it opens. Within one
/// process the lock is shared (a gateway restarted in place).
#[tokio::test]
async fn a_second_gateway_on_a_live_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let path = path.to_str().unwrap();
    let lock = format!("{path}.lock");
    let mut other = std::process::Command::new("flock")
        .args(["--no-fork", "--exclusive", &lock, "sleep", "60"])
        .spawn()
        .expect("flock (util-linux) holds the file as another process");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let e = loop {
        match RunStore::open(path) {
            Err(e) => break e,
            Ok(store) => {
                drop(store);
                assert!(std::time::Instant::now() < deadline, "the other process never took the lock");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    let message = e.to_string();
    assert!(matches!(e, assay_domain::StageError::FailedPrecondition(_)), "{e:?}");
    assert!(message.contains(path) && message.contains("in use by another gateway"), "{message}");
    assert!(message.contains("postgres://") && message.contains("gateway.store"), "{message}");
    let reader = RunStore::open_unlocked(path).unwrap();
    assert!(reader.get("none").await.unwrap().is_none());
    other.kill().unwrap();
    other.wait().unwrap();
    let first = RunStore::open(path).expect("the file is free once the other process let go");
    let again = RunStore::open(path).expect("the same process opens it again (a restart in place)");
    drop((first, again));
}

#[tokio::test]
async fn sqlite_file_keeps_the_contract_across_reopening() {
    let dir = std::env::temp_dir().join(format!("assay-store-test-{}", std::process::id()));
    let path = dir.join("nested/runs.db");
    let path = path.to_str().unwrap();
    contract(&RunStore::open(path).unwrap()).await;
    let again = RunStore::open(path).unwrap();
    assert_eq!(again.events_after("a", 0).await.unwrap().len(), 5);
    let _ = std::fs::remove_dir_all(dir);
}

/// What SQLite's pages are: (page_count, freelist_count), read through a second connection.
fn pages(path: &str) -> (i64, i64) {
    let c = rusqlite::Connection::open(path).unwrap();
    let count = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    let free = c.query_row("PRAGMA freelist_count", [], |r| r.get(0)).unwrap();
    (count, free)
}

async fn fill(store: &RunStore, runs: usize) {
    use gw::PipelineKind::ChecklistEval;
    let big = "x".repeat(4096);
    for i in 0..runs {
        let id = format!("r{i}");
        store.create(run(&id, 1000 + i as i64, gw::RunState::Succeeded, ChecklistEval), request(&id)).await.unwrap();
        let mut e = event(&id, 1);
        e.event = Some(gw::run_event::Event::StateChanged(gw::RunStateChanged { state: 5, reason: big.clone() }));
        append(store, e).await.unwrap();
    }
}

#[tokio::test]
async fn sqlite_gives_the_space_of_deleted_runs_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let path = path.to_str().unwrap();
    let store = RunStore::open(path).unwrap();
    fill(&store, 200).await;
    let (full, _) = pages(path);
    for i in 0..200 {
        store.delete(&format!("r{i}")).await.unwrap();
    }
    let (after, free) = pages(path);
    assert_eq!(free, 0, "freed pages go back to the file system, not to a free list");
    assert!(after * 10 < full, "{full} pages with 200 runs, {after} after deleting them");
}

#[tokio::test]
async fn a_sqlite_file_made_before_incremental_vacuum_is_converted_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let path = path.to_str().unwrap();
    // A file as an older gateway left it: no auto_vacuum.
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch("CREATE TABLE runs (run_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, state INTEGER NOT NULL, kind INTEGER NOT NULL, run BLOB NOT NULL, request BLOB NOT NULL)").unwrap();
    assert_eq!(c.query_row("PRAGMA auto_vacuum", [], |r| r.get::<_, i64>(0)).unwrap(), 0);
    drop(c);
    let store = RunStore::open(path).unwrap();
    let c = rusqlite::Connection::open(path).unwrap();
    assert_eq!(c.query_row("PRAGMA auto_vacuum", [], |r| r.get::<_, i64>(0)).unwrap(), 2, "incremental");
    fill(&store, 100).await;
    let (full, _) = pages(path);
    for i in 0..100 {
        store.delete(&format!("r{i}")).await.unwrap();
    }
    let (after, free) = pages(path);
    assert!(free == 0 && after * 5 < full, "{full} pages before, {after} after ({free} free)");
}

#[tokio::test]
async fn postgres_keeps_the_contract() {
    let Some(pg) = TempPostgres::start_or_skip("postgres_keeps_the_contract") else { return };
    let store = RunStore::connect(&pg.url(), "gw-a", Duration::from_secs(30)).await.unwrap();
    assert!(store.shared());
    assert!(store.describe().contains("gateway gw-a"), "{}", store.describe());
    contract(&store).await;
    // Reconnecting migrates nothing twice and sees the same data.
    let again = RunStore::connect(&pg.url(), "gw-a", Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.events_after("a", 0).await.unwrap().len(), 5);
}

#[tokio::test]
async fn postgres_leases_fence_writes_and_orphans_are_taken_over() {
    let Some(pg) = TempPostgres::start_or_skip("postgres_leases") else { return };
    let url = pg.url();
    let lease = Duration::from_secs(1);
    let a = RunStore::connect(&url, "gw-a", lease).await.unwrap();
    let b = RunStore::connect(&url, "gw-b", lease).await.unwrap();
    a.create(run("r1", 1, gw::RunState::Running, gw::PipelineKind::ChecklistEval), request("r1")).await.unwrap();
    append(&a, event("r1", 1)).await.unwrap();

    // Held by A: B takes nothing, and B's writes to A's run are refused.
    assert!(b.claim_orphans(false).await.unwrap().is_empty());
    assert!(b.claim_orphans(true).await.unwrap().is_empty(), "startup takes only its own name's runs");
    let e = append(&b, event("r1", 2)).await.unwrap_err().to_string();
    assert!(e.contains("no longer holds its lease"), "{e}");
    assert!(put(&b, "r1", "k", &[1]).await.is_err());
    let fenced =
        vec![RunWrite::Checkpoint { key: "k".into(), value: vec![1] }, RunWrite::Event(Box::new(event("r1", 2)))];
    let e = b.write("r1", fenced.clone()).await.unwrap_err().to_string();
    assert!(e.contains("no longer holds its lease"), "a batch is fenced too: {e}");
    assert!(a.checkpoints("r1", "k").await.unwrap().is_empty(), "nothing of a fenced batch is kept");
    a.write("r1", vec![RunWrite::Checkpoint { key: "k".into(), value: vec![7] }]).await.unwrap();
    assert_eq!(a.renew(&["r1".into()]).await.unwrap(), Vec::<String>::new(), "A renews its lease");

    // A stops renewing: once the lease expires B takes the run over, and A is fenced off.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let taken = loop {
        let taken = b.claim_orphans(false).await.unwrap();
        if !taken.is_empty() || std::time::Instant::now() > deadline {
            break taken;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(taken.len(), 1, "B takes the run over after the lease expires");
    assert_eq!(taken[0].run.run_id, "r1");
    assert_eq!(a.renew(&["r1".into()]).await.unwrap(), vec!["r1".to_string()], "A learns it lost the run");
    assert!(append(&a, event("r1", 2)).await.unwrap_err().to_string().contains("no longer holds its lease"));
    let mut summary = taken[0].run.clone();
    summary.records_done = 1;
    assert!(update(&a, summary.clone()).await.is_err());
    append(&b, event("r1", 2)).await.unwrap();
    update(&b, summary).await.unwrap();
    assert_eq!(b.events_after("r1", 0).await.unwrap().len(), 2);

    // A released lease (graceful shutdown) is taken at once; a startup takes back its own runs.
    b.release("r1").await.unwrap();
    assert_eq!(a.claim_orphans(false).await.unwrap().len(), 1, "released: taken without waiting");
    let a2 = RunStore::connect(&url, "gw-a", Duration::from_secs(30)).await.unwrap();
    assert_eq!(a2.claim_orphans(true).await.unwrap().len(), 1, "a restart under the same name takes it back");
    assert!(b.claim_orphans(false).await.unwrap().is_empty());

    // Controls posted by another gateway reach the owner's run only, in order, once.
    let id1 = b
        .post_control(gw::ControlRunRequest { run_id: "r1".into(), actor: "x".into(), ..Default::default() })
        .await
        .unwrap();
    let id2 = b
        .post_control(gw::ControlRunRequest { run_id: "r1".into(), actor: "y".into(), ..Default::default() })
        .await
        .unwrap();
    let posted = a2.posted_controls(&["r1".into(), "other".into()]).await.unwrap();
    assert_eq!(posted.iter().map(|p| (p.id, p.request.actor.as_str())).collect::<Vec<_>>(), [(id1, "x"), (id2, "y")]);
    use assay_runs::store::{ControlOutcome, ControlRefusal};
    assert_eq!(b.control_outcome(id1).await.unwrap(), ControlOutcome::Pending);
    a2.remove_control(id1).await.unwrap();
    assert_eq!(b.control_outcome(id1).await.unwrap(), ControlOutcome::Taken, "taken: its row is gone");
    assert!(a2.posted_controls(&[]).await.unwrap().is_empty());
    // A refused control stays, with the refusal, for its poster; the owner does not see it again.
    let refusal = ControlRefusal { code: 9, message: "not while awaiting a human".into(), details: vec![1, 2, 3] };
    a2.refuse_control(id2, refusal.clone()).await.unwrap();
    assert!(a2.posted_controls(&["r1".into()]).await.unwrap().is_empty(), "a refused control is not taken again");
    assert_eq!(b.control_outcome(id2).await.unwrap(), ControlOutcome::Refused(refusal));
    b.remove_control(id2).await.unwrap();
    assert_eq!(b.control_outcome(id2).await.unwrap(), ControlOutcome::Taken);
}

#[tokio::test]
async fn postgres_store_leases_go_to_one_gateway_at_a_time() {
    let Some(pg) = TempPostgres::start_or_skip("postgres_store_leases_go_to_one_gateway_at_a_time") else { return };
    let a = RunStore::connect(&pg.url(), "gw-a", Duration::from_secs(30)).await.unwrap();
    let b = RunStore::connect(&pg.url(), "gw-b", Duration::from_secs(30)).await.unwrap();
    assert!(a.hold_store_lease("retention", 1.0).await.unwrap());
    assert!(!b.hold_store_lease("retention", 1.0).await.unwrap(), "held by gw-a");
    assert!(b.hold_store_lease("other chore", 60.0).await.unwrap(), "leases are per name");
    assert!(a.hold_store_lease("retention", 1.0).await.unwrap(), "gw-a extends its own");
    // Once gw-a stops extending it, the lease passes to gw-b when it expires.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !b.hold_store_lease("retention", 60.0).await.unwrap() {
        assert!(std::time::Instant::now() < deadline, "gw-b never took the expired lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!a.hold_store_lease("retention", 60.0).await.unwrap(), "now gw-b's");
    // Deleting a finished run takes the controls still posted for it.
    use gw::PipelineKind::ChecklistEval;
    a.create(run("p", 1, gw::RunState::Running, ChecklistEval), request("p")).await.unwrap();
    let posted = gw::ControlRunRequest { run_id: "p".into(), ..Default::default() };
    b.post_control(posted).await.unwrap();
    update(&a, run("p", 1, gw::RunState::Cancelled, ChecklistEval)).await.unwrap();
    b.delete("p").await.unwrap();
    assert!(a.posted_controls(&["p".into()]).await.unwrap().is_empty());
    assert!(a.get("p").await.unwrap().is_none());
}

#[tokio::test]
async fn a_bad_postgres_url_is_a_clear_error_without_the_password() {
    let e = RunStore::connect("postgres://u:hunter2@127.0.0.1:1/db", "", Duration::from_secs(5))
        .await
        .err()
        .expect("nothing listens on port 1")
        .to_string();
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.contains("u:redacted@127.0.0.1:1/db") && e.contains("connect"), "{e}");
}

/// A spread run's chunks on PostgreSQL: gateways claiming together take different chunks; a
/// claim's results are stored only while it holds its chunk, and never replace a stored one; an
/// expired claim is taken over; the run is finished once sealed and every chunk is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_spread_runs_claim_chunks_once_and_store_results_once() {
    use assay_runs::store::{ChunkCommit, Claim};
    use gw::PipelineKind::ChecklistEval;
    use gw::RunState::Running;
    let Some(pg) = TempPostgres::start_or_skip("postgres_spread_runs") else { return };
    let url = pg.url();
    let a = RunStore::connect(&url, "gw-a", Duration::from_secs(1)).await.unwrap();
    let b = RunStore::connect(&url, "gw-b", Duration::from_secs(30)).await.unwrap();
    a.create(run("s", 300, Running, ChecklistEval), gw::RunPipelineRequest { open: true, ..request("s") })
        .await
        .unwrap();
    a.spread("s").await.unwrap();
    let ids: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    a.append_records("s", rows(&refs), false, 100).await.unwrap();
    assert_eq!(b.runs_to_help(10).await.unwrap(), ["s"], "B sees a run it can help with");
    assert!(a.runs_to_help(10).await.unwrap().is_empty(), "not the run's own executor");

    // Claims made at once take distinct chunks of 4 and then the rest (2).
    let (x, y, z) = tokio::join!(a.claim_chunk("s", "ta", 4), b.claim_chunk("s", "tb", 4), b.claim_chunk("s", "tc", 4));
    let mut got: Vec<(u64, u32)> = [x, y, z]
        .into_iter()
        .map(|c| match c.unwrap() {
            Claim::Chunk(c) => (c.first, c.count),
            other @ (Claim::Wait | Claim::Finished) => panic!("a chunk: {other:?}"),
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, [(0, 4), (4, 4), (8, 2)]);
    // Unsealed with every record claimed: wait.
    assert_eq!(b.claim_chunk("s", "td", 4).await.unwrap(), Claim::Wait);
    let chunks = a.chunks("s", 0).await.unwrap();
    let token_of = |first: u64| chunks.iter().find(|c| c.first == first).unwrap().token.clone();
    let a_first = chunks.iter().find(|c| c.owner == "gw-a").unwrap().first;
    assert_eq!(token_of(a_first), "ta");

    // B stores results of its chunk; a second write under a stored key keeps the first.
    let b_first = chunks.iter().find(|c| c.owner == "gw-b").unwrap().first;
    let b_token = token_of(b_first);
    let result = |tag: &str| (Some(b_first), format!("record:{b_first:08}"), tag.as_bytes().to_vec());
    let lost = b
        .commit_chunks("s", &b_token, ChunkCommit { checkpoints: vec![result("first")], ..Default::default() })
        .await
        .unwrap();
    assert!(lost.is_empty());
    b.commit_chunks("s", &b_token, ChunkCommit { checkpoints: vec![result("second")], ..Default::default() })
        .await
        .unwrap();
    let stored = a.checkpoints_get("s", vec![format!("record:{b_first:08}")]).await.unwrap();
    assert_eq!(stored[0].1, b"first", "a stored result is never replaced");

    // A's claim expires (a 1 s lease): B takes the chunk over; A's later writes are dropped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    match b.claim_chunk("s", "te", 4).await.unwrap() {
        Claim::Chunk(c) => assert_eq!((c.first, c.takeover), (a_first, true)),
        other @ (Claim::Wait | Claim::Finished) => panic!("the expired chunk: {other:?}"),
    }
    let late = (Some(a_first), format!("record:{a_first:08}"), b"late".to_vec());
    let lost = a
        .commit_chunks("s", "ta", ChunkCommit { checkpoints: vec![late], done: vec![a_first], ..Default::default() })
        .await
        .unwrap();
    assert_eq!(lost, [a_first], "A lost its chunk");
    assert!(a.checkpoints_get("s", vec![format!("record:{a_first:08}")]).await.unwrap().is_empty());
    let chunks = a.chunks("s", 0).await.unwrap();
    let taken = chunks.iter().find(|c| c.first == a_first).unwrap();
    assert_eq!((taken.owner.as_str(), taken.claims, taken.done), ("gw-b", 2, false));

    // Sealed, every chunk done (a claim's spend so far kept under its key, replaced by each
    // commit): finished.
    a.append_records("s", Vec::new(), true, 100).await.unwrap();
    b.commit_chunks("s", "tb", ChunkCommit { usage: Some(("spent:tb".into(), vec![9])), ..Default::default() })
        .await
        .unwrap();
    for c in &chunks {
        let usage = (c.first == b_first).then(|| ("spent:tb".to_string(), vec![1, 2, 3]));
        let lost = b
            .commit_chunks("s", &c.token, ChunkCommit { done: vec![c.first], usage, ..Default::default() })
            .await
            .unwrap();
        assert!(lost.is_empty(), "chunk {} of {}", c.first, c.owner);
    }
    assert_eq!(a.claim_chunk("s", "tf", 4).await.unwrap(), Claim::Finished);
    assert!(b.runs_to_help(10).await.unwrap().is_empty());
    let done = a.chunks("s", 0).await.unwrap();
    assert!(done.iter().all(|c| c.done));
    let spent = a.checkpoints_get("s", vec!["spent:tb".into()]).await.unwrap();
    assert_eq!(spent, [("spent:tb".to_string(), vec![1u8, 2, 3])], "the last commit's spend replaced the first's");
}
