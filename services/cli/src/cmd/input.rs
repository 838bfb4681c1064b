//! Reading command inputs: evaluation records and checklists from files, the corpus arguments
//! (observations, dimensions, samples, refiner chain) shared by `eval` and `generate`, the
//! self-refine hook options shared by `refine` and `debate`, and model options.

use std::path::{Path, PathBuf};

use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::generator::v1 as gen_pb;
use assay_proto::refiners::v1 as ref_pb;
use serde_json::Value;

/// Corpus inputs (feedback, checkeval, interacteval) and the refiner chain, shared by `generate`
/// and `eval`.
#[derive(clap::Args, Clone, Default)]
pub struct CorpusArgs {
    /// Corpus observations: one per line (.txt) or JSON strings / {"text"} objects (.jsonl).
    #[arg(long)]
    pub observations: Option<PathBuf>,
    /// What the corpus is about.
    #[arg(long, default_value = "")]
    pub description: String,
    /// checkeval dimensions: JSON list of {"name","definition","sub_dimensions":[{"name","definition"}]}.
    #[arg(long)]
    pub dimensions: Option<PathBuf>,
    /// checkeval augmentation: seed, elaboration, diversification, combined.
    #[arg(long)]
    pub augmentation: Option<String>,
    /// checkeval: filter questions for alignment and dimension consistency.
    #[arg(long)]
    pub filter: bool,
    /// feedback: observations per model call.
    #[arg(long)]
    pub batch_size: Option<u32>,
    /// Corpus presets: skip the built-in deduplicator.
    #[arg(long)]
    pub no_dedup: bool,
    /// Corpus presets: skip the built-in tagger.
    #[arg(long)]
    pub no_tagging: bool,
    /// Corpus presets: skip the built-in selector.
    #[arg(long)]
    pub no_selection: bool,
    /// Deduplicator cosine threshold (0, 1].
    #[arg(long)]
    pub dedup_threshold: Option<f64>,
    /// Selector: maximum questions kept (corpus presets and --refine selector).
    #[arg(long)]
    pub max_questions: Option<u32>,
    /// Selector (feedback and --refine selector): beam width (default 5).
    #[arg(long)]
    pub beam_width: Option<u32>,
    /// Selector: penalty per selected question (default 0.0005).
    #[arg(long)]
    pub length_penalty: Option<f64>,
    /// Selector: weight of coverage against diversity, in [0, 1] (default 0.5).
    #[arg(long)]
    pub alpha: Option<f64>,
    /// Refiners to run on the checklist, in order (comma separated): deduplicator, tagger,
    /// unit_tester (needs --samples FILE), selector.
    #[arg(long, value_delimiter = ',')]
    pub refine: Vec<String>,
    /// A number N (eval, 1 to 10): judge every record N times (seeds differ per sample; items take
    /// the majority, scores the mean, the summary reports flaky items). Or a file (unit_tester):
    /// scored sample responses, JSON lines {"id", "text", "answers": {"<item id>": "yes"|"no"}}.
    /// Give it twice for both.
    #[arg(long, value_name = "N|FILE")]
    pub samples: Vec<SamplesArg>,
    /// eval with --samples N: a judge model name on the scorer's backend, used round-robin over
    /// the samples (repeat for several; at most 10). Unset: the scorer's model.
    #[arg(long = "sample-model", value_name = "MODEL")]
    pub sample_models: Vec<String>,
    /// feedback: run the UnitTester on these sample responses (one per line, .txt, or JSON strings /
    /// {"text"} objects, .jsonl; at most 20), after the Tagger.
    #[arg(long)]
    pub unit_test_samples: Option<PathBuf>,
    /// rlcf_candidate, rlcf_candidates_only: a model that writes candidate responses for records
    /// that bring none, as MODEL or MODEL@BACKEND (repeat for several: one response each; one
    /// model: four).
    #[arg(long = "candidate-model")]
    pub candidate_models: Vec<String>,
}

/// One `--samples` value: digits are a judge sample count, anything else a scored-samples file.
#[derive(Clone, Debug, PartialEq)]
pub enum SamplesArg {
    /// Judge every record this many times (1 to 10).
    Count(u32),
    /// The unit tester's scored sample responses.
    File(PathBuf),
}

impl std::str::FromStr for SamplesArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(SamplesArg::File(PathBuf::from(s)));
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=assay_domain::MAX_JUDGE_SAMPLES).contains(&n) => Ok(SamplesArg::Count(n)),
            Ok(_) | Err(_) => Err(format!(
                "{s} judge samples: give 1 to {} (a file named by digits only: write it as ./{s})",
                assay_domain::MAX_JUDGE_SAMPLES
            )),
        }
    }
}

impl CorpusArgs {
    /// The judge sample count of `--samples N` (the last one given).
    pub fn judge_samples(&self) -> Option<u32> {
        self.samples.iter().rev().find_map(|s| match s {
            SamplesArg::Count(n) => Some(*n),
            SamplesArg::File(_) => None,
        })
    }

    /// The unit tester's scored-samples file of `--samples FILE` (the last one given).
    pub fn scored_samples(&self) -> Option<&Path> {
        self.samples.iter().rev().find_map(|s| match s {
            SamplesArg::File(p) => Some(p.as_path()),
            SamplesArg::Count(_) => None,
        })
    }

    /// The scorer settings with repeated judging (`--samples N`, `--sample-model`) over them;
    /// unchanged when neither is given.
    pub fn with_sampling(&self, scorer: Option<common::ScorerConfig>) -> Result<Option<common::ScorerConfig>, String> {
        let samples = self.judge_samples();
        if samples.is_none() && self.sample_models.is_empty() {
            return Ok(scorer);
        }
        if let Some(m) = self.sample_models.iter().find(|m| m.trim().is_empty()) {
            return Err(format!("--sample-model {m:?}: give a model name"));
        }
        if self.sample_models.len() > assay_domain::MAX_SAMPLE_MODELS {
            return Err(format!(
                "--sample-model given {} times; the limit is {}",
                self.sample_models.len(),
                assay_domain::MAX_SAMPLE_MODELS
            ));
        }
        let mut scorer = scorer.unwrap_or_default();
        scorer.samples = samples.or(scorer.samples);
        scorer.sample_models = self.sample_models.iter().map(|m| m.trim().to_string()).collect();
        Ok(Some(scorer))
    }

    /// The candidate models as model specs.
    pub fn candidate_specs(&self) -> Result<Vec<assay_proto::common::v1::ModelSpec>, String> {
        self.candidate_models
            .iter()
            .map(|m| {
                let (model, backend) = match m.rsplit_once('@') {
                    Some((model, backend)) => (model, backend),
                    None => (m.as_str(), ""),
                };
                if model.trim().is_empty() {
                    return Err(format!("--candidate-model {m:?}: give a model name (MODEL or MODEL@BACKEND)"));
                }
                Ok(assay_proto::common::v1::ModelSpec {
                    backend: backend.to_string(),
                    model: model.to_string(),
                    ..Default::default()
                })
            })
            .collect()
    }

    /// The refiner chain; `input` is the instruction the unit tester's samples answer.
    pub fn steps(&self, input: &str) -> Result<Vec<ref_pb::RefinerStep>, String> {
        let samples = match self.scored_samples() {
            Some(path) => Some(read_samples(path)?),
            None => None,
        };
        self.refine
            .iter()
            .flat_map(|n| n.split(','))
            .filter(|n| !n.trim().is_empty())
            .map(|n| {
                let step = match n.trim() {
                    "deduplicator" | "dedup" => ref_pb::refiner_step::Step::Deduplicate(ref_pb::DeduplicateRequest {
                        threshold: self.dedup_threshold,
                        ..Default::default()
                    }),
                    "tagger" => ref_pb::refiner_step::Step::Tag(ref_pb::TagRequest::default()),
                    "unit_tester" => ref_pb::refiner_step::Step::UnitTest(ref_pb::UnitTestRequest {
                        samples: samples
                            .clone()
                            .ok_or("--refine unit_tester needs --samples FILE (scored responses; a number is a judge sample count)")?,
                        input: input.to_string(),
                        ..Default::default()
                    }),
                    "selector" => ref_pb::refiner_step::Step::Select(ref_pb::SelectRequest {
                        max_questions: self.max_questions,
                        beam_width: self.beam_width,
                        length_penalty: self.length_penalty,
                        alpha: self.alpha,
                        ..Default::default()
                    }),
                    other => {
                        return Err(format!("unknown refiner {other:?} (deduplicator, tagger, unit_tester, selector)"));
                    }
                };
                Ok(ref_pb::RefinerStep { step: Some(step) })
            })
            .collect()
    }
}

/// Scored samples for the unit tester (JSON lines).
fn read_samples(path: &Path) -> Result<Vec<ref_pb::Sample>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            let at = |e: &str| format!("{}:{}: {e}", path.display(), n + 1);
            let v: Value = serde_json::from_str(l).map_err(|e| at(&format!("not JSON: {e}")))?;
            let text = v.get("text").and_then(Value::as_str).ok_or_else(|| at("needs a \"text\" string"))?;
            let answers = v
                .get("answers")
                .and_then(Value::as_object)
                .ok_or_else(|| at("needs \"answers\": {\"<item id>\": \"yes\" | \"no\"}"))?
                .iter()
                .map(|(id, a)| {
                    let answer = match a.as_str().map(str::to_ascii_lowercase).as_deref() {
                        Some("yes") => assay_proto::common::v1::Answer::Yes,
                        Some("no") => assay_proto::common::v1::Answer::No,
                        Some(_) | None => return Err(at(&format!("answers.{id} must be \"yes\" or \"no\""))),
                    };
                    Ok((id.clone(), answer as i32))
                })
                .collect::<Result<_, String>>()?;
            Ok(ref_pb::Sample {
                id: v.get("id").and_then(Value::as_str).map_or_else(|| n.to_string(), str::to_string),
                text: text.to_string(),
                answers,
            })
        })
        .collect()
}

fn read_observations(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json_lines = path.extension().is_some_and(|e| e == "jsonl");
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            if !json_lines {
                return Ok(l.trim().to_string());
            }
            match serde_json::from_str::<Value>(l) {
                Ok(Value::String(s)) => Ok(s),
                Ok(Value::Object(o)) => o
                    .get("text")
                    .or_else(|| o.get("observation"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("{}:{}: needs a \"text\" field", path.display(), n + 1)),
                Ok(_) | Err(_) => Err(format!("{}:{}: not a JSON string or object", path.display(), n + 1)),
            }
        })
        .collect()
}

fn read_dimensions(path: &Path) -> Result<Vec<gen_pb::Dimension>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let list = v.as_array().ok_or_else(|| format!("{}: a list of dimensions", path.display()))?;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    Ok(list
        .iter()
        .map(|d| gen_pb::Dimension {
            name: s(d, "name"),
            definition: s(d, "definition"),
            sub_dimensions: d
                .get("sub_dimensions")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|x| gen_pb::SubDimension { name: s(x, "name"), definition: s(x, "definition") })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect())
}

/// The corpus generation request of a corpus preset (see [`is_corpus`]).
pub fn corpus_request(preset: gen_pb::Preset, a: &CorpusArgs) -> Result<gen_pb::GenerateCorpusRequest, String> {
    let augmentation = match a.augmentation.as_deref() {
        None => gen_pb::AugmentationMode::Unspecified,
        Some(m) => gen_pb::AugmentationMode::from_str_name(&format!("AUGMENTATION_MODE_{}", m.to_ascii_uppercase()))
            .ok_or_else(|| format!("unknown augmentation {m:?} (seed, elaboration, diversification, combined)"))?,
    };
    Ok(gen_pb::GenerateCorpusRequest {
        preset: preset as i32,
        corpus_description: a.description.clone(),
        observations: a.observations.as_deref().map(read_observations).transpose()?.unwrap_or_default(),
        batch_size: a.batch_size,
        dimensions: a.dimensions.as_deref().map(read_dimensions).transpose()?.unwrap_or_default(),
        augmentation: augmentation as i32,
        filter: a.filter,
        refinement: Some(gen_pb::CorpusRefinement {
            skip_deduplication: a.no_dedup,
            skip_tagging: a.no_tagging,
            skip_selection: a.no_selection,
            dedup_threshold: a.dedup_threshold,
            max_questions: a.max_questions,
            beam_width: a.beam_width,
            length_penalty: a.length_penalty,
            alpha: a.alpha,
            run_unit_tester: a.unit_test_samples.is_some(),
            unit_test_samples: a.unit_test_samples.as_deref().map(read_observations).transpose()?.unwrap_or_default(),
        }),
        ..Default::default()
    })
}

/// Whether a preset generates from a corpus.
pub fn is_corpus(preset: gen_pb::Preset) -> bool {
    matches!(preset, gen_pb::Preset::Feedback | gen_pb::Preset::Checkeval | gen_pb::Preset::Interacteval)
}

/// Records from JSON lines: `{"id","input","target","reference","history","candidates":[...]}`.
pub fn read_records(path: &Path) -> Result<Vec<gw::EvalRecord>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(line).map_err(|e| format!("{}:{}: not JSON: {e}", path.display(), n + 1))?;
        out.push(record_from_json(&v).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?);
    }
    if out.is_empty() {
        return Err(format!("{}: no records", path.display()));
    }
    Ok(out)
}

/// How a dataset's own field names map onto a record's (`--input-field question` reads a record's
/// input from its `question` field or column).
#[derive(Debug, Clone, Default)]
pub struct FieldMap {
    pub input: Option<String>,
    pub target: Option<String>,
    pub id: Option<String>,
}

impl FieldMap {
    /// Rename the mapped fields of `record` to a record's names: a mapped field that is missing is
    /// an error naming it and its flag.
    fn apply(&self, record: &mut serde_json::Map<String, Value>) -> Result<(), String> {
        for (flag, from, to) in [
            ("--input-field", &self.input, "input"),
            ("--target-field", &self.target, "target"),
            ("--id-field", &self.id, "id"),
        ] {
            if let Some(from) = from.as_deref().filter(|f| *f != to) {
                let v = record.remove(from).ok_or_else(|| format!("no field {from:?} (named by {flag})"))?;
                record.insert(to.to_string(), v);
            }
        }
        Ok(())
    }
}

/// The record fields a run cannot do without, each with why: a CSV file without its column (under
/// its own name or the one a [`FieldMap`] gives) is refused before any run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Needs {
    /// Each record's input: a preset generates its checklist from it, or responders answer it.
    pub input: Option<&'static str>,
    /// Each record's target: the response scored, unless responders write it.
    pub target: Option<&'static str>,
}

/// Where records come from: JSON lines, or a CSV file with a header row (`.csv`).
enum Source {
    Json(std::io::Lines<std::io::BufReader<std::fs::File>>),
    Csv { rows: csv::StringRecordsIntoIter<std::fs::File>, headers: csv::StringRecord },
}

/// Records from JSON lines, or CSV rows (a file named `*.csv`, its first row the column names),
/// read one at a time (a file of any size in flat memory), their fields renamed by a [`FieldMap`];
/// errors name the file and the line.
pub struct RecordLines {
    path: std::path::PathBuf,
    source: Source,
    fields: FieldMap,
    line: usize,
}

fn is_csv(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"))
}

/// A CSV reader of `path`: a header row, then rows of as many cells (a row of more or fewer is an
/// error naming its line).
fn csv_reader(path: &Path) -> Result<csv::Reader<std::fs::File>, String> {
    csv::ReaderBuilder::new().flexible(false).from_path(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// `path:line` of a CSV position (the file's line where the row starts, the header's is 1), with
/// the row as a spreadsheet numbers it when a quoted cell spans lines before it.
fn csv_at(path: &Path, pos: Option<&csv::Position>) -> String {
    match pos {
        Some(p) if p.record() + 1 != p.line() => format!("{}:{} (row {})", path.display(), p.line(), p.record() + 1),
        Some(p) => format!("{}:{}", path.display(), p.line()),
        None => path.display().to_string(),
    }
}

/// A CSV reading error, its line named: a row of more or fewer cells than the header says how
/// many of each.
fn csv_error(path: &Path, e: &csv::Error) -> String {
    if let csv::ErrorKind::UnequalLengths { pos, expected_len, len } = e.kind() {
        let cells = if *len == 1 { "1 cell".to_string() } else { format!("{len} cells") };
        return format!("{}: {cells}, the header has {expected_len}", csv_at(path, pos.as_ref()));
    }
    if let csv::ErrorKind::Utf8 { pos, err } = e.kind() {
        return format!("{}: not UTF-8 text ({err})", csv_at(path, pos.as_ref()));
    }
    format!("{}: {e}", path.display())
}

/// A CSV header refused before any row is read: a mapped column that is not there, a column the
/// records are read from named twice, a column the run needs that is not there; each error names
/// the column and the header.
fn check_header(path: &Path, headers: &csv::StringRecord, fields: &FieldMap, needs: Needs) -> Result<(), String> {
    if headers.is_empty() {
        // An empty file: "no records", once the rows are read.
        return Ok(());
    }
    let columns = || headers.iter().collect::<Vec<_>>().join(", ");
    for (flag, column) in
        [("--input-field", &fields.input), ("--target-field", &fields.target), ("--id-field", &fields.id)]
    {
        if let Some(c) = column
            && !headers.iter().any(|h| h == c)
        {
            return Err(format!(
                "{}:1: no column {c:?} (named by {flag}); the columns are {}",
                path.display(),
                columns()
            ));
        }
    }
    // The columns a record is read from: one cell each, so a name given twice is ambiguous.
    let read = [
        fields.input.as_deref().unwrap_or("input"),
        fields.target.as_deref().unwrap_or("target"),
        fields.id.as_deref().unwrap_or("id"),
        "reference",
        "history",
        "candidates",
    ];
    for name in read {
        let at: Vec<String> =
            headers.iter().enumerate().filter(|(_, h)| *h == name).map(|(i, _)| (i + 1).to_string()).collect();
        if let [first @ .., last] = at.as_slice()
            && !first.is_empty()
        {
            let times = if at.len() == 2 { "twice".to_string() } else { format!("{} times", at.len()) };
            return Err(format!(
                "{}:1: the header names column {name:?} {times} (columns {} and {last}): which one holds the \
                 records' {name} is unclear; the columns are {}",
                path.display(),
                first.join(", "),
                columns()
            ));
        }
    }
    for (flag, field, mapped, why) in [
        ("--input-field", "input", &fields.input, needs.input),
        ("--target-field", "target", &fields.target, needs.target),
    ] {
        if let Some(why) = why
            && mapped.is_none()
            && !headers.iter().any(|h| h == field)
        {
            return Err(format!(
                "{}:1: no column {field:?} ({why}); the columns are {}: name the {field} column with {flag}",
                path.display(),
                columns()
            ));
        }
    }
    Ok(())
}

impl RecordLines {
    /// The records of `path` with their fields renamed by `fields`. A CSV file is refused at once
    /// when its header lacks a mapped column or one the run `needs`, or names a column the records
    /// are read from twice, naming the column, its flag and the columns there are.
    pub fn open_mapped(path: &Path, fields: FieldMap, needs: Needs) -> Result<Self, String> {
        use std::io::BufRead;
        let source = if is_csv(path) {
            let mut reader = csv_reader(path)?;
            let headers = reader.headers().map_err(|e| csv_error(path, &e))?.clone();
            check_header(path, &headers, &fields, needs)?;
            Source::Csv { rows: reader.into_records(), headers }
        } else {
            let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            Source::Json(std::io::BufReader::new(file).lines())
        };
        Ok(Self { path: path.to_path_buf(), source, fields, line: 0 })
    }

    /// How many records the file holds (its non-empty lines, or its CSV rows), read without
    /// keeping them.
    pub fn count(path: &Path) -> Result<u64, String> {
        use std::io::BufRead;
        if is_csv(path) {
            let mut reader = csv_reader(path)?;
            let mut n = 0;
            for row in reader.records() {
                row.map_err(|e| csv_error(path, &e))?;
                n += 1;
            }
            return Ok(n);
        }
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut n = 0;
        for line in std::io::BufReader::new(file).lines() {
            let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
            n += u64::from(!line.trim().is_empty());
        }
        Ok(n)
    }

    /// A record from a JSON object, its fields renamed.
    fn record(&self, mut v: Value) -> Result<gw::EvalRecord, String> {
        if let Value::Object(o) = &mut v {
            self.fields.apply(o)?;
        }
        record_from_json(&v)
    }
}

impl Iterator for RecordLines {
    type Item = Result<gw::EvalRecord, String>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match &mut self.source {
                Source::Json(lines) => {
                    let line = match lines.next()? {
                        Ok(l) => l,
                        Err(e) => return Some(Err(format!("{}: {e}", self.path.display()))),
                    };
                    self.line += 1;
                    if line.trim().is_empty() {
                        continue;
                    }
                    let at = format!("{}:{}", self.path.display(), self.line);
                    return Some(
                        serde_json::from_str::<Value>(&line)
                            .map_err(|e| format!("{at}: not JSON: {e}"))
                            .and_then(|v| self.record(v).map_err(|e| format!("{at}: {e}"))),
                    );
                }
                Source::Csv { rows, headers } => {
                    let row = match rows.next()? {
                        Ok(r) => r,
                        Err(e) => return Some(Err(csv_error(&self.path, &e))),
                    };
                    let object: serde_json::Map<String, Value> =
                        headers.iter().zip(row.iter()).map(|(h, v)| (h.to_string(), Value::from(v))).collect();
                    let at = csv_at(&self.path, row.position());
                    return Some(self.record(Value::Object(object)).map_err(|e| format!("{at}: {e}")));
                }
            }
        }
    }
}

/// One record from a JSON object.
pub fn record_from_json(v: &Value) -> Result<gw::EvalRecord, String> {
    if !v.is_object() {
        return Err("a record must be a JSON object".into());
    }
    let text = |k: &str| -> Result<String, String> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(format!("field {k:?} must be a string")),
        }
    };
    let candidates = match v.get("candidates") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, c)| match c {
                Value::String(t) => Ok(assay_proto::generator::v1::Candidate {
                    id: i.to_string(),
                    text: t.clone(),
                    model: String::new(),
                }),
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => {
                    Err(format!("candidates[{i}] must be a string"))
                }
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("field \"candidates\" must be a list of strings".into()),
    };
    Ok(gw::EvalRecord {
        id: match v.get("id") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        },
        input: text("input")?,
        target: text("target")?,
        reference: text("reference")?,
        history: text("history")?,
        candidates,
    })
}

/// A checklist from a JSON file: a checklist object (`{"id", "items": [...]}`) or a bare list of
/// items; an item is a question string or `{"id", "question", "weight", "category"}`.
pub fn read_checklist(path: &Path) -> Result<common::Checklist, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    checklist_from_json(&v).map_err(|e| format!("{}: {e}", path.display()))
}

/// A checklist from JSON (see [`read_checklist`]).
pub fn checklist_from_json(v: &Value) -> Result<common::Checklist, String> {
    let (id, items, input) = match v {
        Value::Array(items) => (String::new(), items.as_slice(), String::new()),
        Value::Object(o) => (
            o.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
            o.get("items").and_then(Value::as_array).map(Vec::as_slice).ok_or("a checklist needs \"items\"")?,
            o.get("input").and_then(Value::as_str).unwrap_or_default().to_string(),
        ),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            return Err("a checklist is a JSON object or a list of items".into());
        }
    };
    let items = items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(q) => {
                Ok(common::ChecklistItem { id: format!("q{}", i + 1), question: q.clone(), ..Default::default() })
            }
            Value::Object(o) => Ok(common::ChecklistItem {
                id: o.get("id").and_then(Value::as_str).map_or_else(|| format!("q{}", i + 1), str::to_string),
                question: o
                    .get("question")
                    .and_then(Value::as_str)
                    .ok_or(format!("items[{i}] needs a \"question\""))?
                    .to_string(),
                weight: o.get("weight").and_then(Value::as_f64),
                category: o.get("category").and_then(Value::as_str).unwrap_or_default().to_string(),
                ..Default::default()
            }),
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) => {
                Err(format!("items[{i}] must be a question string or an object"))
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(common::Checklist { id, items, input, source_method: "explicit".into(), ..Default::default() })
}

/// The options of the self-refine hook on a pipeline's outputs (`assay refine`, `assay debate`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct HookArgs {
    /// Self-refine (critique and revise) every output once the pipeline is done; implied by the
    /// other --self-refine-* options.
    #[arg(long)]
    pub self_refine: bool,
    /// Critique/revise passes per output, 1 to 5 (default 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=5))]
    pub self_refine_passes: Option<u32>,
    /// Outputs shorter than this many bytes are kept as they are, no model call (default 200; 0
    /// refines every output).
    #[arg(long, value_name = "N")]
    pub self_refine_min_bytes: Option<u32>,
    /// An output to leave alone: a section or problem id, or a producer (original, human or model
    /// for sections no stage changed, a human edited or a model wrote; debate for every answer).
    /// Repeat it or separate ids with commas.
    #[arg(long, value_name = "ID", value_delimiter = ',')]
    pub self_refine_exclude: Vec<String>,
}

impl HookArgs {
    /// The hook, when any option turned it on.
    pub fn hook(&self) -> Option<ref_pb::SelfRefineHook> {
        let on = self.self_refine
            || self.self_refine_passes.is_some()
            || self.self_refine_min_bytes.is_some()
            || !self.self_refine_exclude.is_empty();
        let exclude =
            self.self_refine_exclude.iter().map(|e| e.trim()).filter(|e| !e.is_empty()).map(String::from).collect();
        on.then(|| ref_pb::SelfRefineHook {
            max_passes: self.self_refine_passes,
            min_bytes: self.self_refine_min_bytes,
            exclude,
            ..Default::default()
        })
    }
}

/// A model option, `MODEL`, `MODEL@BACKEND` or `@BACKEND` (the backend's default model).
pub fn model_spec(flag: &str, value: Option<&str>) -> Result<Option<common::ModelSpec>, String> {
    let Some(value) = value else { return Ok(None) };
    let (model, backend) = value.rsplit_once('@').unwrap_or((value, ""));
    if model.trim().is_empty() && backend.trim().is_empty() {
        return Err(format!("{flag} {value:?}: give MODEL, MODEL@BACKEND or @BACKEND"));
    }
    Ok(Some(common::ModelSpec { backend: backend.trim().into(), model: model.trim().into(), ..Default::default() }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn csv_and_json_lines_map_a_datasets_own_names_and_name_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let csv_path = dir.path().join("hub.csv");
        std::fs::write(&csv_path, "qid,question,answer,extra\n7,\"Why, though?\",Because.,x\n8,What?,That.,y\n")
            .unwrap();
        let fields = FieldMap { input: Some("question".into()), target: Some("answer".into()), id: Some("qid".into()) };
        let got: Vec<gw::EvalRecord> = RecordLines::open_mapped(&csv_path, fields.clone(), Needs::default())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].id.as_str(), got[0].input.as_str(), got[0].target.as_str()),
            ("7", "Why, though?", "Because.")
        );
        assert_eq!(RecordLines::count(&csv_path).unwrap(), 2);
        // A column that is not there: refused at once, with the columns there are.
        let wrong = FieldMap { input: Some("prompt".into()), ..FieldMap::default() };
        let Err(e) = RecordLines::open_mapped(&csv_path, wrong, Needs::default()) else {
            panic!("a missing column is refused")
        };
        assert!(e.contains("hub.csv:1") && e.contains("\"prompt\"") && e.contains("--input-field"), "{e}");
        assert!(e.contains("qid, question, answer, extra"), "{e}");
        // JSON lines: the line without the field is named.
        let jsonl = dir.path().join("hub.jsonl");
        std::fs::write(&jsonl, "{\"question\": \"a\"}\n\n{\"prompt\": \"b\"}\n").unwrap();
        let mapped = FieldMap { input: Some("question".into()), ..FieldMap::default() };
        let read: Vec<Result<gw::EvalRecord, String>> =
            RecordLines::open_mapped(&jsonl, mapped, Needs::default()).unwrap().collect();
        assert_eq!(read[0].as_ref().unwrap().input, "a");
        let e = read[1].as_ref().unwrap_err();
        assert!(e.contains("hub.jsonl:3") && e.contains("\"question\"") && e.contains("--input-field"), "{e}");
    }

    #[test]
    fn samples_are_a_count_or_a_file_and_reach_the_scorer_settings() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            corpus: CorpusArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("assay").chain(args.iter().copied()));
        let c = parse(&["--samples", "3", "--samples", "scored.jsonl", "--sample-model", "j1", "--sample-model", "j2"])
            .unwrap()
            .corpus;
        assert_eq!(c.judge_samples(), Some(3));
        assert_eq!(c.scored_samples(), Some(Path::new("scored.jsonl")));
        let scorer = c.with_sampling(None).unwrap().unwrap();
        assert_eq!((scorer.samples, scorer.sample_models), (Some(3), vec!["j1".to_string(), "j2".to_string()]));
        // Other settings are kept.
        let mode = common::ScorerConfig { mode: common::ScoringMode::Item as i32, ..Default::default() };
        let scorer = c.with_sampling(Some(mode)).unwrap().unwrap();
        assert_eq!((scorer.mode, scorer.samples), (common::ScoringMode::Item as i32, Some(3)));
        // Nothing given: the settings as they were (one sample, no field set).
        let none = parse(&[]).unwrap().corpus;
        assert_eq!(none.with_sampling(None).unwrap(), None);
        assert!(parse(&["--samples", "0"]).is_err() && parse(&["--samples", "11"]).is_err());
        let blank = parse(&["--samples", "2", "--sample-model", " "]).unwrap().corpus;
        assert!(blank.with_sampling(None).unwrap_err().contains("--sample-model"));
        // A count is not the unit tester's file.
        let count_only = parse(&["--samples", "2", "--refine", "unit_tester"]).unwrap().corpus;
        assert!(count_only.steps("").unwrap_err().contains("needs --samples"));
    }

    #[test]
    fn records_reject_wrong_types() {
        assert!(record_from_json(&json!({"target": 3})).unwrap_err().contains("target"));
        let r = record_from_json(&json!({"id": 7, "target": "t", "candidates": ["a", "b"]})).unwrap();
        assert_eq!(r.id, "7");
        assert_eq!(r.candidates.len(), 2);
    }
}
