//! `assay eval` (a preset generates the checklists) and `assay score` (a checklist from a file):
//! both stream a checklist_eval run through the gateway and write one JSON line per record.

use std::io::Write;
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines;

use assay_domain::generator::MAX_RESPONSE_SAMPLES;
use assay_domain::limits::MAX_RECORDS;

use super::common::{BackendArgs, BudgetArgs, Progress, load_config};
use super::error::{CliError, Ending, Outcome, status_text};
use super::follow::{NoResult, RunFollower, Step, finished_as, follow_run, is_final, start_run};
use super::input::{CorpusArgs, FieldMap, Needs, RecordLines, corpus_request, is_corpus, read_checklist};
use super::render::checklist_eval::{
    checklist_ready_line, comparison_line, record_json, responder_lines, summary_json, summary_line,
};
use super::render::junit::{self, Compared, JunitFile, Questions, RecordCases, Suite};
use super::render::{stage_progress_line, state_name};
use super::session::{Client, Session};
use super::source::{each_result, write_results};

/// Models under test (`assay eval --respond`): each answers every record's input, and its answers
/// are what is scored.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ResponderArgs {
    /// A model under test, `BACKEND:MODEL` (`openai:gpt-4o-mini`, `local:`), `MODEL@BACKEND` or
    /// `MODEL` (repeat for several; the first is the baseline). Each answers every record's input
    /// and its answers are scored; one checklist per input is shared by every responder.
    #[arg(long = "respond", value_name = "MODEL")]
    pub respond: Vec<String>,
    /// A responder prompt template file (`{input}`, `{id}`, `{reference}`, `{history}`; it must
    /// hold `{input}`); repeat to compare prompts: every --respond model answers through every
    /// template (the same model with two templates is two responders). (`--template` is the
    /// judge's prompt.)
    #[arg(long = "respond-template", value_name = "FILE")]
    pub templates: Vec<PathBuf>,
    /// A system message file sent before every responder's prompt.
    #[arg(long = "respond-system", value_name = "FILE")]
    pub system: Option<PathBuf>,
    /// Responses per record and responder (1 to 10), each scored (`--samples` repeats the judge).
    #[arg(long = "respond-samples", value_name = "N", value_parser = response_samples)]
    pub response_samples: Option<u32>,
    /// Exit 1 when a responder is significantly worse than the first (its paired comparison's
    /// interval lies below 0), 5 when a responder could not be evaluated (none of its responses
    /// was scored).
    #[arg(long)]
    pub fail_on_regression: bool,
    /// Stop once decided: take the records in a seeded random order and stop asking new ones once
    /// every responder's comparison with the first is decided (better, worse, or equivalent within
    /// --margin) by an anytime-valid confidence sequence. Needs two or more --respond.
    #[arg(long)]
    pub stop_when_decided: bool,
    /// With --stop-when-decided: the sequence's level (default 0.05, at most 0.5). (`--alpha` is
    /// the selector's weight.)
    #[arg(long = "stop-alpha", value_name = "ALPHA", requires = "stop_when_decided")]
    pub stop_alpha: Option<f64>,
    /// With --stop-when-decided: an interval inside (-MARGIN, +MARGIN) decides "equivalent".
    #[arg(long, value_name = "MARGIN", requires = "stop_when_decided")]
    pub margin: Option<f64>,
    /// With --stop-when-decided: records compared before any decision (default 30).
    #[arg(long, value_name = "N", requires = "stop_when_decided")]
    pub min_records: Option<u32>,
    /// With --stop-when-decided: the seed of the records' order (default: derived from the records).
    #[arg(long = "order-seed", value_name = "SEED", requires = "stop_when_decided")]
    pub order_seed: Option<u64>,
}

impl ResponderArgs {
    /// `--stop-when-decided` and its options, as the pipeline takes them.
    pub fn stop(&self) -> Option<gw::StopWhenDecided> {
        self.stop_when_decided.then(|| gw::StopWhenDecided {
            alpha: self.stop_alpha.unwrap_or_default(),
            margin: self.margin,
            min_records: self.min_records.unwrap_or_default(),
            seed: self.order_seed,
        })
    }

    /// The responders, models by templates.
    pub fn responders(&self) -> Result<Vec<gw::Responder>, String> {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
        let system = self.system.as_deref().map(read).transpose()?.unwrap_or_default();
        let templates: Vec<(String, String)> = if self.templates.is_empty() {
            vec![(String::new(), String::new())]
        } else {
            self.templates
                .iter()
                .map(|p| -> Result<(String, String), String> {
                    let stem = p.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
                    let template = read(p)?;
                    check_template(p, &template)?;
                    Ok((stem, template))
                })
                .collect::<Result<_, _>>()?
        };
        let mut out = Vec::new();
        for value in &self.respond {
            let model = responder_model(value)?;
            for (stem, template) in &templates {
                let base = if model.model.is_empty() { model.backend.clone() } else { model.model.clone() };
                let name = if templates.len() > 1 { format!("{base}/{stem}") } else { String::new() };
                out.push(gw::Responder {
                    name,
                    model: Some(model.clone()),
                    system_prompt: system.clone(),
                    template: template.trim_end_matches('\n').to_string(),
                    samples: self.response_samples.unwrap_or(0),
                });
            }
        }
        if out.is_empty() && (!self.templates.is_empty() || self.response_samples.is_some() || self.system.is_some()) {
            return Err(
                "--respond-template, --respond-system and --respond-samples need at least one --respond MODEL".into()
            );
        }
        Ok(out)
    }
}

/// `--respond-samples N`: 1 to [`MAX_RESPONSE_SAMPLES`] (0 would mean one, silently).
fn response_samples(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_RESPONSE_SAMPLES).contains(&n) => Ok(n),
        Ok(_) | Err(_) => Err(format!("give 1 to {MAX_RESPONSE_SAMPLES} responses per record and responder")),
    }
}

/// A `--respond-template` file's text: refused when it is blank (the default template would stand
/// in for it, silently) or has no `{input}` (every record would get the same prompt).
fn check_template(path: &Path, template: &str) -> Result<(), String> {
    if template.trim().is_empty() {
        let what = if template.is_empty() { "is empty" } else { "holds only whitespace" };
        return Err(format!(
            "--respond-template {}: the file {what}; write the prompt in it with {{input}} where each \
             record's input goes (without --respond-template the input alone is sent)",
            path.display()
        ));
    }
    if !template.contains("{input}") {
        return Err(format!(
            "--respond-template {}: no {{input}} in the template, so every record would get the same \
             prompt; put {{input}} where each record's input goes",
            path.display()
        ));
    }
    Ok(())
}

/// `--respond`: `BACKEND:MODEL` for the built-in backends, `MODEL@BACKEND`, or `MODEL`.
fn responder_model(value: &str) -> Result<common::ModelSpec, String> {
    if !value.contains('@')
        && let Some((backend, model)) = value.split_once(':')
        && ["openai", "local"].contains(&backend)
    {
        return Ok(common::ModelSpec { backend: backend.into(), model: model.trim().into(), ..Default::default() });
    }
    Ok(super::input::model_spec("--respond", Some(value))?.unwrap_or_default())
}

/// Options of `assay eval`.
#[derive(clap::Args, Clone)]
pub struct EvalArgs {
    /// Preset: tick, rocketeval, rlcf_direct, rlcf_candidate, rlcf_candidates_only,
    /// openrubrics_pairwise, openrubrics_listwise; or a corpus preset (feedback, checkeval,
    /// interacteval) with --observations / --dimensions: one checklist for every record.
    #[arg(long)]
    pub preset: String,
    /// Override the preset's maximum number of checklist items.
    #[arg(long)]
    pub max_items: Option<u32>,
    #[command(flatten)]
    pub corpus: CorpusArgs,
    #[command(flatten)]
    pub responders: ResponderArgs,
    #[command(flatten)]
    pub scoring: ScoringArgs,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Options of `assay score`.
#[derive(clap::Args, Clone)]
pub struct ScoreArgs {
    /// Checklist file (JSON).
    #[arg(long)]
    pub checklist: PathBuf,
    /// Judge each item this many times (1 to 10): per item the majority answer, its yes-share
    /// and a flaky flag; per record the mean over samples and its spread.
    #[arg(long)]
    pub samples: Option<u32>,
    /// A judge model for the samples, used round-robin (repeat for several).
    #[arg(long = "sample-model")]
    pub sample_models: Vec<String>,
    #[command(flatten)]
    pub scoring: ScoringArgs,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// The judge's options of `eval` and `score`.
#[derive(clap::Args, Clone)]
pub struct ScoringArgs {
    /// Scoring mode: batch (one call per record) or item (one call per question). Unset: the
    /// preset's.
    #[arg(long)]
    pub mode: Option<String>,
    /// Primary metric: pass, weighted or normalized (normalized turns logprobs on). Unset: the
    /// preset's.
    #[arg(long)]
    pub metric: Option<String>,
    /// Ask the judge for a reason per item (`--reasoning=false` to turn it off).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub reasoning: Option<bool>,
    /// Ask for first-token logprobs, a confidence per item (`--logprobs=false` turns off the
    /// preset's). Unset: the preset's.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub logprobs: Option<bool>,
    /// Built-in scoring prompt: default, rlcf or rocketeval. Unset: the preset's.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Custom prompt template file ({input} {target} {question} or {checklist} {history} {reference}).
    #[arg(long)]
    pub template: Option<PathBuf>,
    /// Most model calls in flight per scored record (0 = the scorer's default).
    #[arg(long, default_value_t = 0)]
    pub scorer_concurrency: u32,
}

impl ScoringArgs {
    /// The scorer settings, or None when nothing was set: unset fields take the preset's defaults.
    pub fn config(&self) -> Result<Option<common::ScorerConfig>, String> {
        let mode = match self.mode.as_deref() {
            None => common::ScoringMode::Unspecified,
            Some(m) => common::ScoringMode::from_str_name(&format!("SCORING_MODE_{}", m.to_ascii_uppercase()))
                .ok_or_else(|| format!("unknown --mode {m:?} (batch, item)"))?,
        };
        let metric = match self.metric.as_deref() {
            None => common::PrimaryMetric::Unspecified,
            Some(m) => common::PrimaryMetric::from_str_name(&format!("PRIMARY_METRIC_{}", m.to_ascii_uppercase()))
                .ok_or_else(|| format!("unknown --metric {m:?} (pass, weighted, normalized)"))?,
        };
        let prompt = match self.prompt.as_deref() {
            None => common::ScoringPrompt::Unspecified,
            Some(m) => common::ScoringPrompt::from_str_name(&format!("SCORING_PROMPT_{}", m.to_ascii_uppercase()))
                .filter(|p| *p != common::ScoringPrompt::Unspecified)
                .ok_or_else(|| format!("unknown --prompt {m:?} (default, rlcf, rocketeval)"))?,
        };
        let prompt_template = match &self.template {
            Some(p) => std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
            None => String::new(),
        };
        let config = common::ScorerConfig {
            mode: mode as i32,
            primary_metric: metric as i32,
            capture_reasoning: self.reasoning,
            use_logprobs: self.logprobs,
            prompt_template,
            concurrency: self.scorer_concurrency,
            prompt: prompt as i32,
            samples: None,
            sample_models: Vec::new(),
        };
        Ok(Some(config).filter(|c| *c != common::ScorerConfig::default()))
    }
}

/// The records, the output and the run's options of `eval` and `score`.
#[derive(clap::Args, Clone)]
pub struct RunArgs {
    /// Input records: JSON lines, or a CSV file (`.csv`, its first row the column names).
    #[arg(long)]
    pub data: PathBuf,
    /// Output (JSON lines); standard output when absent.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Gateway address (e.g. http://127.0.0.1:50051); absent = start the mesh in this process.
    #[arg(long)]
    pub gateway: Option<String>,
    /// Print the final summary as one JSON line on standard output.
    #[arg(long)]
    pub json: bool,
    /// Stream the records into an open run (read as they are sent, results read back in pages)
    /// whatever their number; files over 10,000 records always are.
    #[arg(long)]
    pub open: bool,
    /// The field (JSON lines) or column (a `.csv` file, first row the names) holding each record's
    /// input, e.g. `question` or `prompt`.
    #[arg(long, value_name = "NAME")]
    pub input_field: Option<String>,
    /// The field or column holding each record's target (the response scored), e.g. `answer`.
    #[arg(long, value_name = "NAME")]
    pub target_field: Option<String>,
    /// The field or column holding each record's id.
    #[arg(long, value_name = "NAME")]
    pub id_field: Option<String>,
    /// Also write the results as a JUnit XML report to FILE, for CI systems: a test case per
    /// record (per record and responder with --respond), failed below --pass-threshold, in error
    /// when the record failed or was left unscored; with responders, each comparison with the
    /// first is a test case too, failed when it regressed. Written whole (a temporary file
    /// renamed over FILE), also when the run ends partial; a run that fails leaves a report of
    /// one test case in error. The exit code is the same with or without it.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// With --junit: a scored record whose primary score is below SCORE (0 to 1) is a failed test
    /// case, its message the score, the threshold and the items answered NO. It shapes the report
    /// only; the exit code stays as documented.
    #[arg(long, value_name = "SCORE", requires = "junit", value_parser = unit_score)]
    pub pass_threshold: Option<f64>,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

impl RunArgs {
    fn into_options(self, verb: &'static str) -> RunOptions {
        let junit = self.junit.map(|path| JunitArgs { path, threshold: self.pass_threshold, verb });
        RunOptions {
            data: self.data,
            out: self.out,
            gateway: self.gateway,
            json: self.json,
            budget: self.budget.budget(),
            open: self.open,
            fail_on_regression: false,
            fields: FieldMap { input: self.input_field, target: self.target_field, id: self.id_field },
            junit,
        }
    }
}

/// `--pass-threshold`: a primary score, 0 to 1.
fn unit_score(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        Ok(_) | Err(_) => Err("give a primary score from 0 to 1".into()),
    }
}

/// `--junit FILE` and `--pass-threshold` of `eval` / `score`.
#[derive(Clone)]
pub struct JunitArgs {
    pub path: PathBuf,
    pub threshold: Option<f64>,
    /// `eval` or `score`.
    pub verb: &'static str,
}

/// A verb that failed still writes its `--junit` report, one test case in error: a CI system then
/// shows the failure, never an older report's results.
fn junit_on_error(junit: Option<(PathBuf, PathBuf)>, verb: &str, outcome: Outcome) -> Outcome {
    if let (Some((path, data)), Err(e)) = (&junit, &outcome)
        && let Err(w) = junit::write_error(path, verb, &data.display().to_string(), e.message())
    {
        eprintln!("assay: {w}");
    }
    outcome
}

/// `assay eval` with the configuration at `config` (`--config`): 0 all scored, 3 some records
/// failed, 1 the run failed or its input was refused (this verb does not tell bad input apart), 2 a
/// malformed option (clap's); with --fail-on-regression 1 a regression, 5 an unevaluated responder.
pub async fn run(config: Option<&Path>, args: EvalArgs) -> Outcome {
    let junit = args.run.junit.clone().map(|p| (p, args.run.data.clone()));
    let outcome = async {
        let config = load_config(config, &args.backend)?;
        let scorer = args.scoring.config().map_err(CliError::Failed)?;
        let options = args.run.into_options("eval");
        eval(&config, &args.preset, args.max_items, scorer, &args.corpus, &args.responders, options).await
    };
    said_why(junit_on_error(junit, "eval", outcome.await.map_err(CliError::failed)))
}

/// `assay score` with the configuration at `config` (`--config`): the exit codes of `eval`.
pub async fn run_score(config: Option<&Path>, args: ScoreArgs) -> Outcome {
    let junit = args.run.junit.clone().map(|p| (p, args.run.data.clone()));
    let outcome = async {
        let config = load_config(config, &args.backend)?;
        let mut scorer = args.scoring.config().map_err(CliError::Failed)?.unwrap_or_default();
        scorer.samples = args.samples;
        scorer.sample_models = args.sample_models;
        score(&config, &args.checklist, scorer, args.run.into_options("score")).await
    };
    said_why(junit_on_error(junit, "score", outcome.await.map_err(CliError::failed)))
}

/// The gate's verdict said on standard error, after the run.
fn said_why(outcome: Outcome) -> Outcome {
    match outcome {
        Ok(Ending::Regressed) => {
            eprintln!("assay: a responder is significantly worse than the first (--fail-on-regression)");
        }
        Ok(Ending::Unevaluated) => eprintln!(
            "assay: a responder could not be evaluated: none of its responses was scored (--fail-on-regression)"
        ),
        Ok(_) | Err(_) => {}
    }
    outcome
}

/// Why a run without responders needs each record's target (a CSV file without its column is
/// refused).
const SCORED_TARGET: &str = "each record's target is the response scored";

/// Options shared by `eval` and `score`, as the run takes them.
pub struct RunOptions {
    pub data: PathBuf,
    pub out: Option<PathBuf>,
    pub gateway: Option<String>,
    pub json: bool,
    pub budget: Option<gw::RunBudget>,
    /// Stream the records into an open run whatever their number.
    pub open: bool,
    /// With responders: end with [`Ending::Regressed`] when one is significantly worse than
    /// the first.
    pub fail_on_regression: bool,
    /// The dataset's names of the record fields (`--input-field`, ...).
    pub fields: FieldMap,
    /// `--junit FILE` and its threshold.
    pub junit: Option<JunitArgs>,
}

/// `assay eval`: generate with a preset, score every record.
pub async fn eval(
    config: &AssayConfig,
    preset: &str,
    max_items: Option<u32>,
    scorer: Option<common::ScorerConfig>,
    corpus: &CorpusArgs,
    responders: &ResponderArgs,
    args: RunOptions,
) -> Outcome {
    let preset = super::common::preset(preset).map_err(CliError::Failed)?;
    // `--samples N` / `--sample-model`: repeated judging, over the scoring options.
    let scorer = corpus.with_sampling(scorer).map_err(CliError::Failed)?;
    let respond = responders.responders().map_err(CliError::Failed)?;
    // With responders each record makes a result per responder and sample: a request holds
    // fewer records, and a larger file goes into an open run.
    let per_record = respond.iter().map(|r| r.samples.max(1) as usize).sum::<usize>().max(1);
    let needs = if respond.is_empty() {
        Needs {
            input: (!is_corpus(preset)).then_some("the preset generates each record's checklist from its input"),
            target: Some(SCORED_TARGET),
        }
    } else {
        // The responders write the targets.
        Needs { input: Some("the responders answer each record's input"), target: None }
    };
    let records = Records::read(&args.data, args.open, &args.fields, needs, MAX_RECORDS / per_record)
        .map_err(CliError::Failed)?;
    let source = if is_corpus(preset) {
        gw::checklist_source::Source::Corpus(corpus_request(preset, corpus).map_err(CliError::Failed)?)
    } else {
        gw::checklist_source::Source::Preset(preset as i32)
    };
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(source) }),
        max_items,
        scorer,
        refiners: corpus.steps("").map_err(CliError::Failed)?,
        candidate_models: corpus.candidate_specs().map_err(CliError::Failed)?,
        responders: respond,
        stop_when_decided: responders.stop(),
        ..Default::default()
    };
    let args = RunOptions { fail_on_regression: responders.fail_on_regression, ..args };
    run_pipeline(config, pipeline, records, format!("assay eval {}", args.data.display()), &args).await
}

/// `assay score`: score every record against one checklist.
pub async fn score(config: &AssayConfig, checklist: &Path, scorer: common::ScorerConfig, args: RunOptions) -> Outcome {
    let checklist = read_checklist(checklist).map_err(CliError::Failed)?;
    let needs = Needs { input: None, target: Some(SCORED_TARGET) };
    let records = Records::read(&args.data, args.open, &args.fields, needs, MAX_RECORDS).map_err(CliError::Failed)?;
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist)) }),
        scorer: Some(scorer),
        ..Default::default()
    };
    run_pipeline(config, pipeline, records, format!("assay score {}", args.data.display()), &args).await
}

/// A records file: up to `whole` records (the per-request limit), read whole (the run carries
/// them); past it, streamed into an open run.
enum Records {
    Whole(Vec<gw::EvalRecord>),
    Streamed { total: u64, lines: Box<RecordLines> },
}

impl Records {
    fn read(path: &Path, open: bool, fields: &FieldMap, needs: Needs, whole: usize) -> Result<Self, String> {
        let mut lines = RecordLines::open_mapped(path, fields.clone(), needs)?;
        let mut head = Vec::new();
        for r in lines.by_ref() {
            head.push(r?);
            if head.len() > whole || open {
                // Counted apart (flat memory) for the progress bar, then read again as it is sent.
                let total = RecordLines::count(path)?;
                return Ok(Records::Streamed {
                    total,
                    lines: Box::new(RecordLines::open_mapped(path, fields.clone(), needs)?),
                });
            }
        }
        if head.is_empty() {
            return Err(format!("{}: no records", path.display()));
        }
        Ok(Records::Whole(head))
    }
}

async fn run_pipeline(
    config: &AssayConfig,
    mut pipeline: gw::ChecklistEvalPipeline,
    records: Records,
    label: String,
    args: &RunOptions,
) -> Outcome {
    // The report's place is checked before the mesh starts.
    let junit = match &args.junit {
        Some(j) => Some(JunitRun {
            file: JunitFile::create(&j.path).map_err(CliError::Failed)?,
            cases: RecordCases {
                verb: j.verb,
                label: args.data.display().to_string(),
                threshold: j.threshold,
                sampled: pipeline.responders.iter().any(|r| r.samples > 1),
            },
        }),
        None => None,
    };
    let mut session = Session::open(config, args.gateway.as_deref()).await?;
    // With responders each record is scored once per responder and sample.
    let per_record = pipeline.responders.iter().map(|r| r.samples.max(1) as usize).sum::<usize>().max(1);
    let outcome = match records {
        Records::Whole(records) => {
            let total = records.len() * per_record;
            pipeline.records = records;
            stream(&mut session, pipeline, label, total, None, junit, args).await
        }
        Records::Streamed { total: records, lines } => {
            let records = usize::try_from(records).unwrap_or(usize::MAX);
            let total = records.saturating_mul(per_record);
            stream(&mut session, pipeline, label, total, Some((*lines, records)), junit, args).await
        }
    };
    session.close().await?;
    outcome
}

/// Run `pipeline` and follow it: `total` results (records x responses per record); `streamed`,
/// a file's records and how many, sent into the open run beside its events; `junit`, the report
/// to write.
async fn stream(
    session: &mut Session,
    pipeline: gw::ChecklistEvalPipeline,
    label: String,
    total: usize,
    streamed: Option<(RecordLines, usize)>,
    junit: Option<JunitRun>,
    args: &RunOptions,
) -> Outcome {
    let request = gw::RunPipelineRequest {
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)),
        label,
        budget: args.budget,
        open: streamed.is_some(),
    };
    // Pipeline time: from the request to the run's last event (no process or mesh start).
    let started = std::time::Instant::now();
    let started_at = std::time::SystemTime::now();
    let mut events = start_run(&mut session.client, request).await?;
    let out: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| CliError::Failed(format!("{}: {e}", p.display())))?,
        )),
        None => Box::new(std::io::stdout()),
    };
    let mut follower = Follower {
        out,
        progress: Progress::new(total as u64, "records"),
        failed: 0,
        total,
        run_id: String::new(),
        started,
        json: args.json,
        paged: None,
        fail_on_regression: args.fail_on_regression,
        junit,
        started_at,
    };
    let Some((lines, records)) = streamed else {
        return follow_run(&mut session.client, events, &mut follower).await;
    };
    // An open run: its id from the first event, then the file sent beside the run's events.
    let first = match futures::StreamExt::next(&mut events).await {
        Some(Ok(ev)) => ev,
        Some(Err(s)) => return Err(CliError::Failed(status_text(&s))),
        None => return Err(CliError::Failed("the gateway closed the run's events before the first".into())),
    };
    let run_id = first.run_id.clone();
    follower.paged = Some(None);
    if let Step::Done(outcome) = follower.on_event(first) {
        return outcome;
    }
    let mut sender = tokio::spawn(send_records(session.client.clone(), run_id.clone(), lines, records));
    let mut control = session.client.clone();
    let mut sent = false;
    let followed = {
        let follow = follow_run(&mut session.client, events, &mut follower);
        tokio::pin!(follow);
        loop {
            tokio::select! {
                r = &mut follow => break r,
                s = &mut sender, if !sent => {
                    sent = true;
                    let e = match s {
                        Ok(Ok(())) => continue,
                        Ok(Err(e)) => e,
                        Err(e) => format!("sending the records: {e}"),
                    };
                    // A run that ended first (one that stops when decided ends once decided,
                    // sealed or not) refuses the rest: how it ended is what the events say.
                    let state = control.get_run(gw::GetRunRequest { run_id: run_id.clone() }).await;
                    if state.is_ok_and(|r| r.into_inner().run.is_some_and(|r| is_final(r.state))) {
                        continue;
                    }
                    // The run cannot be sealed: cancelled, with what it scored kept.
                    let cancel = gw::ControlRunRequest {
                        run_id: run_id.clone(),
                        action: Some(gw::control_run_request::Action::Cancel(gw::CancelRun {})),
                        actor: "assay".into(),
                        reason: "the records file could not be sent whole".into(),
                    };
                    let _ = control.control_run(cancel).await;
                    return Err(CliError::Failed(format!(
                        "{e}; run {run_id} cancelled (what it scored: assay runs results {run_id})"
                    )));
                }
            }
        }
    };
    followed?;
    let Some(Some((state, result))) = follower.paged.take() else {
        return Err(CliError::Failed(format!("run {run_id} ended without a result")));
    };
    let failed = match &mut follower.junit {
        None => write_results(&mut session.client, &run_id, &mut follower.out).await.map_err(CliError::Failed)?,
        // The lines and the test cases from one read of the results.
        Some(junit) => {
            let (out, mut failed) = (&mut follower.out, 0u64);
            each_result(&mut session.client, &run_id, |r| {
                failed += u64::from(r.score.is_none());
                writeln!(out, "{}", record_json(&r)).map_err(|e| e.to_string())?;
                junit.file.add(&junit.cases.case(&r, &Questions::default()))
            })
            .await
            .map_err(CliError::Failed)?;
            failed
        }
    };
    follower.failed = failed;
    follower.completed(state, result)
}

/// Write the `--junit` report of a completed evaluation: a test case per result (those of a run read
/// in pages were added as they were read), then with responders a suite of their comparisons.
fn write_junit(
    mut junit: JunitRun,
    run_id: &str,
    state: i32,
    e: &gw::EvaluateResponse,
    seconds: f64,
    started: std::time::SystemTime,
    summary: String,
) -> Result<(), CliError> {
    let questions = Questions::of(&e.checklists);
    if !e.results_paged {
        for r in &e.results {
            junit.file.add(&junit.cases.case(r, &questions)).map_err(CliError::Failed)?;
        }
    }
    let RecordCases { verb, label, threshold, .. } = &junit.cases;
    let file = Path::new(label).file_name().map_or_else(|| label.clone(), |n| n.to_string_lossy().into_owned());
    let mut properties = vec![
        ("run_id".to_string(), run_id.to_string()),
        ("state".to_string(), state_name(state)),
        ("data".to_string(), label.clone()),
    ];
    if let Some(a) = &e.aggregate {
        properties.push(("mean_primary_score".into(), format!("{:.4}", a.mean_primary_score)));
    }
    if let Some(t) = threshold {
        properties.push(("pass_threshold".into(), t.to_string()));
    }
    let suite = |name: String, out: String| Suite {
        name,
        package: format!("assay.{verb}"),
        started,
        seconds,
        properties: properties.clone(),
        out,
    };
    let comparisons: Vec<junit::Case> = e
        .comparisons
        .iter()
        .map(|c| {
            let method = gw::CompareMethod::try_from(c.method)
                .map(|m| m.as_str_name().trim_start_matches("COMPARE_METHOD_").to_lowercase())
                .unwrap_or_default();
            let gate = c.gate.clone().unwrap_or_default();
            let numbers = Compared {
                diff: c.diff,
                ci: (c.ci_low, c.ci_high),
                alpha: c.alpha,
                p_value: c.p_value,
                method: &method,
                pairs: c.n_pairs.map(u64::from),
                regressed: gate.regressed,
                reason: &gate.reason,
            };
            let name = format!("{} vs {}", c.candidate_run_id, c.baseline_run_id);
            junit::comparison_case(junit::classname(verb, label, Some("comparisons")), name, &numbers)
        })
        .collect();
    let more = if comparisons.is_empty() {
        Vec::new()
    } else {
        vec![(suite(format!("assay {verb} {file}: responders compared"), String::new()), comparisons)]
    };
    junit.file.finish(&suite(format!("assay {verb} {file}"), summary), &more).map_err(CliError::Failed)?;
    Ok(())
}

/// Bytes of records per AppendRecords message at most.
const MAX_APPEND_BYTES: usize = 16 * 1024 * 1024;

/// Send the rest of a records file into open run `run_id` over one AppendRecords call, at most
/// [`MAX_RECORDS`] per message, then seal it. The file is read on a blocking thread as the call
/// takes the messages (two in flight at most).
async fn send_records(mut client: Client, run_id: String, lines: RecordLines, total: usize) -> Result<(), String> {
    let (tx, rx) = tokio::sync::mpsc::channel::<gw::AppendRecordsRequest>(2);
    let id = run_id.clone();
    let reader = tokio::task::spawn_blocking(move || -> Result<u64, String> {
        let mut batch = Vec::with_capacity(MAX_RECORDS);
        let mut bytes = 0usize;
        let mut sent = 0u64;
        let mut lines = lines.peekable();
        while let Some(r) = lines.next() {
            let r = r?;
            bytes += prost::Message::encoded_len(&r);
            batch.push(r);
            let last = lines.peek().is_none();
            // A message goes at 10,000 records, or early at 16 MiB (the gateway takes up to 64 MiB).
            if batch.len() == MAX_RECORDS || bytes >= MAX_APPEND_BYTES || last {
                bytes = 0;
                sent += batch.len() as u64;
                let message =
                    gw::AppendRecordsRequest { run_id: id.clone(), records: std::mem::take(&mut batch), seal: last };
                if tx.blocking_send(message).is_err() {
                    break;
                }
            }
        }
        Ok(sent)
    });
    let mut rx = rx;
    let call = client.append_records(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    let (reply, read) = tokio::join!(call, reader);
    let sent = read.map_err(|e| format!("reading the records: {e}"))??;
    let reply = reply.map_err(|s| format!("sending the records to run {run_id}: {}", status_text(&s)))?.into_inner();
    if !reply.sealed || sent as usize != total {
        return Err(format!("run {run_id} took {} of the {total} records", reply.records_total));
    }
    Ok(())
}

/// Follows one evaluation run ([`follow_run`]): a line per scored record, progress notes, then the
/// summary.
struct Follower {
    /// Where the records' lines go (`--out`, else standard output).
    out: Box<dyn Write>,
    progress: Progress,
    /// Records failed so far.
    failed: u64,
    total: usize,
    run_id: String,
    started: std::time::Instant,
    /// Print the summary as JSON on standard output.
    json: bool,
    /// An open run: its results are read in pages once it ends, not written from its events;
    /// `Some(None)` until it ends, then how it ended.
    paged: Option<Option<(i32, Option<gw::RunResult>)>>,
    /// `--fail-on-regression`.
    fail_on_regression: bool,
    /// `--junit`: the report, written when the run completes.
    junit: Option<JunitRun>,
    /// When the run was started (the report's timestamp).
    started_at: std::time::SystemTime,
}

/// The `--junit` report of a run.
struct JunitRun {
    file: JunitFile,
    cases: RecordCases,
}

impl RunFollower for Follower {
    type Ending = Ending;
    fn on_event(&mut self, ev: gw::RunEvent) -> Step<Outcome> {
        use gw::run_event::Event;
        self.run_id.clone_from(&ev.run_id);
        match ev.event {
            Some(Event::Started(_)) => self.progress.note(&format!("run {} started", self.run_id)),
            Some(Event::ChecklistReady(c)) => self.progress.note(&checklist_ready_line(&c)),
            Some(Event::Progress(p)) => {
                if let Some(p) = p.progress {
                    self.progress.note(&stage_progress_line(&p));
                }
            }
            Some(Event::RecordScored(r)) => {
                self.failed += u64::from(r.score.is_none());
                if self.paged.is_none()
                    && let Err(e) = writeln!(self.out, "{}", record_json(&r))
                {
                    return Step::Done(Err(e.into()));
                }
                self.progress.inc(self.failed);
            }
            // The comparison's interval, after the counts of the progress line.
            Some(Event::ComparisonUpdated(c)) => self.progress.set_detail(comparison_line(&c)),
            Some(Event::Completed(c)) => return Step::Done(self.ended(c.state, c.result)),
            // The kinds this verb leaves to `assay runs watch` (render::events words every kind).
            Some(_) | None => {}
        }
        Step::Continue
    }

    fn on_stream_end(&mut self, run: gw::Run) -> Option<Outcome> {
        is_final(run.state).then(|| self.ended(run.state, run.result))
    }
}

impl Follower {
    /// The run ended: finish now, or (an open run) keep how it ended for after its results are read.
    fn ended(&mut self, state: i32, result: Option<gw::RunResult>) -> Outcome {
        match &mut self.paged {
            Some(ended) => {
                *ended = Some((state, result));
                Ok(Ending::Done)
            }
            None => self.completed(state, result),
        }
    }

    /// The run completed: flush the lines, print the summary, map the outcome.
    fn completed(&mut self, state: i32, result: Option<gw::RunResult>) -> Outcome {
        let pipeline_s = self.started.elapsed().as_secs_f64();
        self.out.flush()?;
        self.progress.finish();
        let run_id = &self.run_id;
        let e = match finished_as::<pipelines::ChecklistEval>(state, result, "evaluation") {
            Ok(e) => e,
            Err(e @ NoResult::Missing(_)) => return Err(CliError::Failed(e.message(run_id))),
            Err(NoResult::Cancelled) => {
                let cancelled = NoResult::Cancelled.message(run_id);
                return Err(CliError::Failed(format!("{cancelled}; the records scored before are written above")));
            }
            Err(e) => return Err(CliError::Failed(e.message(run_id))),
        };
        let failed = self.failed;
        if self.json {
            outln!("{}", summary_json(run_id, state, self.total, failed, &e, pipeline_s).map_err(CliError::Failed)?);
        } else {
            eprintln!("{}", summary_line(run_id, self.total, failed, &e, pipeline_s));
            for line in responder_lines(&e) {
                eprintln!("{line}");
            }
        }
        if let Some(junit) = self.junit.take() {
            let summary = std::iter::once(summary_line(run_id, self.total, failed, &e, pipeline_s))
                .chain(responder_lines(&e))
                .collect::<Vec<_>>()
                .join("\n");
            write_junit(junit, run_id, state, &e, pipeline_s, self.started_at, summary)?;
        }
        let regressed = e.comparisons.iter().any(|c| c.gate.as_ref().is_some_and(|g| g.regressed));
        let unevaluated = e.responders.iter().any(|r| r.aggregate.is_none());
        Ok(if self.fail_on_regression && unevaluated {
            Ending::Unevaluated
        } else if self.fail_on_regression && regressed {
            Ending::Regressed
        } else if failed == 0 {
            Ending::Done
        } else {
            Ending::Partial
        })
    }
}
