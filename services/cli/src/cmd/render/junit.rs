//! `--junit FILE` of `assay eval`, `score`, `compare`, `debate`, `refine` and `refine-text`: the
//! results as JUnit XML, the test report format Jenkins, GitLab and most CI systems read.
//!
//! The document is valid against both JUnit schemas in use: the one Jenkins' xunit plugin reads
//! (`junit-10.xsd`) and the stricter Ant one (windyroad's `JUnit.xsd`); the tests check it with a
//! schema validator against copies of both (services/cli/tests/fixtures). So: a `<testsuites>` root
//! without attributes; each `<testsuite>` with `name`, `package`, `id`, `tests`, `failures`,
//! `errors`, `skipped`, `time` (seconds, 3 decimals), `timestamp` (UTC, no zone: the Ant schema
//! allows none) and `hostname`, then `<properties>`, the test cases, `<system-out>` and
//! `<system-err>` in that order; each `<testcase>` with `classname`, `name` and `time`, and at most
//! one `<failure>` or `<error>`, each with a `type`.
//!
//! What a test case is:
//! - `eval` / `score`: one per result, i.e. per record, and with `--respond` per record and
//!   responder (and sample with `--respond-samples`). `classname` is `assay.<verb>.<data file>`,
//!   with responders `assay.<verb>.<data file>.<responder>`, so a CI system shows one class per
//!   responder; `name` is the record id. A record below `--pass-threshold` (its primary score) is a
//!   `<failure>` whose message says the score, the threshold and the items answered NO. A record
//!   that failed or was left unscored (no item answered) is an `<error>`: the test could not be
//!   carried out, which says nothing about the output's quality, and CI systems show errors apart
//!   from failures; either way it is never a pass. With responders, each comparison with the first
//!   responder is a test case too, in a second suite, failed when it regressed (the rule of
//!   `--fail-on-regression`).
//! - `compare`: one test case, the comparison, failed when it regressed (the rule of
//!   `--fail-on-regression`, at `--min-effect` or 0), with the difference, its interval and p.
//! - `debate`: one per problem (`assay.debate.<data file>`, named by the problem id), failed when
//!   the graded answer (the debate's, before any self-refine hook) is wrong against the reference,
//!   in error when the problem failed or has no reference to grade against, else passed.
//! - `refine`: one per issue the judges raised (`assay.refine.<section id>`, named by the issue's
//!   description, shortened), issues counted as `assay report` counts them: failed when it is among
//!   the result's unresolved issues (the message: severity, criterion, section and the edits tried
//!   for it), passed when it is not (a verified fix, or no longer raised at the last judging);
//!   unresolved issues placed in no section go to the run's class. Then one case for the run
//!   (`assay.refine.<document>`, `refinement`), failed when it ended best effort (the final score
//!   against the thresholds), in error while it waits for a human.
//! - `refine-text`: one case for the text, passed when the loop converged (or the draft was too
//!   short to refine), failed when it stopped otherwise (the last critique in the message), in
//!   error when the refiner failed.
//!
//! The file is written whole or not at all (a temporary file beside it, renamed over it). A
//! run's results can be read a page at a time (an open run of any size): the test cases go to a
//! side file as they come and the report is put together at the end, so memory stays flat.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::refiners::v1 as rpb;
use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};

use super::report::{IssueEnd, sections};
use super::{action_name, outcome_name, plural, quality_name, severity_name, stop_reason_name};

/// Items named in a failure's one-line message (the detail lists them all).
const ITEMS_IN_MESSAGE: usize = 10;
/// Characters of a judge's reason kept in a failure's detail.
const REASON_CHARS: usize = 500;
/// Characters of an issue's description kept in its test case's name.
const ISSUE_NAME_CHARS: usize = 80;
/// Characters of a debate answer kept in a failure's message (the detail has it whole).
const ANSWER_CHARS: usize = 200;

/// How a test case ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Passed,
    /// The output was judged and fell short (`<failure>`).
    Failed {
        kind: &'static str,
        message: String,
        detail: String,
    },
    /// No verdict could be reached (`<error>`): a failed or unscored record, a statistic that is
    /// not a number, a run that did not end with results.
    Errored {
        kind: &'static str,
        message: String,
        detail: String,
    },
}

/// One test case.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub classname: String,
    pub name: String,
    pub verdict: Verdict,
}

/// A test suite's own attributes and text.
#[derive(Debug, Clone)]
pub struct Suite {
    /// `assay eval records.jsonl`.
    pub name: String,
    /// `assay.eval`.
    pub package: String,
    /// When the run started.
    pub started: SystemTime,
    /// Seconds the run took.
    pub seconds: f64,
    pub properties: Vec<(String, String)>,
    /// The run's summary, as the verb printed it (`<system-out>`).
    pub out: String,
}

/// Test cases, failures and errors of a suite.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub tests: u64,
    pub failures: u64,
    pub errors: u64,
}

impl Counts {
    fn add(&mut self, v: &Verdict) {
        self.tests += 1;
        match v {
            Verdict::Passed => {}
            Verdict::Failed { .. } => self.failures += 1,
            Verdict::Errored { .. } => self.errors += 1,
        }
    }
}

/// A report being written: the first suite's test cases go to a side file as they come; the
/// report is put together by [`JunitFile::finish`].
pub struct JunitFile {
    path: PathBuf,
    cases_path: PathBuf,
    cases: BufWriter<File>,
    counts: Counts,
}

impl JunitFile {
    /// Start the report at `path` (checked now: a directory that does not exist fails before the
    /// run, not after it).
    pub fn create(path: &Path) -> Result<Self, String> {
        let cases_path = beside(path, "cases");
        let file = File::create(&cases_path).map_err(|e| format!("--junit {}: {e}", path.display()))?;
        Ok(Self { path: path.to_path_buf(), cases_path, cases: BufWriter::new(file), counts: Counts::default() })
    }

    /// A test case of the first suite.
    pub fn add(&mut self, case: &Case) -> Result<(), String> {
        self.counts.add(&case.verdict);
        write_case(&mut self.cases, case).map_err(|e| self.error(&e))
    }

    /// Write the report: `first` with the test cases added, then the suites of `more`. Returns the
    /// first suite's counts.
    pub fn finish(mut self, first: &Suite, more: &[(Suite, Vec<Case>)]) -> Result<Counts, String> {
        self.cases.flush().map_err(|e| self.error(&e))?;
        let tmp = beside(&self.path, "tmp");
        let written = (|| -> std::io::Result<()> {
            let mut w = Writer::new_with_indent(BufWriter::new(File::create(&tmp)?), b' ', 2);
            w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
            w.write_event(Event::Start(BytesStart::new("testsuites")))?;
            start_suite(&mut w, first, 0, self.counts)?;
            std::io::copy(&mut File::open(&self.cases_path)?, w.get_mut())?;
            end_suite(&mut w, first)?;
            for (i, (suite, cases)) in more.iter().enumerate() {
                let mut counts = Counts::default();
                cases.iter().for_each(|c| counts.add(&c.verdict));
                start_suite(&mut w, suite, i + 1, counts)?;
                cases.iter().try_for_each(|c| write_case(w.get_mut(), c))?;
                end_suite(&mut w, suite)?;
            }
            w.write_event(Event::End(BytesEnd::new("testsuites")))?;
            let mut out = w.into_inner();
            out.write_all(b"\n")?;
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(self.error(&e));
        }
        Ok(self.counts)
    }

    fn error(&self, e: &std::io::Error) -> String {
        format!("--junit {}: {e}", self.path.display())
    }
}

impl Drop for JunitFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.cases_path);
    }
}

/// Write a report of the suites in `suites` (the first one first) at `path`.
pub fn write(path: &Path, suites: &[(Suite, Vec<Case>)]) -> Result<Counts, String> {
    let Some(((first, cases), more)) = suites.split_first() else {
        return Err("no test suite to write".into());
    };
    let mut file = JunitFile::create(path)?;
    cases.iter().try_for_each(|c| file.add(c))?;
    file.finish(first, more)
}

/// The report of a verb that ended without results (the run failed, was cancelled, its input was
/// refused): one test case in error, so a CI system reading the file shows the failure rather
/// than an older file's results or nothing.
pub fn write_error(path: &Path, verb: &str, label: &str, message: &str) -> Result<Counts, String> {
    let suite = Suite {
        name: format!("assay {verb} {label}"),
        package: format!("assay.{verb}"),
        started: SystemTime::now(),
        seconds: 0.0,
        properties: Vec::new(),
        out: String::new(),
    };
    let case = Case {
        classname: classname(verb, label, None),
        name: format!("assay {verb}"),
        verdict: Verdict::Errored {
            kind: "run_failed",
            message: one_line(message),
            detail: format!("assay {verb}: {message}"),
        },
    };
    write(path, &[(suite, vec![case])])
}

/// The report of a verb that follows one run to its results (`debate`, `refine`, `refine-text`):
/// started before the run (a directory that does not exist fails then), written once with the
/// run's test cases, or as one case in error when the verb ended without writing it.
pub struct RunReport {
    file: Option<JunitFile>,
    path: PathBuf,
    verb: &'static str,
    /// The input file (its stem names the run's class).
    pub label: String,
    clock: std::time::Instant,
    started: SystemTime,
}

impl RunReport {
    pub fn create(path: &Path, verb: &'static str, label: String) -> Result<Self, String> {
        Ok(Self {
            file: Some(JunitFile::create(path)?),
            path: path.to_path_buf(),
            verb,
            label,
            clock: std::time::Instant::now(),
            started: SystemTime::now(),
        })
    }

    /// Write the run's test cases, with its properties and summary (`<system-out>`).
    pub fn finish(&mut self, properties: Vec<(String, String)>, out: String, cases: &[Case]) -> Result<Counts, String> {
        let mut file = self.file.take().ok_or_else(|| format!("--junit {}: written already", self.path.display()))?;
        cases.iter().try_for_each(|c| file.add(c))?;
        let name =
            Path::new(&self.label).file_name().map_or_else(|| self.label.clone(), |n| n.to_string_lossy().into_owned());
        let suite = Suite {
            name: format!("assay {} {name}", self.verb),
            package: format!("assay.{}", self.verb),
            started: self.started,
            seconds: self.clock.elapsed().as_secs_f64(),
            properties,
            out,
        };
        file.finish(&suite, &[])
    }

    /// The verb ended with `message` before writing the report: one case in error (never an older
    /// report's results). Nothing when the report was written.
    pub fn failed(mut self, message: &str) {
        if let Some(file) = self.file.take() {
            drop(file);
            if let Err(w) = write_error(&self.path, self.verb, &self.label, message) {
                eprintln!("assay {}: {w}", self.verb);
            }
        }
    }

    /// The run's case in error, named as [`write_error`] names it.
    pub fn run_error(&self, kind: &'static str, message: &str) -> Case {
        Case {
            classname: classname(self.verb, &self.label, None),
            name: format!("assay {}", self.verb),
            verdict: Verdict::Errored { kind, message: one_line(message), detail: message.to_string() },
        }
    }
}

/// A file beside `path` (same directory, so a rename is atomic): `.NAME.PID.WHAT`.
fn beside(path: &Path, what: &str) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "junit.xml".into());
    path.with_file_name(format!(".{name}.{}.{what}", std::process::id()))
}

fn start_suite<W: Write>(w: &mut Writer<W>, s: &Suite, id: usize, c: Counts) -> std::io::Result<()> {
    let (tests, failures, errors) = (c.tests.to_string(), c.failures.to_string(), c.errors.to_string());
    let (id, time, timestamp, host) = (id.to_string(), seconds(s.seconds), utc_timestamp(s.started), hostname());
    let name = xml_text(&s.name);
    let package = xml_text(&s.package);
    let start = BytesStart::new("testsuite").with_attributes([
        ("name", name.as_ref()),
        ("package", package.as_ref()),
        ("id", id.as_str()),
        ("tests", tests.as_str()),
        ("failures", failures.as_str()),
        ("errors", errors.as_str()),
        ("skipped", "0"),
        ("time", time.as_str()),
        ("timestamp", timestamp.as_str()),
        ("hostname", host.as_str()),
    ]);
    w.write_event(Event::Start(start))?;
    w.create_element("properties").write_inner_content(|w| {
        for (name, value) in &s.properties {
            let (name, value) = (xml_text(name), xml_text(value));
            w.create_element("property")
                .with_attributes([("name", name.as_ref()), ("value", value.as_ref())])
                .write_empty()?;
        }
        Ok(())
    })?;
    Ok(())
}

fn end_suite<W: Write>(w: &mut Writer<W>, s: &Suite) -> std::io::Result<()> {
    w.create_element("system-out").write_text_content(BytesText::new(&xml_text(&s.out)))?;
    w.create_element("system-err").write_empty()?;
    w.write_event(Event::End(BytesEnd::new("testsuite")))
}

/// One test case, on its own line(s), at the depth of a suite's children.
fn write_case<W: Write>(out: &mut W, case: &Case) -> std::io::Result<()> {
    out.write_all(b"\n    ")?;
    let mut w = Writer::new(out);
    let (classname, name) = (xml_text(&case.classname), xml_text(&case.name));
    let element = w.create_element("testcase").with_attributes([
        ("classname", classname.as_ref()),
        ("name", name.as_ref()),
        // No per-record timing exists: the suite carries the run's time.
        ("time", "0"),
    ]);
    let (tag, kind, message, detail) = match &case.verdict {
        Verdict::Passed => {
            element.write_empty()?;
            return Ok(());
        }
        Verdict::Failed { kind, message, detail } => ("failure", kind, message, detail),
        Verdict::Errored { kind, message, detail } => ("error", kind, message, detail),
    };
    let (message, detail) = (xml_text(message), xml_text(detail));
    element.write_inner_content(|w| {
        w.create_element(tag)
            .with_attributes([("type", *kind), ("message", message.as_ref())])
            .write_text_content(BytesText::new(&detail))?;
        Ok(())
    })?;
    Ok(())
}

/// `text` with the characters XML 1.0 cannot carry at all (most control characters, which not
/// even a character reference may name) replaced by U+FFFD; the writer escapes the rest.
pub fn xml_text(text: &str) -> Cow<'_, str> {
    let allowed = |c: char| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}');
    if text.chars().all(allowed) {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.chars().map(|c| if allowed(c) { c } else { '\u{FFFD}' }).collect())
    }
}

/// Seconds with at most 3 decimals (Jenkins' schema allows no more).
fn seconds(s: f64) -> String {
    format!("{:.3}", if s.is_finite() && s > 0.0 { s } else { 0.0 })
}

/// `2026-12-04T17:48:01`, in UTC (the Ant schema allows no zone).
pub fn utc_timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// This machine's name, or `localhost` (the Ant schema requires one).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A message attribute's text: one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A part of a class name: a CI system splits `classname` at its last dot (package, class), so
/// dots and blanks inside a part become `_`.
fn class_part(text: &str) -> String {
    let part: String = text.chars().map(|c| if c == '.' || c.is_whitespace() { '_' } else { c }).collect();
    if part.is_empty() { "_".into() } else { part }
}

/// `assay.eval.records`, with a responder `assay.eval.records.gpt-4o-mini`: a data file's stem
/// (or any label) and an optional last part.
pub fn classname(verb: &str, label: &str, last: Option<&str>) -> String {
    let stem = Path::new(label).file_stem().map_or_else(|| label.to_string(), |s| s.to_string_lossy().into_owned());
    let mut name = format!("assay.{verb}.{}", class_part(&stem));
    if let Some(last) = last {
        name.push('.');
        name.push_str(&class_part(last));
    }
    name
}

/// The checklists' questions by checklist id and item id (a run read in pages has none: its
/// failures name items by id).
#[derive(Default)]
pub struct Questions<'a>(HashMap<(&'a str, &'a str), &'a str>);

impl<'a> Questions<'a> {
    pub fn of(checklists: &'a [common::Checklist]) -> Self {
        Self(
            checklists
                .iter()
                .flat_map(|c| c.items.iter().map(move |i| ((c.id.as_str(), i.id.as_str()), i.question.as_str())))
                .collect(),
        )
    }

    fn get(&self, checklist: &str, item: &str) -> Option<&'a str> {
        self.0.get(&(checklist, item)).copied()
    }
}

/// How `eval` / `score` results become test cases.
#[derive(Debug, Clone)]
pub struct RecordCases {
    /// `eval` or `score`.
    pub verb: &'static str,
    /// The data file (its stem names the class).
    pub label: String,
    /// `--pass-threshold`: a scored record below it fails.
    pub threshold: Option<f64>,
    /// Some responder answers more than once (`--respond-samples`): names carry the sample.
    pub sampled: bool,
}

impl RecordCases {
    /// A record's (or a response's) test case.
    pub fn case(&self, r: &gw::RecordResult, questions: &Questions<'_>) -> Case {
        let id = if r.record_id.is_empty() { format!("#{}", r.index) } else { r.record_id.clone() };
        let name = if self.sampled && !r.responder.is_empty() { format!("{id} (sample {})", r.sample) } else { id };
        let responder = (!r.responder.is_empty()).then_some(r.responder.as_str());
        let who = match responder {
            Some(name) => format!("record {} (responder {name})", r.record_id),
            None => format!("record {}", r.record_id),
        };
        Case {
            classname: classname(self.verb, &self.label, responder),
            name,
            verdict: self.verdict(r, &who, questions),
        }
    }

    fn verdict(&self, r: &gw::RecordResult, who: &str, questions: &Questions<'_>) -> Verdict {
        let score = match &r.score {
            _ if !r.error.is_empty() => {
                return Verdict::Errored {
                    kind: "failed",
                    message: format!("failed: {}", one_line(&r.error)),
                    detail: format!("{who} failed: {}", r.error),
                };
            }
            None => {
                return Verdict::Errored {
                    kind: "failed",
                    message: "failed: no score".into(),
                    detail: format!("{who} has no score"),
                };
            }
            Some(s) if s.answered_count == 0 => {
                let why: Vec<String> = s
                    .item_scores
                    .iter()
                    .filter(|i| !i.error.is_empty())
                    .map(|i| format!("  {}: {}", i.item_id, i.error))
                    .collect();
                return Verdict::Errored {
                    kind: "unscored",
                    message: format!(
                        "unscored: no item answered ({} unanswered); the judge's reply could not be read",
                        s.unanswered_count
                    ),
                    detail: format!("{who}: no item answered\n{}", why.join("\n")).trim_end().to_string(),
                };
            }
            Some(s) => s,
        };
        let Some(threshold) = self.threshold else { return Verdict::Passed };
        if score.primary_score >= threshold {
            return Verdict::Passed;
        }
        let metric = metric_name(score.primary_metric);
        let no: Vec<&common::ItemScore> =
            score.item_scores.iter().filter(|i| i.answer == common::Answer::No as i32).collect();
        let ids: Vec<&str> = no.iter().take(ITEMS_IN_MESSAGE).map(|i| i.item_id.as_str()).collect();
        let more = no.len().saturating_sub(ITEMS_IN_MESSAGE);
        let named = match (ids.is_empty(), more) {
            (true, _) => "no item answered NO".to_string(),
            (false, 0) => format!("answered NO: {}", ids.join(", ")),
            (false, n) => format!("answered NO: {} and {n} more", ids.join(", ")),
        };
        let message =
            format!("primary score {:.4} ({metric}) below --pass-threshold {threshold}; {named}", score.primary_score);
        let mut detail = format!(
            "{who}: primary score {:.4} ({metric}) is below the pass threshold {threshold}\n\
             {} of {} items answered, {} unanswered; answered NO:",
            score.primary_score,
            score.answered_count,
            score.answered_count + score.unanswered_count,
            score.unanswered_count
        );
        if no.is_empty() {
            detail.push_str(" none");
        }
        for i in &no {
            match questions.get(&score.checklist_id, &i.item_id).or_else(|| questions.get(&r.checklist_id, &i.item_id))
            {
                Some(q) => detail.push_str(&format!("\n  {}: {q}", i.item_id)),
                None => detail.push_str(&format!("\n  {}", i.item_id)),
            }
            if let Some(why) = i.reasoning.as_deref().filter(|w| !w.trim().is_empty()) {
                let cut: String = why.chars().take(REASON_CHARS).collect();
                let ellipsis = if cut.len() < why.len() { "..." } else { "" };
                detail.push_str(&format!("\n    judge: {}{ellipsis}", one_line(&cut)));
            }
        }
        Verdict::Failed { kind: "below_threshold", message, detail }
    }
}

/// `pass_rate`, `weighted`, `normalized` (what `primary_score` is).
fn metric_name(m: i32) -> &'static str {
    match common::PrimaryMetric::try_from(m) {
        Ok(common::PrimaryMetric::Pass) => "pass_rate",
        Ok(common::PrimaryMetric::Weighted) => "weighted",
        Ok(common::PrimaryMetric::Normalized) => "normalized",
        Ok(common::PrimaryMetric::Unspecified) | Err(_) => "primary",
    }
}

/// The numbers of a comparison, as a failure or error says them.
pub struct Compared<'a> {
    pub diff: f64,
    pub ci: (f64, f64),
    pub alpha: f64,
    pub p_value: f64,
    pub method: &'a str,
    /// Pairs compared (None: unpaired).
    pub pairs: Option<u64>,
    /// The gate's verdict and its line (`regression: ...`).
    pub regressed: bool,
    pub reason: &'a str,
}

/// A comparison's test case: failed when it regressed, in error when a statistic is not a
/// number (no verdict), else passed.
pub fn comparison_case(classname: String, name: String, c: &Compared<'_>) -> Case {
    // A p too small for 4 decimals is said as a bound, not as 0.
    let p = if c.p_value < 0.0001 { "p < 0.0001".to_string() } else { format!("p = {:.4}", c.p_value) };
    let numbers = format!(
        "diff {:+.4}, {:.0}% CI [{:+.4}, {:+.4}], {p} ({}, {})",
        c.diff,
        100.0 * (1.0 - c.alpha),
        c.ci.0,
        c.ci.1,
        c.method,
        c.pairs.map_or_else(|| "unpaired".to_string(), |n| format!("{n} pairs"))
    );
    let verdict = if ![c.diff, c.ci.0, c.ci.1, c.p_value].iter().all(|x| x.is_finite()) {
        Verdict::Errored {
            kind: "no_verdict",
            message: format!("no verdict: {numbers}: a statistic is not a number"),
            detail: format!("{name}: {}", c.reason),
        }
    } else if c.regressed {
        Verdict::Failed {
            kind: "regression",
            message: format!("regression: {numbers}"),
            detail: format!("{name}: {}; {p}", c.reason),
        }
    } else {
        Verdict::Passed
    };
    Case { classname, name, verdict }
}

/// `text` cut to `max` characters, `...` marking a cut.
fn shortened(text: &str, max: usize) -> String {
    let text = one_line(text);
    if text.chars().count() <= max {
        return text;
    }
    let cut: String = text.chars().take(max.saturating_sub(3)).collect();
    format!("{}...", cut.trim_end())
}

/// A debated problem's test case: failed when the graded answer is wrong, in error when the
/// problem failed or has no reference, else passed. `label` is the data file.
pub fn debate_case(label: &str, p: &gw::DebateProblemResult) -> Case {
    let name = if p.id.is_empty() { format!("#{}", p.index) } else { p.id.clone() };
    let who = format!("problem {name}");
    // The answer graded: the debate's, before the self-refine hook when one ran.
    let graded = p.self_refined.as_ref().map_or(p.final_answer.as_str(), |h| h.before.as_str());
    let agreed = if p.consensus { "the solvers agreed" } else { "the solvers disagreed" };
    let verdict = if !p.error.is_empty() {
        Verdict::Errored {
            kind: "failed",
            message: format!("failed: {}", one_line(&p.error)),
            detail: format!("{who} failed: {}", p.error),
        }
    } else {
        match p.correct {
            None => Verdict::Errored {
                kind: "ungraded",
                message: format!("no reference to grade against; final answer {:?}", shortened(graded, ANSWER_CHARS)),
                detail: format!("{who} has no reference: its answer was not graded\nfinal answer: {graded}"),
            },
            Some(true) => Verdict::Passed,
            Some(false) => {
                let decided = super::debate::decision_name(p.decided_by);
                let mut detail = format!(
                    "{who}: the final answer is wrong\nfinal answer: {graded}\nreference: {}\n{agreed}; decided by {decided}{}",
                    p.reference,
                    if p.answers_changed { "; a solver changed its answer" } else { "" }
                );
                if let Some(h) = p.self_refined.as_ref().filter(|h| h.after != h.before) {
                    detail.push_str(&format!("\nafter the self-refine hook (not graded): {}", h.after));
                }
                Verdict::Failed {
                    kind: "wrong_answer",
                    message: format!(
                        "wrong answer: final answer {:?}, reference {:?}; {agreed}",
                        shortened(graded, ANSWER_CHARS),
                        shortened(&p.reference, ANSWER_CHARS)
                    ),
                    detail,
                }
            }
        }
    };
    Case { classname: classname("debate", label, None), name, verdict }
}

/// An edit tried for an issue: the task, and how it ended.
#[derive(Clone)]
struct Try {
    iteration: u32,
    task_id: String,
    action: i32,
    /// Kept (verified), not kept (the reason), or no verdict seen.
    ended: Option<Result<(), String>>,
}

impl Try {
    fn text(&self) -> String {
        let how = match &self.ended {
            Some(Ok(())) => "kept".to_string(),
            Some(Err(why)) => format!("not kept: {}", one_line(why)),
            None => "no verdict".to_string(),
        };
        format!("iteration {} {} {} ({how})", self.iteration, self.task_id, action_name(self.action))
    }
}

/// The edits the events say were tried, by issue id.
fn tries(events: &[gw::RefinementEvent]) -> HashMap<String, Vec<Try>> {
    use gw::refinement_event::Event as E;
    let mut tasks: Vec<(Vec<String>, Try)> = Vec::new();
    for ev in events {
        match ev.event.as_ref() {
            Some(E::TaskStarted(t)) => {
                if let Some(task) = &t.task {
                    tasks.push((
                        task.issue_ids.clone(),
                        Try { iteration: ev.iteration, task_id: task.id.clone(), action: task.action, ended: None },
                    ));
                }
            }
            Some(E::VerificationResult(v)) if !v.task_id.is_empty() => {
                if let Some((_, t)) =
                    tasks.iter_mut().rev().find(|(_, t)| t.iteration == ev.iteration && t.task_id == v.task_id)
                {
                    t.ended = Some(if v.accepted && !v.rolled_back {
                        Ok(())
                    } else if v.reason.is_empty() {
                        Err("rejected".into())
                    } else {
                        Err(v.reason.clone())
                    });
                }
            }
            Some(E::PatchRejected(p)) => {
                if let Some((_, t)) =
                    tasks.iter_mut().rev().find(|(_, t)| t.iteration == ev.iteration && t.task_id == p.task_id)
                    && t.ended.is_none()
                {
                    t.ended = Some(Err(if p.reason.is_empty() { "rejected".into() } else { p.reason.clone() }));
                }
            }
            Some(_) | None => {}
        }
    }
    let mut by_issue: HashMap<String, Vec<Try>> = HashMap::new();
    for (issues, t) in tasks {
        for id in issues {
            by_issue.entry(id).or_default().push(t.clone());
        }
    }
    by_issue
}

/// The test cases of a finished refinement of the document `label`: one per issue raised (as
/// `assay report` counts them), then the run's own.
pub fn refinement_cases(label: &str, t: &gw::TargetedRefinementResult, events: &[gw::RefinementEvent]) -> Vec<Case> {
    let tried = tries(events);
    let mut cases = Vec::new();
    let issue_case = |class: String, i: &common::JudgeIssue, end: IssueEnd| {
        let name =
            if i.description.trim().is_empty() { i.id.clone() } else { shortened(&i.description, ISSUE_NAME_CHARS) };
        let verdict = match end {
            IssueEnd::Fixed | IssueEnd::Gone => Verdict::Passed,
            IssueEnd::Unresolved => issue_failure(i, tried.get(&i.id).map(Vec::as_slice).unwrap_or_default()),
        };
        Case { classname: class, name, verdict }
    };
    let views = sections(t, events, None);
    for v in &views {
        for (i, end) in &v.issues {
            cases.push(issue_case(classname("refine", &v.id, None), i, *end));
        }
    }
    // Unresolved issues placed in no section of the result: the document's.
    for i in t.unresolved_issues.iter().filter(|i| !views.iter().any(|v| v.id == i.section_id)) {
        cases.push(issue_case(classname("refine", label, None), i, IssueEnd::Unresolved));
    }
    cases.push(Case {
        classname: classname("refine", label, None),
        name: "refinement".into(),
        verdict: refinement_verdict(t),
    });
    cases
}

/// An unresolved issue's failure: severity, criterion, section, and what was tried.
fn issue_failure(i: &common::JudgeIssue, tried: &[Try]) -> Verdict {
    let section = if i.section_id.is_empty() { "no section".to_string() } else { format!("section {}", i.section_id) };
    let tried_text = match (tried.is_empty(), i.held_back) {
        (false, _) => format!("tried: {}", tried.iter().map(Try::text).collect::<Vec<_>>().join("; ")),
        (true, true) => "no edit tried (held back: raised by too few judges)".to_string(),
        (true, false) if i.section_id.is_empty() => "no edit tried (placed in no section)".to_string(),
        (true, false) => "no edit tried".to_string(),
    };
    let criterion = if i.criterion.is_empty() { String::new() } else { format!(" ({})", i.criterion) };
    let message = format!("unresolved {} issue{criterion} in {section}; {tried_text}", severity_name(i.severity));
    let mut detail = format!("{}\nissue {}: {message}", i.description, i.id);
    for (what, text) in [("fix asked", &i.fix_instruction), ("location", &i.location)] {
        if !text.trim().is_empty() {
            detail.push_str(&format!("\n{what}: {text}"));
        }
    }
    if !i.raised_by.is_empty() {
        detail.push_str(&format!("\nraised by: {}", i.raised_by.join(", ")));
    }
    Verdict::Failed { kind: "unresolved", message, detail }
}

/// The run's own verdict: passed when accepted (at a threshold, with a warning, by a human, or
/// reviewed), failed when it ended best effort.
fn refinement_verdict(t: &gw::TargetedRefinementResult) -> Verdict {
    use assay_domain::iteration::decide::{FULL_AUTO_ACCEPT, WARN_SCORE};
    let outcome = outcome_name(t.outcome);
    let critical = t.unresolved_issues.iter().filter(|i| i.severity == common::Severity::Critical as i32).count();
    let open = format!("{} ({critical} critical)", plural(t.unresolved_issues.len(), "unresolved issue"));
    let history: Vec<String> = t.score_history.iter().map(|s| format!("{s:.2}")).collect();
    let detail = format!(
        "outcome {outcome}, quality {}, final score {:.4} after {}; scores {}; {open}{}",
        quality_name(t.quality),
        t.final_score,
        plural(t.iterations as usize, "iteration"),
        if history.is_empty() { "-".to_string() } else { history.join(" -> ") },
        if t.stop_reason.is_empty() { String::new() } else { format!("; stopped: {}", t.stop_reason) }
    );
    match gw::RefinementOutcome::try_from(t.outcome) {
        Ok(
            gw::RefinementOutcome::Accepted
            | gw::RefinementOutcome::AcceptedWithWarning
            | gw::RefinementOutcome::AcceptedManual
            | gw::RefinementOutcome::Reviewed,
        ) => Verdict::Passed,
        Ok(gw::RefinementOutcome::BestEffort) => Verdict::Failed {
            kind: "best_effort",
            message: format!(
                "best effort: final score {:.4} below the acceptance threshold {FULL_AUTO_ACCEPT} ({WARN_SCORE} with no \
                 critical issue open); {open}{}",
                t.final_score,
                if t.stop_reason.is_empty() { String::new() } else { format!("; stopped: {}", t.stop_reason) }
            ),
            detail,
        },
        Ok(gw::RefinementOutcome::Unspecified) | Err(_) => Verdict::Errored {
            kind: "no_outcome",
            message: format!("the run ended without an outcome ({})", t.outcome),
            detail,
        },
    }
}

/// The report of a refinement that waits for a human: the run's case, in error (no verdict yet).
pub fn awaiting_human_case(label: &str, run_id: &str, e: Option<&gw::EscalationTriggered>) -> Case {
    let e = e.cloned().unwrap_or_default();
    let reason = if e.reason.is_empty() { "escalated".to_string() } else { one_line(&e.reason) };
    Case {
        classname: classname("refine", label, None),
        name: "refinement".into(),
        verdict: Verdict::Errored {
            kind: "awaiting_human",
            message: format!(
                "waiting for a human: {reason}; best score {:.4} at iteration {}; {}",
                e.best_score,
                e.best_iteration,
                plural(e.unresolved_issues.len(), "unresolved issue")
            ),
            detail: format!("run {run_id} waits for a human (assay runs edit|resume|accept|review {run_id})"),
        },
    }
}

/// The test case of a self-refined text (`label`: the input's name): passed when the loop
/// converged or the draft was too short to refine, failed when it stopped otherwise, with the last
/// critique; in error when the refiner failed.
pub fn self_refine_case(label: &str, r: &rpb::SelfRefineResponse) -> Case {
    use rpb::SelfRefineStopReason as Stop;
    let name = Path::new(label).file_name().map_or_else(|| label.to_string(), |n| n.to_string_lossy().into_owned());
    let reason = stop_reason_name(r.stop_reason);
    let critique: Vec<&str> = r
        .passes
        .iter()
        .rev()
        .find(|p| !p.critique.is_empty())
        .map(|p| p.critique.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let passes = plural(r.passes.len(), "pass");
    let last = if critique.is_empty() {
        "no critique".to_string()
    } else {
        format!("last critique: {}", critique.iter().map(|c| one_line(c)).collect::<Vec<_>>().join("; "))
    };
    let detail = || {
        let mut d = format!(
            "stopped: {reason} after {passes}, text {}\nlast critique:",
            if r.changed { "changed" } else { "unchanged" }
        );
        if critique.is_empty() {
            d.push_str(" none");
        }
        for c in &critique {
            d.push_str(&format!("\n  - {c}"));
        }
        for p in r.passes.iter().filter(|p| !p.error.is_empty()) {
            d.push_str(&format!("\npass {}: {}", p.pass, p.error));
        }
        d
    };
    let verdict = match Stop::try_from(r.stop_reason) {
        Ok(Stop::Converged | Stop::TooShort) => Verdict::Passed,
        _ if r.skipped_too_short || r.converged => Verdict::Passed,
        Ok(Stop::MaxPasses | Stop::RolledBack) => Verdict::Failed {
            kind: "not_converged",
            message: format!("not converged: {reason} after {passes}; {last}"),
            detail: detail(),
        },
        Ok(Stop::RefinerError) => {
            let error = r.passes.iter().rev().find(|p| !p.error.is_empty()).map(|p| one_line(&p.error));
            Verdict::Errored {
                kind: "refiner_error",
                message: format!("refiner error after {passes}: {}; {last}", error.unwrap_or_default()),
                detail: detail(),
            }
        }
        Ok(Stop::Unspecified) | Err(_) => Verdict::Errored {
            kind: "no_stop_reason",
            message: format!("the loop ended without a stop reason ({})", r.stop_reason),
            detail: detail(),
        },
    };
    Case { classname: classname("refine-text", label, None), name, verdict }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, answer: common::Answer, reasoning: Option<&str>) -> common::ItemScore {
        common::ItemScore {
            item_id: id.into(),
            answer: answer as i32,
            reasoning: reasoning.map(Into::into),
            ..Default::default()
        }
    }

    fn scored(id: &str, primary: f64, items: Vec<common::ItemScore>) -> gw::RecordResult {
        let answered = items.iter().filter(|i| i.answer != 0).count() as u32;
        gw::RecordResult {
            record_id: id.into(),
            checklist_id: "c1".into(),
            score: Some(common::Score {
                checklist_id: "c1".into(),
                primary_metric: common::PrimaryMetric::Pass as i32,
                primary_score: primary,
                answered_count: answered,
                unanswered_count: items.len() as u32 - answered,
                item_scores: items,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn cases(threshold: Option<f64>) -> RecordCases {
        RecordCases { verb: "eval", label: "data/my.records.jsonl".into(), threshold, sampled: false }
    }

    #[test]
    fn a_record_below_the_threshold_fails_naming_its_no_items_and_their_questions() {
        let checklists = vec![common::Checklist {
            id: "c1".into(),
            items: vec![
                common::ChecklistItem { id: "q1".into(), question: "Is it short?".into(), ..Default::default() },
                common::ChecklistItem { id: "q2".into(), question: "Is it kind?".into(), ..Default::default() },
            ],
            ..Default::default()
        }];
        let q = Questions::of(&checklists);
        let r = scored(
            "r1",
            0.5,
            vec![item("q1", common::Answer::Yes, None), item("q2", common::Answer::No, Some("it  is\nrude"))],
        );
        let c = cases(Some(0.8)).case(&r, &q);
        assert_eq!(c.classname, "assay.eval.my_records");
        assert_eq!(c.name, "r1");
        let Verdict::Failed { kind, message, detail } = c.verdict else { panic!("{c:?}") };
        assert_eq!(kind, "below_threshold");
        assert_eq!(message, "primary score 0.5000 (pass_rate) below --pass-threshold 0.8; answered NO: q2");
        assert!(detail.ends_with("answered NO:\n  q2: Is it kind?\n    judge: it is rude"), "{detail}");
        // At the threshold, and without one, the record passes.
        assert_eq!(cases(Some(0.5)).case(&r, &q).verdict, Verdict::Passed);
        assert_eq!(cases(None).case(&r, &q).verdict, Verdict::Passed);
    }

    #[test]
    fn failed_and_unscored_records_are_errors_whatever_the_threshold() {
        let failed = gw::RecordResult { record_id: "r2".into(), error: "scorer down".into(), ..Default::default() };
        let c = cases(None).case(&failed, &Questions::default());
        assert!(
            matches!(&c.verdict, Verdict::Errored { kind: "failed", message, .. } if message == "failed: scorer down")
        );
        let mut unscored = scored("r3", 0.0, vec![item("q1", common::Answer::Unspecified, None)]);
        unscored.score.as_mut().unwrap().item_scores[0].error = "unparseable reply".into();
        let c = cases(Some(0.0)).case(&unscored, &Questions::default());
        let Verdict::Errored { kind, detail, .. } = c.verdict else { panic!("{c:?}") };
        assert_eq!(kind, "unscored");
        assert!(detail.contains("q1: unparseable reply"), "{detail}");
    }

    #[test]
    fn responders_get_a_class_each_and_samples_a_name_each() {
        let mut r = scored("r1", 1.0, vec![item("q1", common::Answer::Yes, None)]);
        r.responder = "gpt-4.1 mini".into();
        r.sample = 2;
        let c = RecordCases { sampled: true, ..cases(None) }.case(&r, &Questions::default());
        assert_eq!((c.classname.as_str(), c.name.as_str()), ("assay.eval.my_records.gpt-4_1_mini", "r1 (sample 2)"));
    }

    #[test]
    fn comparisons_fail_on_a_regression_and_err_without_a_verdict() {
        let mut c = Compared {
            diff: -0.2,
            ci: (-0.3, -0.1),
            alpha: 0.05,
            p_value: 0.001,
            method: "paired_t",
            pairs: Some(40),
            regressed: true,
            reason: "regression: ...",
        };
        let case = comparison_case("assay.compare.primary".into(), "b vs a".into(), &c);
        let Verdict::Failed { message, .. } = &case.verdict else { panic!("{case:?}") };
        assert_eq!(message, "regression: diff -0.2000, 95% CI [-0.3000, -0.1000], p = 0.0010 (paired_t, 40 pairs)");
        c.regressed = false;
        assert_eq!(comparison_case(String::new(), String::new(), &c).verdict, Verdict::Passed);
        c.p_value = f64::NAN;
        assert!(matches!(comparison_case(String::new(), String::new(), &c).verdict, Verdict::Errored { .. }));
    }

    #[test]
    fn text_that_xml_cannot_carry_is_replaced_and_the_rest_escaped() {
        assert_eq!(xml_text("a<&]]>\tb"), "a<&]]>\tb");
        assert_eq!(xml_text("a\u{1}b\u{1b}"), "a\u{FFFD}b\u{FFFD}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.xml");
        let case = Case {
            classname: "assay.eval.x".into(),
            name: "<a&b>]]>\u{1}".into(),
            verdict: Verdict::Failed { kind: "below_threshold", message: "m \"q\"".into(), detail: "x ]]> y".into() },
        };
        let suite = Suite {
            name: "assay eval x".into(),
            package: "assay.eval".into(),
            started: UNIX_EPOCH,
            seconds: 1.23456,
            properties: vec![("run_id".into(), "r&1".into())],
            out: "done".into(),
        };
        let counts = write(&path, &[(suite, vec![case])]).unwrap();
        assert_eq!(counts, Counts { tests: 1, failures: 1, errors: 0 });
        let xml = std::fs::read_to_string(&path).unwrap();
        assert!(xml.contains(r#"name="&lt;a&amp;b&gt;]]&gt;�""#), "{xml}");
        assert!(xml.contains(">x ]]&gt; y</failure>") && xml.contains(r#"message="m &quot;q&quot;""#), "{xml}");
        assert!(xml.contains(r#"time="1.235" timestamp="1970-01-01T00:00:00""#), "{xml}");
        // Nothing left beside it.
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, [std::ffi::OsString::from("j.xml")]);
    }

    #[test]
    fn debate_problems_fail_on_the_graded_answer_and_err_when_failed_or_ungraded() {
        let wrong = gw::DebateProblemResult {
            id: "add".into(),
            final_answer: "5, ok".into(),
            correct: Some(false),
            consensus: true,
            reference: "4".into(),
            self_refined: Some(gw::SelfRefined { before: "5".into(), after: "5, ok".into(), ..Default::default() }),
            ..Default::default()
        };
        let c = debate_case("data/set.v1.jsonl", &wrong);
        assert_eq!((c.classname.as_str(), c.name.as_str()), ("assay.debate.set_v1", "add"));
        // The answer graded is the debate's, not the hook's.
        let Verdict::Failed { kind: "wrong_answer", message, detail } = c.verdict else { panic!("{c:?}") };
        assert_eq!(message, "wrong answer: final answer \"5\", reference \"4\"; the solvers agreed");
        assert!(detail.ends_with("after the self-refine hook (not graded): 5, ok"), "{detail}");
        let failed = gw::DebateProblemResult { index: 3, error: "solver down".into(), ..Default::default() };
        let c = debate_case("set.jsonl", &failed);
        assert_eq!(c.name, "#3");
        assert!(
            matches!(c.verdict, Verdict::Errored { kind: "failed", ref message, .. } if message == "failed: solver down")
        );
        let ungraded = gw::DebateProblemResult { id: "x".into(), final_answer: "blue".into(), ..Default::default() };
        assert!(matches!(debate_case("s", &ungraded).verdict, Verdict::Errored { kind: "ungraded", .. }));
        let right = gw::DebateProblemResult { correct: Some(true), ..wrong };
        assert_eq!(debate_case("s", &right).verdict, Verdict::Passed);
    }

    #[test]
    fn a_refinement_fails_its_unresolved_issues_and_a_best_effort_run() {
        let issue = |id: &str, section: &str| common::JudgeIssue {
            id: id.into(),
            section_id: section.into(),
            severity: common::Severity::Critical as i32,
            description: "Wrong rule. ".repeat(10),
            ..Default::default()
        };
        let t = gw::TargetedRefinementResult {
            sections: vec![common::Section { id: "a".into(), content: "x".into(), ..Default::default() }],
            outcome: gw::RefinementOutcome::BestEffort as i32,
            final_score: 0.7,
            // One in section a, one placed in no section.
            unresolved_issues: vec![issue("i1", "a"), common::JudgeIssue { held_back: true, ..issue("i2", "") }],
            ..Default::default()
        };
        let cases = refinement_cases("docs/lesson.json", &t, &[]);
        let names: Vec<(&str, &str)> = cases.iter().map(|c| (c.classname.as_str(), c.name.as_str())).collect();
        // 80 characters: 77 of the description, then "...".
        let long = format!("{}Wrong...", "Wrong rule. ".repeat(6));
        assert_eq!(long.chars().count(), 80);
        assert_eq!(
            names,
            [
                ("assay.refine.a", long.as_str()),
                ("assay.refine.lesson", long.as_str()),
                ("assay.refine.lesson", "refinement")
            ]
        );
        let Verdict::Failed { message, .. } = &cases[1].verdict else { panic!("{cases:?}") };
        assert_eq!(
            message,
            "unresolved critical issue in no section; no edit tried (held back: raised by too few judges)"
        );
        let Verdict::Failed { kind: "best_effort", message, .. } = &cases[2].verdict else { panic!("{cases:?}") };
        assert!(
            message.starts_with("best effort: final score 0.7000 below the acceptance threshold 0.85"),
            "{message}"
        );
        let accepted = gw::TargetedRefinementResult { outcome: gw::RefinementOutcome::AcceptedManual as i32, ..t };
        assert_eq!(refinement_cases("l", &accepted, &[]).last().unwrap().verdict, Verdict::Passed);
    }

    #[test]
    fn a_self_refined_text_passes_when_converged_or_too_short() {
        let pass = |critique: &[&str], error: &str| rpb::SelfRefinePass {
            critique: critique.iter().map(|c| c.to_string()).collect(),
            error: error.into(),
            ..Default::default()
        };
        let mut r = rpb::SelfRefineResponse {
            stop_reason: rpb::SelfRefineStopReason::Converged as i32,
            passes: vec![pass(&["vague"], "")],
            ..Default::default()
        };
        let c = self_refine_case("in/draft.txt", &r);
        assert_eq!(
            (c.classname.as_str(), c.name.as_str(), &c.verdict),
            ("assay.refine-text.draft", "draft.txt", &Verdict::Passed)
        );
        r.stop_reason = rpb::SelfRefineStopReason::TooShort as i32;
        assert_eq!(self_refine_case("stdin", &r).verdict, Verdict::Passed);
        r.stop_reason = rpb::SelfRefineStopReason::RefinerError as i32;
        r.passes.push(pass(&[], "cut at the token limit"));
        let Verdict::Errored { kind: "refiner_error", message, .. } = self_refine_case("stdin", &r).verdict else {
            panic!()
        };
        assert_eq!(message, "refiner error after 2 passes: cut at the token limit; last critique: vague");
    }

    #[test]
    fn timestamps_are_civil_dates_in_utc() {
        let at = |s: u64| utc_timestamp(UNIX_EPOCH + std::time::Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(at(1_796_406_481), "2026-12-04T17:48:01");
    }
}
