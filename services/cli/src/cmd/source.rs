//! Evaluation results from "a run id or a file", for the commands that read them (`assay compare`,
//! `assay power`, `assay agreement`): an argument naming an existing file is a JSON-lines file
//! written by `assay eval --out` / `assay score --out`; otherwise it is a run id, fetched from the
//! gateway with GetRun and read by [`run_results`], the conversion `CompareRuns` uses. Both become
//! the same [`RunResults`] (the whole-mesh tests check a run and its `--out` file give the same
//! numbers).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_domain::stats::runs::{RecordLine, RunMetric, RunResults};
use assay_proto::convert::runs::run_results;
use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines::{self, PipelineContract, result_of};
use serde_json::Value;

use super::error::{CliError, status_text};
use super::render::checklist_eval::record_json;
use super::render::{kind_name, state_name};
use super::session::{Client, client, configured_gateway};

/// The per-record score compared.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// `primary_score`: the scorer's primary metric (per-sample scores, when judged several
    /// times, averaged per record first).
    Primary,
    /// `pass_rate`: the share of items answered yes.
    #[value(name = "pass_rate")]
    PassRate,
    /// `weighted_score`.
    Weighted,
    /// `normalized_score`.
    Normalized,
}

impl Metric {
    /// The field of an `assay eval --out` line.
    pub fn field(self) -> &'static str {
        self.run_metric().field()
    }

    /// The core's metric.
    pub fn run_metric(self) -> RunMetric {
        match self {
            Self::Primary => RunMetric::Primary,
            Self::PassRate => RunMetric::PassRate,
            Self::Weighted => RunMetric::Weighted,
            Self::Normalized => RunMetric::Normalized,
        }
    }
}

/// What a command-line argument names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// A results file.
    File(PathBuf),
    /// A run in the gateway's store.
    Run(String),
}

impl Spec {
    /// An existing file is a file; an argument that looks like a path (a separator or an
    /// extension; run ids have neither) is a missing file; anything else is a run id.
    pub fn parse(arg: &str) -> Result<Spec, String> {
        let path = Path::new(arg);
        if path.is_file() {
            return Ok(Spec::File(path.to_path_buf()));
        }
        if arg.trim().is_empty() {
            return Err("a run id or a results file is required, got an empty argument".into());
        }
        if arg.contains(['/', '\\', '.']) || path.exists() {
            return Err(format!("{arg}: no such results file (an existing file, or a run id)"));
        }
        Ok(Spec::Run(arg.to_string()))
    }

    /// How the results are named in messages and tables: the path, or `run <id>`.
    pub fn label(&self) -> String {
        match self {
            Spec::File(p) => p.display().to_string(),
            Spec::Run(id) => format!("run {id}"),
        }
    }
}

/// The results `spec` names, for `metric`: an existing file read as `--out` lines, or a run id
/// fetched from `gateway` (default: the configured gateway) with the configuration of the
/// defaults and the `ASSAY__*` environment. Blocks in place, inside or outside the async runtime.
pub fn load(spec: &str, gateway: Option<&str>, metric: RunMetric) -> Result<RunResults, String> {
    match Spec::parse(spec)? {
        Spec::File(path) => read_file(&path, metric),
        Spec::Run(id) => {
            let config = assay_config::load(None).map_err(|e| e.to_string())?;
            block_on(fetch_run(&config, &gateway_url(&config, gateway), &id, metric))
        }
    }
}

/// How `spec` is named in messages: the path, or `run <id>`.
pub fn label(spec: &str) -> String {
    Spec::parse(spec).map_or_else(|_| spec.to_string(), |s| s.label())
}

/// The gateway URL: `--gateway`, else the configured gateway port on this machine.
pub fn gateway_url(config: &AssayConfig, gateway: Option<&str>) -> String {
    gateway.map_or_else(|| configured_gateway(config), str::to_string)
}

/// Run `f` to completion from synchronous code, inside or outside a Tokio runtime.
pub fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => tokio::task::block_in_place(|| h.block_on(f)),
        Err(_) => match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(f),
            Err(e) => panic!("cannot start an async runtime: {e}"),
        },
    }
}

/// A stored run's evaluation, through GetRun: an unknown id, an unreachable gateway, a run that
/// is not a checklist_eval run or not finished are errors saying so.
pub async fn fetch_evaluation(config: &AssayConfig, url: &str, run_id: &str) -> Result<gw::EvaluateResponse, String> {
    let mut c = client(config, url).map_err(CliError::into_message)?;
    let run = c
        .get_run(gw::GetRunRequest { run_id: run_id.to_string() })
        .await
        .map_err(|s| {
            let code = s.code();
            if code == tonic::Code::NotFound {
                format!("unknown run id {run_id:?} (not a file either) on the gateway at {url}")
            } else if code == tonic::Code::Unavailable || code == tonic::Code::Unknown {
                format!(
                    "{run_id:?} is not a file, and the gateway at {url} is unreachable to fetch it as a run: {}",
                    status_text(&s)
                )
            } else {
                format!("run {run_id}: {}", status_text(&s))
            }
        })?
        .into_inner()
        .run
        .unwrap_or_default();
    if run.kind != pipelines::ChecklistEval::KIND as i32 {
        return Err(format!("run {run_id} is a {} run, not a checklist_eval run", kind_name(run.kind)));
    }
    if run.state != gw::RunState::Succeeded as i32 && run.state != gw::RunState::Partial as i32 {
        return Err(format!(
            "run {run_id} is {}; only checklist_eval runs that succeeded or ended partial can be compared",
            state_name(run.state)
        ));
    }
    let mut e = result_of::<pipelines::ChecklistEval>(run.result)
        .ok_or_else(|| format!("run {run_id} holds no evaluation result"))?;
    if e.results_paged {
        // An open run: its results a page at a time (its checklists stay in the store, so the
        // item flips name items by id).
        each_result(&mut c, run_id, |r| {
            e.results.push(r);
            Ok(())
        })
        .await?;
    }
    Ok(e)
}

/// A stored run's records for `metric`, as `CompareRuns` reads them.
pub async fn fetch_run(config: &AssayConfig, url: &str, run_id: &str, metric: RunMetric) -> Result<RunResults, String> {
    Ok(run_results(&fetch_evaluation(config, url, run_id).await?, metric))
}

/// Every result of a checklist_eval run, in record order, read a page of 5,000 at a time and
/// handed to `each`.
pub async fn each_result(
    client: &mut Client,
    run_id: &str,
    mut each: impl FnMut(gw::RecordResult) -> Result<(), String>,
) -> Result<(), String> {
    let mut token = String::new();
    loop {
        let page = client
            .list_run_results(gw::ListRunResultsRequest {
                run_id: run_id.to_string(),
                page_size: 5000,
                page_token: token,
            })
            .await
            .map_err(|s| format!("reading the results of run {run_id}: {}", status_text(&s)))?
            .into_inner();
        for r in page.results {
            each(r)?;
        }
        if page.next_page_token.is_empty() {
            return Ok(());
        }
        token = page.next_page_token;
    }
}

/// Write a checklist_eval run's results to `out`, one JSON line per record in record order
/// (`assay eval`'s lines), read a page at a time; returns how many failed.
pub async fn write_results(client: &mut Client, run_id: &str, out: &mut dyn Write) -> Result<u64, String> {
    let mut failed = 0u64;
    each_result(client, run_id, |r| {
        failed += u64::from(r.score.is_none());
        writeln!(out, "{}", record_json(&r)).map_err(|e| e.to_string())
    })
    .await?;
    out.flush().map_err(|e| e.to_string())?;
    Ok(failed)
}

/// A results file (JSON lines of `assay eval --out`), its lines in order. A record id is on one
/// line, or on several that each declare a distinct `"epoch"` (a non-negative integer: repeated
/// runs of the record, averaged per record by the statistics); any other repeated id is an error
/// naming the id and its lines.
pub fn read_file(path: &Path, metric: RunMetric) -> Result<RunResults, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut records = Vec::new();
    // Per record id: its lines (1-based) and their epochs.
    let mut seen: BTreeMap<String, Vec<(usize, Option<u64>)>> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let v: Value = serde_json::from_str(raw).map_err(|e| format!("{}: not JSON: {e}", at()))?;
        let line = parse_line(&v, metric, &at)?;
        let epoch = epoch(&v, &at)?;
        seen.entry(line.id.clone()).or_default().push((i + 1, epoch));
        records.push(line);
    }
    // The first repeated id in file order is named.
    let mut ids: Vec<_> = seen.iter().collect();
    ids.sort_by_key(|(_, lines)| lines[0].0);
    for (id, lines) in ids {
        check_repeats(id, lines).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(RunResults { records })
}

/// A line's `"epoch"`: absent or null, or a non-negative integer.
fn epoch(v: &Value, at: &dyn Fn() -> String) -> Result<Option<u64>, String> {
    match v.get("epoch") {
        None | Some(Value::Null) => Ok(None),
        Some(e) => {
            e.as_u64().map(Some).ok_or_else(|| format!("{}: \"epoch\" must be a non-negative integer, got {e}", at()))
        }
    }
}

/// The lines of one record id: one line, or lines that each declare a distinct epoch.
fn check_repeats(id: &str, lines: &[(usize, Option<u64>)]) -> Result<(), String> {
    if lines.len() < 2 {
        return Ok(());
    }
    if lines.iter().any(|(_, e)| e.is_none()) {
        let numbers: Vec<usize> = lines.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "record id {id:?} is on lines {}: a record is on one line, or on one line per epoch (a \
             repeated run of it), each with a distinct \"epoch\" field",
            line_list(&numbers)
        ));
    }
    let mut epochs: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (n, e) in lines {
        if let Some(e) = e {
            epochs.entry(*e).or_default().push(*n);
        }
    }
    match epochs.iter().find(|(_, at)| at.len() > 1) {
        Some((e, at)) => Err(format!(
            "record id {id:?} repeats epoch {e} on lines {}: each epoch of a record is on one line",
            line_list(at)
        )),
        None => Ok(()),
    }
}

/// Line numbers as `1, 2 and 3`, or the first few and how many more.
fn line_list(numbers: &[usize]) -> String {
    const SHOWN: usize = 8;
    let shown: Vec<String> = numbers.iter().take(SHOWN).map(usize::to_string).collect();
    match (numbers.len(), shown.split_last()) {
        (n, Some((last, rest))) if n <= SHOWN && !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        (n, _) if n > SHOWN => format!("{} and {} more", shown.join(", "), n - SHOWN),
        _ => shown.join(", "),
    }
}

/// One `--out` line: `id`, the metric's field (a number, or null for a failed record),
/// `sample_scores` (the primary metric's per-sample scores, when judged several times), `answers`
/// (item id -> "yes" / "no" / null) and optionally `questions` (item id -> question text).
fn parse_line(v: &Value, metric: RunMetric, at: &dyn Fn() -> String) -> Result<RecordLine, String> {
    let Value::Object(o) = v else {
        return Err(format!("{}: expected a JSON object (a line of `assay eval --out`)", at()));
    };
    let id = record_id(o.get("id")).ok_or_else(|| format!("{}: no record \"id\" (a non-empty string)", at()))?;
    let field = metric.field();
    let score = match o.get(field) {
        Some(Value::Number(n)) => match n.as_f64().filter(|x| x.is_finite()) {
            Some(x) => Some(x),
            None => return Err(format!("{}: {field:?} is not a finite number", at())),
        },
        Some(Value::Null) => None,
        None => {
            return Err(format!(
                "{}: no {field:?} field (--metric {}; is this a file written by `assay eval --out`?)",
                at(),
                field.trim_end_matches("_score")
            ));
        }
        Some(other) => return Err(format!("{}: {field:?} must be a number or null, got {other}", at())),
    };
    let samples = match (metric, o.get("sample_scores")) {
        (RunMetric::Primary, Some(Value::Array(a))) if score.is_some() => {
            let s: Option<Vec<f64>> = a.iter().map(|x| x.as_f64().filter(|x| x.is_finite())).collect();
            s.ok_or_else(|| format!("{}: \"sample_scores\" must hold finite numbers", at()))?
        }
        (RunMetric::Primary, Some(Value::Array(_) | Value::Null) | None)
        | (RunMetric::PassRate | RunMetric::Weighted | RunMetric::Normalized, _) => Vec::new(),
        (RunMetric::Primary, Some(other)) => {
            return Err(format!("{}: \"sample_scores\" must be a list of numbers, got {other}", at()));
        }
    };
    let mut answers = BTreeMap::new();
    if let Some(a) = o.get("answers").and_then(Value::as_object) {
        for (item, ans) in a {
            let answer = match ans.as_str() {
                Some("yes") => Some(true),
                Some("no") => Some(false),
                None if ans.is_null() => None,
                Some(_) | None => {
                    return Err(format!(
                        "{}: answer of item {item:?} must be \"yes\", \"no\" or null, got {ans}",
                        at()
                    ));
                }
            };
            answers.insert(item.clone(), answer);
        }
    }
    let questions = o
        .get("questions")
        .and_then(Value::as_object)
        .map(|q| q.iter().filter_map(|(item, text)| Some((item.clone(), text.as_str()?.to_string()))).collect())
        .unwrap_or_default();
    Ok(RecordLine { id, score, samples: if samples.len() > 1 { samples } else { Vec::new() }, answers, questions })
}

/// A record id: a non-empty string, or a number written as text.
pub fn record_id(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(_) | Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value, metric: RunMetric) -> Result<RecordLine, String> {
        parse_line(&v, metric, &|| "l".to_string())
    }

    #[test]
    fn sample_scores_are_read_for_the_primary_metric_only() {
        let v =
            json!({"id": "r", "primary_score": 0.5, "pass_rate": 0.5, "sample_scores": [0.25, 0.75], "answers": {}});
        assert_eq!(parse(v.clone(), RunMetric::Primary).unwrap().samples, vec![0.25, 0.75]);
        assert!(parse(v, RunMetric::PassRate).unwrap().samples.is_empty());
        let bad = json!({"id": "r", "primary_score": 0.5, "sample_scores": "x"});
        assert!(parse(bad, RunMetric::Primary).unwrap_err().contains("sample_scores"));
    }

    #[test]
    fn a_repeated_id_needs_a_distinct_epoch_on_each_line() {
        let dir = tempfile::tempdir().unwrap();
        let read = |text: &str| {
            let f = dir.path().join("r.jsonl");
            std::fs::write(&f, text).unwrap();
            read_file(&f, RunMetric::Primary)
        };
        let l = |id: &str, epoch: &str| format!("{{\"id\": \"{id}\", \"primary_score\": 0.5{epoch}}}\n");
        let ok = format!("{}{}{}", l("a", ", \"epoch\": 0"), l("b", ""), l("a", ", \"epoch\": 1"));
        assert_eq!(read(&ok).unwrap().observations().len(), 3);
        let repeated = format!("{}{}\n{}", l("b", ""), l("a", ""), l("a", ", \"epoch\": 1"));
        let e = read(&repeated).unwrap_err();
        assert!(e.contains("r.jsonl: record id \"a\" is on lines 2 and 4: a record is on one line"), "{e}");
        let twice = format!("{}{}", l("a", ", \"epoch\": 2"), l("a", ", \"epoch\": 2"));
        assert!(read(&twice).unwrap_err().contains("record id \"a\" repeats epoch 2 on lines 1 and 2"));
        assert!(read(&l("a", ", \"epoch\": -1")).unwrap_err().contains("line 1: \"epoch\" must be a non-negative"));
        assert!(read(&l("a", ", \"epoch\": null")).is_ok());
    }

    #[test]
    fn line_lists() {
        assert_eq!(line_list(&[3]), "3");
        assert_eq!(line_list(&[3, 9]), "3 and 9");
        assert_eq!(line_list(&[1, 2, 3]), "1, 2 and 3");
        assert_eq!(line_list(&(1..=8).collect::<Vec<_>>()), "1, 2, 3, 4, 5, 6, 7 and 8");
        assert_eq!(line_list(&(1..=50).collect::<Vec<_>>()), "1, 2, 3, 4, 5, 6, 7, 8 and 42 more");
    }

    #[test]
    fn a_run_id_a_file_and_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("b.jsonl");
        std::fs::write(&f, "").unwrap();
        assert_eq!(Spec::parse(f.to_str().unwrap()).unwrap(), Spec::File(f.clone()));
        assert_eq!(Spec::parse("01JRUNID").unwrap(), Spec::Run("01JRUNID".into()));
        assert!(Spec::parse("missing.jsonl").unwrap_err().contains("missing.jsonl: no such results file"));
    }
}
