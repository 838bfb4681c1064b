//! One open run spread over two gateways sharing a real PostgreSQL store (started on loopback):
//! both claim chunks of its records (`records_claimed` events, each gateway's share in GetRun),
//! one of them is killed with SIGKILL mid-run, and the run finishes on the other with every
//! record scored once, in order, its aggregates those of its results.
//!
//! Needs the workspace's `assay` binary (`assay serve gateway`, `assay serve scorer`).

use std::collections::BTreeMap;
use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::{ScriptedLlm, TempPostgres};
use assay_tests::{all_results, leaves_eval, leaves_judge, serve, start_open_run, watch_all};
use tokio::process::Child;
use tonic::transport::Channel;

type Client = GatewayServiceClient<Channel>;

const RECORDS: usize = 6000;

async fn scorer(llm: &ScriptedLlm) -> (Child, String) {
    serve(
        "scorer",
        &[
            ("ASSAY__PORTS__SCORER", "0".into()),
            ("ASSAY__MODELS__DEFAULT__BACKEND", "openai".into()),
            ("OPENAI_BASE_URL", llm.base_url()),
            ("OPENAI_API_KEY", "spread".into()),
            ("OPENAI_MODEL", "scripted".into()),
            ("ASSAY__CACHE__ENABLED", "false".into()),
        ],
    )
    .await
}

async fn gateway(store: &str, name: &str, scorer: &str) -> (Child, Client) {
    let (child, url) = serve(
        "gateway",
        &[
            ("ASSAY__PORTS__GATEWAY", "0".into()),
            ("ASSAY__GATEWAY__STORE", store.into()),
            ("ASSAY__GATEWAY__INSTANCE_ID", name.into()),
            ("ASSAY__GATEWAY__LEASE_SECONDS", "2".into()),
            ("ASSAY__GATEWAY__CONCURRENCY", "8".into()),
            ("ASSAY__UPSTREAMS__SCORER", scorer.into()),
        ],
    )
    .await;
    let channel = Channel::from_shared(url).unwrap().connect().await.expect("connect to the gateway");
    (child, GatewayServiceClient::new(channel))
}

fn records(range: std::ops::Range<usize>) -> Vec<gw::EvalRecord> {
    range
        .map(|i| gw::EvalRecord {
            id: format!("r{i}"),
            target: if i % 3 == 0 { format!("leaves {i}") } else { format!("stones {i}") },
            ..Default::default()
        })
        .collect()
}

async fn get(client: &mut Client, run_id: &str) -> gw::Run {
    client.get_run(gw::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap()
}

/// Each gateway's (claimed, done) records of the run, as GetRun says.
fn shares(run: &gw::Run) -> BTreeMap<String, (u64, u64)> {
    run.gateways.iter().map(|g| (g.gateway.clone(), (g.records_claimed, g.records_done))).collect()
}

/// An open run of RECORDS records started on gateway A, helped by B; once both have finished
/// chunks and `victim` holds an unfinished one, `victim` is killed. The survivor ends the run.
async fn spread_and_kill(kill_executor: bool) {
    let test = if kill_executor { "spread_run_executor_killed" } else { "spread_run_helper_killed" };
    let Some(pg) = TempPostgres::start_or_skip(test) else { return };
    let store = pg.url();
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::from_millis(20)));
    let (_scorer, scorer_url) = scorer(&llm).await;
    let (mut a, mut client_a) = gateway(&store, "gw-a", &scorer_url).await;
    let (mut b, mut client_b) = gateway(&store, "gw-b", &scorer_url).await;

    let (run_id, events) = start_open_run(&mut client_a, leaves_eval(0), "spread", None).await;
    drop(events);
    let messages = (0..RECORDS).step_by(2000).map(|s| gw::AppendRecordsRequest {
        run_id: run_id.clone(),
        records: records(s..s + 2000),
        seal: s + 2000 >= RECORDS,
    });
    let reply =
        client_a.append_records(futures::stream::iter(messages.collect::<Vec<_>>())).await.unwrap().into_inner();
    assert_eq!((reply.records_total, reply.sealed), (RECORDS as u64, true));

    // Both gateways work on the run: each has finished a chunk, and the victim holds one.
    let victim_name = if kill_executor { "gw-a" } else { "gw-b" };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let before_kill = loop {
        let run = get(&mut client_a, &run_id).await;
        let s = shares(&run);
        let both = ["gw-a", "gw-b"].iter().all(|g| s.get(*g).is_some_and(|(_, done)| *done > 0));
        let holds = s.get(victim_name).is_some_and(|(claimed, done)| claimed > done);
        if both && holds {
            break s;
        }
        assert!(run.state == gw::RunState::Running as i32, "the run ended before both gateways worked on it: {s:?}");
        assert!(tokio::time::Instant::now() < deadline, "both gateways never worked on the run: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (victim, survivor) = if kill_executor { (&mut a, &mut client_b) } else { (&mut b, &mut client_a) };
    victim.start_kill().expect("SIGKILL");
    victim.wait().await.expect("reaped");
    let served_at_kill = llm.request_count();
    assert!(served_at_kill < RECORDS, "killed before the end ({served_at_kill} of {RECORDS} served)");

    // The survivor finishes the run (taking it over when the executor died).
    let all = watch_all(survivor, &run_id).await;
    let run = get(survivor, &run_id).await;
    assert_eq!(run.state, gw::RunState::Succeeded as i32, "{:?}", run.result);
    assert_eq!((run.records_total, run.records_done), (RECORDS as u32, RECORDS as u32));

    // One result per record, in order, each scored.
    let (results, _) = all_results(survivor, &run_id, 5000).await;
    let ids: Vec<String> = results.iter().map(|r| r.record_id.clone()).collect();
    assert_eq!(ids, (0..RECORDS).map(|i| format!("r{i}")).collect::<Vec<_>>(), "one result per record, in order");
    for r in &results {
        let score = r.score.as_ref().unwrap_or_else(|| panic!("record {} failed: {}", r.record_id, r.error));
        assert_eq!(score.item_scores.len(), 2, "record {}", r.record_id);
        assert!(score.item_scores.iter().all(|i| i.answer == pb_yes()), "record {}", r.record_id);
    }

    // Every record asked about; asked again only what the victim had in flight or had not
    // stored yet (its unfinished chunk, at most).
    let served = llm.request_count();
    assert!(served >= RECORDS, "{served} calls for {RECORDS} records");
    assert!(served - RECORDS <= 1024, "{} calls made again after the kill", served - RECORDS);

    // Every claim is an event; both gateways claimed, and the victim's unfinished chunk was
    // taken over by a new claim.
    let claims: Vec<&gw::RecordsClaimed> = all
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::RecordsClaimed(c)) => Some(c),
            _ => None,
        })
        .collect();
    for g in ["gw-a", "gw-b"] {
        assert!(claims.iter().any(|c| c.gateway == g), "no claim by {g}");
    }
    assert!(claims.iter().any(|c| c.takeover), "the victim's chunk was taken over");
    // Each claim is said once: one first claim per chunk, and a takeover only for a claim that
    // was taken over (before, a resumed executor announced every chunk it found again, without
    // `takeover`: 17 events for 10 chunks).
    let mut firsts: BTreeMap<u64, usize> = BTreeMap::new();
    for c in claims.iter().filter(|c| !c.takeover) {
        *firsts.entry(c.first).or_default() += 1;
    }
    assert!(firsts.values().all(|n| *n == 1), "a chunk's first claim said more than once: {firsts:?}");
    let takeovers = claims.iter().filter(|c| c.takeover).count();
    assert!(takeovers <= 2 * 2, "{takeovers} takeovers announced for one killed gateway's chunks");
    // The chunks cover every record once.
    let chunks: BTreeMap<u64, u32> = claims.iter().map(|c| (c.first, c.count)).collect();
    let mut next = 0u64;
    for (first, count) in &chunks {
        assert_eq!(*first, next, "chunks {chunks:?}");
        next += u64::from(*count);
    }
    assert_eq!(next, RECORDS as u64, "chunks {chunks:?}");
    // Every record is said once: a killed executor's last events (queued, not written) are said
    // by the one that takes over, from the stored results, and nothing is said twice (before,
    // 8,423 of 10,000 records had an event after an executor was killed).
    let mut said = vec![0u32; RECORDS];
    for e in &all {
        if let Some(Event::RecordScored(r)) = &e.event {
            said[r.index as usize] += 1;
        }
    }
    let unsaid = said.iter().filter(|n| **n == 0).count();
    let twice = said.iter().filter(|n| **n > 1).count();
    assert_eq!((unsaid, twice), (0, 0), "records without a record_scored event, and said twice");

    // Each gateway's share: everything done, and no less than before the kill.
    let after = shares(&run);
    assert_eq!(after.values().map(|(_, done)| done).sum::<u64>(), RECORDS as u64, "{after:?}");
    assert!(after["gw-a"].1 > 0 && after["gw-b"].1 > 0, "{after:?}");
    assert!(before_kill[victim_name].1 <= after[victim_name].1, "{before_kill:?} then {after:?}");

    // The aggregates are those of the stored results.
    let Some(gw::run_result::Result::ChecklistEval(eval)) = run.result.and_then(|r| r.result) else {
        panic!("no evaluation")
    };
    let agg = eval.aggregate.unwrap();
    assert_eq!(agg.targets, RECORDS as u32);
    let mean = results.iter().map(|r| r.score.as_ref().unwrap().primary_score).sum::<f64>() / RECORDS as f64;
    assert!((agg.mean_primary_score - mean).abs() < 1e-12, "{} vs {mean}", agg.mean_primary_score);
    // Every call served is in the run's usage but what the victim spent since its last commit
    // (a commit at least every 500 ms, or with each batch of results) and had in flight.
    let counted = eval.usage.unwrap().calls as usize;
    eprintln!(
        "{test}: {served} calls for {RECORDS} records, {counted} in the run's usage; claims {}, shares before the kill \
         {before_kill:?}, after {after:?}",
        claims.len()
    );
    assert!(counted <= served, "{counted} calls counted, {served} served");
    assert!(served - counted <= 256, "{} served calls are in no run's usage", served - counted);
    let _ = (a.start_kill(), b.start_kill());
}

fn pb_yes() -> i32 {
    assay_proto::common::v1::Answer::Yes as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spread_run_finishes_when_its_helper_is_killed() {
    spread_and_kill(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spread_run_finishes_on_the_helper_when_its_executor_is_killed() {
    spread_and_kill(true).await;
}

/// An open run with a budget on a shared store is not spread: its one gateway settles the budget,
/// which holds (no other gateway claims a chunk, the tokens stay under the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_with_a_budget_stays_on_its_gateway_and_its_budget_holds() {
    let Some(pg) = TempPostgres::start_or_skip("an_open_run_with_a_budget_stays_on_its_gateway") else { return };
    let store = pg.url();
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_req: &assay_testkit::RecordedRequest| {
        assay_testkit::Reply::json(serde_json::json!({"answers": [
            {"question_index": 1, "answer": "YES"},
            {"question_index": 2, "answer": "YES"},
        ]}))
        .usage(100, 10)
        .delay(Duration::from_millis(10))
    });
    let (_scorer, scorer_url) = scorer(&llm).await;
    let (mut a, mut client_a) = gateway(&store, "gw-a", &scorer_url).await;
    let (mut b, _client_b) = gateway(&store, "gw-b", &scorer_url).await;
    const MAX: u64 = 110 * 50;
    let budget = gw::RunBudget { max_tokens: Some(MAX), max_cost_usd: None };
    let (run_id, events) = start_open_run(&mut client_a, leaves_eval(0), "budget", Some(budget)).await;
    drop(events);
    let message = gw::AppendRecordsRequest { run_id: run_id.clone(), records: records(0..2000), seal: true };
    client_a.append_records(futures::stream::iter(vec![message])).await.unwrap();
    let all = watch_all(&mut client_a, &run_id).await;
    let run = get(&mut client_a, &run_id).await;
    assert_eq!(run.state, gw::RunState::Partial as i32, "stopped by its budget: {:?}", run.result);
    assert!(!run.budget_exhausted.is_empty());
    assert!(run.gateways.is_empty(), "not spread: {:?}", run.gateways);
    assert!(!all.iter().any(|e| matches!(e.event, Some(Event::RecordsClaimed(_)))), "no chunk claimed");
    let usage = run.usage.unwrap();
    let used = usage.prompt_tokens + usage.completion_tokens;
    assert!(used <= MAX, "{used} tokens for a budget of {MAX}");
    assert!(llm.request_count() as u64 <= MAX / 110, "{} calls served", llm.request_count());
    let _ = (a.start_kill(), b.start_kill());
}
