//! Property tests of the wire <-> domain conversions (`assay_proto::convert`), over arbitrary wire
//! messages built from the contracts' own descriptors (every field, any value: empty, huge, NaN,
//! unknown enum numbers, control characters, nested messages and maps):
//! - no conversion panics;
//! - a refused request is INVALID_ARGUMENT (FAILED_PRECONDITION for a debate stage whose earlier
//!   stage is missing), and every violation names a field path that exists in the request message
//!   (`checklist.items[1].weight`, `criterion_scores["x"]`);
//! - a valid domain value goes to the wire and back unchanged;
//! - reading a stage's response is idempotent (what was read, written and read again, is the same).

use std::cell::Cell;
use std::fmt::Debug;

use assay_domain::StageError;
use assay_proto::convert;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, Kind, MapKey, MessageDescriptor, Value};

const CASES: u32 = 256;
/// Nesting depth of generated messages (requests nest about four deep).
const DEPTH: u32 = 5;

fn config() -> Config {
    Config { cases: CASES, failure_persistence: None, ..Config::default() }
}

fn pool() -> DescriptorPool {
    DescriptorPool::decode(assay_proto::FILE_DESCRIPTOR_SET).expect("the contracts' descriptors decode")
}

// ---------------------------------------------------------------------------------------------
// Arbitrary wire messages from descriptors.

/// How values are drawn: `Wild` anything (empty, huge, NaN, unknown enum numbers, control
/// characters), `Tame` values that mostly pass the checks (so valid requests come up often enough
/// to test their round trip).
#[derive(Debug, Clone, Copy)]
enum Mode {
    Wild,
    Tame,
}

/// Short words (ids and texts that pass; a small vocabulary so ids that must match sometimes do),
/// blanks, control characters, any Unicode, strings around the id limit.
fn text(mode: Mode) -> BoxedStrategy<String> {
    let words = prop_oneof![
        2 => proptest::sample::select(vec!["a", "b", "c"]).prop_map(String::from),
        3 => "[a-z][a-z0-9_]{0,7}",
    ];
    match mode {
        Mode::Tame => words.boxed(),
        Mode::Wild => prop_oneof![
            6 => words,
            2 => Just(String::new()),
            1 => r"[ \t\n\r\x0B\x0C\x00\x1B]{1,4}",
            2 => any::<String>(),
            1 => "[a-z ]{250,270}",
        ]
        .boxed(),
    }
}

fn double(mode: Mode) -> BoxedStrategy<f64> {
    match mode {
        Mode::Tame => (0.0..=1.0f64).boxed(),
        Mode::Wild => prop_oneof![
            6 => 0.0..=1.0f64,
            1 => Just(f64::NAN),
            1 => prop_oneof![Just(f64::INFINITY), Just(f64::NEG_INFINITY)],
            1 => -10.0..10.0f64,
            1 => any::<f64>(),
        ]
        .boxed(),
    }
}

fn unsigned(mode: Mode) -> BoxedStrategy<u32> {
    match mode {
        Mode::Tame => (1u32..4).boxed(),
        Mode::Wild => prop_oneof![6 => 0u32..6, 1 => any::<u32>()].boxed(),
    }
}

fn scalar(kind: &Kind, mode: Mode) -> Option<BoxedStrategy<Value>> {
    let tame = matches!(mode, Mode::Tame);
    Some(match kind {
        Kind::Double => double(mode).prop_map(Value::F64).boxed(),
        Kind::Float => double(mode).prop_map(|x| Value::F32(x as f32)).boxed(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 if tame => (0i32..10).prop_map(Value::I32).boxed(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => any::<i32>().prop_map(Value::I32).boxed(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 if tame => (0i64..1_000_000).prop_map(Value::I64).boxed(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => any::<i64>().prop_map(Value::I64).boxed(),
        Kind::Uint32 | Kind::Fixed32 => unsigned(mode).prop_map(Value::U32).boxed(),
        Kind::Uint64 | Kind::Fixed64 if tame => (1_000u64..20_000).prop_map(Value::U64).boxed(),
        Kind::Uint64 | Kind::Fixed64 => prop_oneof![6 => 0u64..20_000, 1 => any::<u64>()].prop_map(Value::U64).boxed(),
        Kind::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        Kind::String => text(mode).prop_map(Value::String).boxed(),
        Kind::Enum(e) => {
            let known: Vec<i32> = e.values().map(|v| v.number()).collect();
            let set: Vec<i32> = known.iter().copied().filter(|n| *n != 0).collect();
            if tame && !set.is_empty() {
                proptest::sample::select(set).prop_map(Value::EnumNumber).boxed()
            } else {
                prop_oneof![6 => proptest::sample::select(known), 1 => any::<i32>()].prop_map(Value::EnumNumber).boxed()
            }
        }
        Kind::Bytes | Kind::Message(_) => return None,
    })
}

fn map_key(kind: &Kind, mode: Mode) -> BoxedStrategy<MapKey> {
    match kind {
        Kind::String => text(mode).prop_map(MapKey::String).boxed(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => any::<i32>().prop_map(MapKey::I32).boxed(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => any::<i64>().prop_map(MapKey::I64).boxed(),
        Kind::Uint32 | Kind::Fixed32 => unsigned(mode).prop_map(MapKey::U32).boxed(),
        Kind::Uint64 | Kind::Fixed64 => any::<u64>().prop_map(MapKey::U64).boxed(),
        Kind::Bool => any::<bool>().prop_map(MapKey::Bool).boxed(),
        Kind::Double | Kind::Float | Kind::Bytes | Kind::Enum(_) | Kind::Message(_) => {
            unreachable!("not a map key type")
        }
    }
}

/// One value of a singular field of `kind` (`None`: the field's kind cannot be generated here).
fn single(kind: &Kind, depth: u32, mode: Mode) -> Option<BoxedStrategy<Value>> {
    if let Kind::Message(m) = kind {
        (depth > 0).then(|| message(m.clone(), depth - 1, mode).prop_map(Value::Message).boxed())
    } else {
        scalar(kind, mode)
    }
}

/// Every field of `desc`, each set or left unset.
fn message(desc: MessageDescriptor, depth: u32, mode: Mode) -> BoxedStrategy<DynamicMessage> {
    let sizes = match mode {
        Mode::Wild => 0..4,
        Mode::Tame => 1..4,
    };
    let fields: Vec<_> = desc
        .fields()
        .filter_map(|field| {
            let kind = field.kind();
            let value: BoxedStrategy<Value> = if field.is_map() {
                let Kind::Message(entry) = &kind else { return None };
                let key = map_key(&entry.map_entry_key_field().kind(), mode);
                let value = single(&entry.map_entry_value_field().kind(), depth, mode)?;
                btree_map(key, value, sizes.clone()).prop_map(|m| Value::Map(m.into_iter().collect())).boxed()
            } else if field.is_list() {
                vec(single(&kind, depth, mode)?, sizes.clone()).prop_map(Value::List).boxed()
            } else {
                single(&kind, depth, mode)?
            };
            // Tame messages set every field (an unset string or enum is empty or unspecified).
            let presence = match mode {
                Mode::Wild => prop_oneof![1 => Just(None), 3 => value.prop_map(Some)].boxed(),
                Mode::Tame => value.prop_map(Some).boxed(),
            };
            Some(presence.prop_map(move |v| v.map(|v| (field.clone(), v))))
        })
        .collect();
    fields
        .prop_map(move |values| {
            let mut m = DynamicMessage::new(desc.clone());
            for (field, value) in values.into_iter().flatten() {
                m.set_field(&field, value);
            }
            m
        })
        .boxed()
}

/// Arbitrary instances of the generated type `T`, whose full proto name is `name`.
fn wire<T: Message + Default + Debug>(pool: &DescriptorPool, name: &str) -> impl Strategy<Value = T> + use<T> {
    let desc = pool.get_message_by_name(name).unwrap_or_else(|| panic!("{name} is in the contracts"));
    prop_oneof![message(desc.clone(), DEPTH, Mode::Wild), message(desc, DEPTH, Mode::Tame)]
        .prop_map(|m| T::decode(m.encode_to_vec().as_slice()).expect("a generated message decodes"))
}

// ---------------------------------------------------------------------------------------------
// Field paths.

/// One step of a violation's field path: a field name and its `[index]` / `["key"]` suffixes.
#[derive(Debug)]
struct Step {
    name: String,
    subscripts: usize,
}

/// Split `checklist.items[1].weight` / `criterion_scores["a.b"]` into steps (keys are quoted
/// with Rust escapes and may hold dots or brackets).
fn parse_path(path: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut chars = path.chars().peekable();
    loop {
        let mut name = String::new();
        while let Some(c) = chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
            name.push(c);
        }
        if name.is_empty() {
            return Err(format!("{path:?}: a step without a field name"));
        }
        let mut subscripts = 0;
        while chars.next_if_eq(&'[').is_some() {
            if chars.next_if_eq(&'"').is_some() {
                let mut escaped = false;
                loop {
                    match chars.next() {
                        None => return Err(format!("{path:?}: unterminated key")),
                        Some('\\') if !escaped => escaped = true,
                        Some('"') if !escaped => break,
                        Some(_) => escaped = false,
                    }
                }
            } else if chars.next_if(char::is_ascii_digit).is_none() {
                return Err(format!("{path:?}: a subscript is neither an index nor a quoted key"));
            } else {
                while chars.next_if(char::is_ascii_digit).is_some() {}
            }
            if chars.next_if_eq(&']').is_none() {
                return Err(format!("{path:?}: unclosed subscript"));
            }
            subscripts += 1;
        }
        steps.push(Step { name, subscripts });
        match chars.next() {
            None => return Ok(steps),
            Some('.') => {}
            Some(c) => return Err(format!("{path:?}: unexpected {c:?}")),
        }
    }
}

/// `path` names a field of `desc`, and each step below it a field of the message above.
fn resolve(desc: &MessageDescriptor, path: &str) -> Result<(), String> {
    let mut current = Some(desc.clone());
    for step in parse_path(path)? {
        let Some(msg) = current.take() else { return Err(format!("{path:?} goes below a scalar field")) };
        let field = msg
            .get_field_by_name(&step.name)
            .ok_or_else(|| format!("{path:?}: {} has no field {:?}", msg.full_name(), step.name))?;
        if step.subscripts > 1 || (step.subscripts == 1 && !field.is_list() && !field.is_map()) {
            return Err(format!("{path:?}: {} takes no subscript {step:?}", field.full_name()));
        }
        // Below a message field: its message; below `map["key"]`: the value's message, if any.
        current = match (field.kind(), field.is_map()) {
            (Kind::Message(m), false) => Some(m),
            (Kind::Message(entry), true) if step.subscripts == 1 => {
                Some(entry.map_entry_value_field().kind()).and_then(|k| k.as_message().cloned())
            }
            (_, _) => None,
        };
    }
    Ok(())
}

/// A refused request: INVALID_ARGUMENT whose every violation names a field of `desc` (or, when
/// `precondition` is allowed, FAILED_PRECONDITION naming a field in its message).
fn check_refusal(desc: &MessageDescriptor, e: &StageError, precondition: bool) -> Result<(), TestCaseError> {
    match e {
        StageError::InvalidArgument(violations) => {
            prop_assert!(!violations.is_empty(), "INVALID_ARGUMENT without a violation");
            for v in violations {
                prop_assert!(!v.description.trim().is_empty(), "{}: no description", v.field);
                if let Err(why) = resolve(desc, &v.field) {
                    return Err(TestCaseError::fail(format!("{why} ({}: {})", v.field, v.description)));
                }
            }
            Ok(())
        }
        StageError::FailedPrecondition(m) if precondition => {
            prop_assert!(!m.is_empty());
            Ok(())
        }
        other @ (StageError::FailedPrecondition(_)
        | StageError::NotFound(_)
        | StageError::ResourceExhausted(_)
        | StageError::RateLimited(_)
        | StageError::BudgetExhausted(_)
        | StageError::Unavailable(_)
        | StageError::CircuitOpen(_)
        | StageError::DeadlineExceeded(_)
        | StageError::Cancelled(_)
        | StageError::Unimplemented(_)
        | StageError::Internal(_)) => Err(TestCaseError::fail(format!("refused with {other:?}"))),
    }
}

// ---------------------------------------------------------------------------------------------
// The properties.

/// Run the request properties for the wire type `T` (proto `name`): conversion never panics,
/// refusals name real fields, and valid values (`from` succeeds and `valid` holds) round-trip.
/// Half the generated requests get `shape`d first: ids made to match across fields (one solution
/// per solver, unique section ids...), so that requests with cross-field rules come out valid often
/// enough to test. Returns how many generated requests were valid.
fn requests<T, D>(
    name: &str,
    precondition: bool,
    shape: fn(&mut T),
    from: impl Fn(T) -> Result<D, StageError>,
    to: impl Fn(&D) -> T,
    valid: impl Fn(&D) -> bool,
) -> u32
where
    T: Message + Default + Clone + Debug,
    D: Debug,
{
    let pool = pool();
    let desc = pool.get_message_by_name(name).expect("known message");
    let accepted = Cell::new(0);
    let mut runner = TestRunner::new(config());
    let strategy = (wire::<T>(&pool, name), any::<bool>()).prop_map(move |(mut w, fix)| {
        if fix {
            shape(&mut w);
        }
        w
    });
    let result = runner.run(&strategy, |w| {
        match from(w) {
            Err(e) => check_refusal(&desc, &e, precondition)?,
            Ok(d) if valid(&d) => {
                accepted.set(accepted.get() + 1);
                // Compared by `Debug`: a NaN the domain keeps (a model record's temperature) is
                // then equal to itself.
                let back = from(to(&d)).map(|b| format!("{b:?}"));
                prop_assert_eq!(back, Ok(format!("{d:?}")), "domain -> wire -> domain changed the value");
            }
            Ok(_) => {}
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    println!("{name}: {CASES} cases, {} valid round trips", accepted.get());
    accepted.get()
}

/// Reading a stage's response never panics, and a value once written reads back the same: for
/// any wire message, read -> write -> read gives a value that writes and reads back unchanged
/// (compared by `Debug`, where NaN equals NaN). The first write may normalise what the domain
/// never produces (e.g. a model record on a skipped self-refine is not sent).
fn responses<T, D, E: Debug>(name: &str, from: impl Fn(T) -> Result<D, E>, to: impl Fn(&D) -> T)
where
    T: Message + Default + Clone + Debug,
    D: Debug,
{
    let pool = pool();
    let mut runner = TestRunner::new(config());
    let result = runner.run(&wire::<T>(&pool, name), |w| {
        if let Ok(d) = from(w).and_then(|d| from(to(&d))) {
            let again = from(to(&d));
            prop_assert_eq!(format!("{:?}", again.map_err(|e| format!("{e:?}"))), format!("{:?}", Ok::<_, String>(&d)));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

fn ok<D>(x: D) -> Result<D, StageError> {
    Ok(x)
}

fn always<D>(_: &D) -> bool {
    true
}

// Shapes: ids made to agree across fields, values left as generated.

/// `list` with exactly `n` entries (the generated ones repeated, or defaults).
fn fit<X: Clone + Default>(list: &mut Vec<X>, n: usize) {
    if list.is_empty() {
        list.push(X::default());
    }
    *list = list.iter().cycle().take(n).cloned().collect();
}

fn unshaped<T>(_: &mut T) {}

fn unique_sections(sections: &mut [assay_proto::common::v1::Section]) {
    for (i, s) in sections.iter_mut().enumerate() {
        s.id = format!("s{i}");
    }
}

const SOLVER_IDS: [&str; 3] = ["x", "y", "z"];

fn debate_solvers(solvers: &mut Vec<assay_proto::debate::v1::Solver>) {
    if solvers.len() == 3 {
        for (s, id) in solvers.iter_mut().zip(SOLVER_IDS) {
            s.id = id.into();
        }
    } else {
        solvers.clear();
    }
}

fn debate_artifacts(
    solutions: &mut Vec<assay_proto::debate::v1::Solution>,
    reviews: &mut Vec<assay_proto::debate::v1::Review>,
) {
    fit(solutions, 3);
    for (s, id) in solutions.iter_mut().zip(SOLVER_IDS) {
        s.solver_id = id.into();
    }
    fit(reviews, 6);
    let pairs = SOLVER_IDS.iter().flat_map(|r| SOLVER_IDS.iter().filter(move |t| *t != r).map(move |t| (*r, *t)));
    for (review, (r, t)) in reviews.iter_mut().zip(pairs) {
        review.reviewer_id = r.into();
        review.target_solver_id = t.into();
    }
}

fn shape_review(r: &mut assay_proto::debate::v1::ReviewRequest) {
    debate_solvers(&mut r.solvers);
    debate_artifacts(&mut r.solutions, &mut Vec::new());
}

fn shape_refine(r: &mut assay_proto::debate::v1::RefineSolutionsRequest) {
    debate_solvers(&mut r.solvers);
    debate_artifacts(&mut r.solutions, &mut r.reviews);
}

fn shape_judge(r: &mut assay_proto::debate::v1::JudgeDebateRequest) {
    debate_artifacts(&mut r.solutions, &mut r.reviews);
    fit(&mut r.refined, 3);
    for (s, id) in r.refined.iter_mut().zip(SOLVER_IDS) {
        s.solver_id = id.into();
    }
}

fn unique_verdicts(verdicts: &mut Vec<assay_proto::common::v1::JudgeVerdict>) {
    verdicts.truncate(9);
    for (i, v) in verdicts.iter_mut().enumerate() {
        v.judge_id = format!("j{i}");
    }
}

/// Section scores naming a section of the document and a default criterion, once each: the
/// conversion refuses scores for units the document does not have.
fn known_section_scores(verdicts: &mut [assay_proto::common::v1::JudgeVerdict], sections: usize) {
    let criteria: Vec<String> = assay_domain::document::default_criteria().into_iter().map(|c| c.name).collect();
    for v in verdicts.iter_mut() {
        if sections == 0 {
            v.section_scores.clear();
            continue;
        }
        v.section_scores.truncate(sections * criteria.len());
        for (k, s) in v.section_scores.iter_mut().enumerate() {
            s.section_id = format!("s{}", k % sections);
            s.criterion = criteria[k / sections].clone();
        }
    }
}

fn shape_consolidate(r: &mut assay_proto::arbiter::v1::ConsolidateRequest) {
    unique_verdicts(&mut r.verdicts);
    unique_sections(&mut r.sections);
    r.criteria.clear();
    known_section_scores(&mut r.verdicts, r.sections.len());
}

fn shape_plan(r: &mut assay_proto::arbiter::v1::PlanRequest) {
    unique_verdicts(&mut r.verdicts);
    unique_sections(&mut r.sections);
    r.criteria.clear();
    known_section_scores(&mut r.verdicts, r.sections.len());
    r.locked_section_ids = r.sections.iter().take(1).map(|s| s.id.clone()).collect();
}

fn shape_route(r: &mut assay_proto::arbiter::v1::RouteRequest) {
    unique_sections(&mut r.sections);
    r.criteria.clear();
    r.locked_section_ids.clear();
    let ids: Vec<String> = r.sections.iter().map(|s| s.id.clone()).collect();
    for (i, x) in r.instructions.iter_mut().enumerate() {
        x.section_id = ids.get(i).cloned().unwrap_or_default();
    }
    r.instructions.truncate(ids.len());
}

fn shape_verify(r: &mut assay_proto::delta_judge::v1::VerifyRequest) {
    if let (Some(before), Some(after)) = (&r.before, &mut r.after) {
        after.id = before.id.clone();
    }
    let id = r.after.as_ref().map(|s| s.id.clone()).unwrap_or_default();
    for (i, issue) in r.issues.iter_mut().enumerate() {
        issue.id = format!("i{i}");
        issue.section_id = id.clone();
    }
    for (i, lock) in r.locks.iter_mut().enumerate() {
        lock.criterion = format!("c{i}");
        r.criterion_scores.insert(lock.criterion.clone(), lock.baseline);
    }
    r.min_length_ratio = None;
    r.max_length_ratio = None;
}

fn shape_corpus(r: &mut assay_proto::generator::v1::GenerateCorpusRequest) {
    r.preset = assay_proto::generator::v1::Preset::Feedback as i32;
    r.dimensions.clear();
    fit(&mut r.observations, 2);
    if let Some(refinement) = &mut r.refinement {
        refinement.unit_test_samples.truncate(20);
    }
}

#[test]
fn scorer_requests() {
    let n = requests(
        "assay.scorer.v1.ScoreRequest",
        false,
        unshaped,
        |p| convert::score_request(p, ""),
        convert::score_request_to,
        always,
    );
    assert!(n > 0, "some score requests were valid");
    let n = requests(
        "assay.scorer.v1.JudgeSectionsRequest",
        false,
        |r| unique_sections(&mut r.sections),
        |p| convert::judge::judge_sections_request(p, ""),
        convert::judge::judge_sections_request_to,
        always,
    );
    assert!(n > 0, "some panel requests were valid");
}

#[test]
fn generator_requests() {
    let n = requests(
        "assay.generator.v1.GenerateRequest",
        false,
        unshaped,
        convert::generator::generate_request,
        convert::generator::generate_request_to,
        |d| d.validate().is_ok(),
    );
    assert!(n > 0, "some generate requests were valid");
    let n = requests(
        "assay.generator.v1.GenerateCorpusRequest",
        false,
        shape_corpus,
        convert::generator::corpus_request,
        convert::generator::corpus_request_to,
        |d| d.validate().is_ok(),
    );
    assert!(n > 0, "some corpus requests were valid");
}

/// No round trip for requests whose options have no wire form of their own (they travel inside
/// a chain, checked by [`refiner_requests`]).
fn never<D>(_: &D) -> bool {
    false
}

#[test]
fn refiner_requests() {
    let n = requests(
        "assay.refiners.v1.RefineChecklistRequest",
        false,
        unshaped,
        |p| convert::refiners::refine_checklist_request(p, ""),
        |(items, steps)| convert::refiners::refine_checklist_request_to(items, steps),
        |(items, steps)| assay_domain::refiners::validate_chain(items, steps).is_ok(),
    );
    assert!(n > 0, "some refiner chains were valid");
    let unreachable = |_: &_| unreachable!("never valid");
    requests(
        "assay.refiners.v1.DeduplicateRequest",
        false,
        unshaped,
        convert::refiners::deduplicate_request,
        unreachable,
        never,
    );
    requests(
        "assay.refiners.v1.TagRequest",
        false,
        unshaped,
        convert::refiners::tag_request,
        |_| unreachable!(),
        never,
    );
    requests(
        "assay.refiners.v1.UnitTestRequest",
        false,
        unshaped,
        convert::refiners::unit_test_request,
        |_| unreachable!(),
        never,
    );
    requests(
        "assay.refiners.v1.SelectRequest",
        false,
        unshaped,
        convert::refiners::select_request,
        |_| unreachable!(),
        never,
    );
    let n = requests(
        "assay.refiners.v1.SelfRefineRequest",
        false,
        unshaped,
        |p| convert::self_refine::self_refine_request(p, ""),
        convert::self_refine::self_refine_request_to,
        always,
    );
    assert!(n > 0, "some self-refine requests were valid");
    let n = requests(
        "assay.refiners.v1.PatchRequest",
        false,
        unshaped,
        convert::refiners::patch_request,
        convert::refiners::patch_request_to,
        always,
    );
    assert!(n > 0, "some patch requests were valid");
    let n = requests(
        "assay.refiners.v1.ExpandSectionRequest",
        false,
        unshaped,
        convert::refiners::expand_request,
        convert::refiners::expand_request_to,
        always,
    );
    assert!(n > 0, "some expand requests were valid");
}

#[test]
fn arbiter_requests() {
    let n = requests(
        "assay.arbiter.v1.ConsolidateRequest",
        false,
        shape_consolidate,
        convert::arbiter::consolidate_request,
        convert::arbiter::consolidate_request_to,
        always,
    );
    assert!(n > 0, "some consolidate requests were valid");
    let n = requests(
        "assay.arbiter.v1.RouteRequest",
        false,
        shape_route,
        convert::arbiter::route_request,
        convert::arbiter::route_request_to,
        always,
    );
    assert!(n > 0, "some route requests were valid");
    let n = requests(
        "assay.arbiter.v1.PlanRequest",
        false,
        shape_plan,
        convert::arbiter::plan_request,
        convert::arbiter::plan_request_to,
        always,
    );
    assert!(n > 0, "some plan requests were valid");
}

#[test]
fn delta_judge_requests() {
    let n = requests(
        "assay.delta_judge.v1.VerifyRequest",
        false,
        shape_verify,
        |p| convert::delta_judge::verify_request(p, ""),
        convert::delta_judge::verify_request_to,
        always,
    );
    assert!(n > 0, "some verify requests were valid");
    let n = requests(
        "assay.delta_judge.v1.CompareTextsRequest",
        false,
        unshaped,
        |p| convert::delta_judge::compare_request(p, ""),
        convert::delta_judge::compare_request_to,
        always,
    );
    assert!(n > 0, "some compare requests were valid");
}

#[test]
fn debate_requests() {
    let n = requests(
        "assay.debate.v1.SolveRequest",
        true,
        |r| debate_solvers(&mut r.solvers),
        |p| convert::debate::solve_request(p, ""),
        convert::debate::solve_request_to,
        always,
    );
    assert!(n > 0, "some solve requests were valid");
    let n = requests(
        "assay.debate.v1.ReviewRequest",
        true,
        shape_review,
        |p| convert::debate::review_request(p, ""),
        convert::debate::review_request_to,
        always,
    );
    assert!(n > 0, "some review requests were valid");
    let n = requests(
        "assay.debate.v1.RefineSolutionsRequest",
        true,
        shape_refine,
        |p| convert::debate::refine_request(p, ""),
        convert::debate::refine_request_to,
        always,
    );
    assert!(n > 0, "some refine requests were valid");
    let n = requests(
        "assay.debate.v1.JudgeDebateRequest",
        true,
        shape_judge,
        |p| convert::debate::judge_request(p, ""),
        convert::debate::judge_request_to,
        always,
    );
    assert!(n > 0, "some judge requests were valid");
    let n = requests(
        "assay.debate.v1.RunDebateRequest",
        true,
        |r| debate_solvers(&mut r.solvers),
        |p| convert::debate::run_debate_request(p, ""),
        convert::debate::run_debate_request_to,
        always,
    );
    assert!(n > 0, "some debate requests were valid");
}

#[test]
fn stage_responses_read_back_the_same() {
    use assay_proto::convert::{arbiter, debate, delta_judge, generator, judge, refiners, self_refine};
    responses("assay.scorer.v1.ScoreResponse", |p| ok(convert::score_response_from(p)), convert::score_response_to);
    responses(
        "assay.scorer.v1.JudgeSectionsResponse",
        judge::judge_sections_response_from,
        judge::judge_sections_response_to,
    );
    responses(
        "assay.generator.v1.GenerateResponse",
        generator::generate_response_from,
        generator::generate_response_to,
    );
    responses(
        "assay.generator.v1.GenerateCorpusResponse",
        generator::corpus_response_from,
        generator::corpus_response_to,
    );
    responses(
        "assay.refiners.v1.RefineChecklistResponse",
        refiners::refine_checklist_response_from,
        refiners::refine_checklist_response_to,
    );
    responses("assay.refiners.v1.PatchResponse", |p| ok(refiners::patch_response_from(p)), refiners::patch_response_to);
    responses(
        "assay.refiners.v1.SelfRefineResponse",
        |p| ok(self_refine::self_refine_response_from(p)),
        self_refine::self_refine_response_to,
    );
    responses(
        "assay.arbiter.v1.ConsolidateResponse",
        |p| ok(arbiter::consolidation_from(p)),
        arbiter::consolidation_to,
    );
    responses("assay.arbiter.v1.PlanResponse", |p| ok(arbiter::plan_from(p)), arbiter::plan_to);
    responses(
        "assay.delta_judge.v1.VerifyResponse",
        |p| ok(delta_judge::verify_response_from(p)),
        delta_judge::verify_response_to,
    );
    responses(
        "assay.delta_judge.v1.CompareTextsResponse",
        |p| ok(delta_judge::compare_response_from(p)),
        delta_judge::compare_response_to,
    );
    responses(
        "assay.debate.v1.RunDebateResponse",
        |p| ok(debate::run_debate_response_from(p)),
        debate::run_debate_response_to,
    );
    responses("assay.debate.v1.DebateStageCompleted", debate::stage_completed_from, debate::stage_completed_to);
}

#[test]
fn field_paths_parse_and_resolve() {
    let pool = pool();
    let score = pool.get_message_by_name("assay.scorer.v1.ScoreRequest").unwrap();
    for ok in ["checklist", "checklist.items[1].weight", "targets[0].target", "model.temperature"] {
        assert_eq!(resolve(&score, ok), Ok(()), "{ok}");
    }
    for bad in ["checklist.nope", "targets.target[0]", "model.temperature.x", "checklist[0]", "", "a..b"] {
        assert!(resolve(&score, bad).is_err(), "{bad}");
    }
    let route = pool.get_message_by_name("assay.arbiter.v1.RouteRequest").unwrap();
    assert_eq!(resolve(&route, r#"criterion_scores["a.b[\"c\"]"]"#), Ok(()));
    assert!(resolve(&route, r#"criterion_scores["a"].x"#).is_err());
}
