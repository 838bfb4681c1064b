//! The score types, a target's aggregates, samples and the aggregates over targets.

use super::*;
use crate::checklist::{Checklist, ChecklistItem, UNGROUPED};

fn checklist() -> Checklist {
    let mut items = vec![ChecklistItem::new("a", "qa"), ChecklistItem::new("b", "qb"), ChecklistItem::new("c", "qc")];
    items[0].weight = 50.0;
    items[1].weight = 30.0;
    items[2].weight = 20.0;
    items[0].category = Some("x".into());
    Checklist { id: "cl".into(), items, ..Default::default() }
}

#[test]
fn aggregates_follow_the_formulas() {
    let cl = checklist();
    let mut a = ItemScore::answered("a", Answer::Yes);
    a.confidence = Some(0.9);
    let b = ItemScore::answered("b", Answer::No);
    let mut c = ItemScore::answered("c", Answer::Yes);
    c.confidence = Some(0.7);
    let s = Score::compute(&cl, vec![a, b, c], PrimaryMetric::Weighted);
    assert!((s.pass_rate - 2.0 / 3.0).abs() < 1e-12);
    assert!((s.weighted_score - 0.7).abs() < 1e-12);
    assert!((s.normalized_score - 0.8).abs() < 1e-12);
    assert!((s.scaled_score_1_5 - (2.0 / 3.0 * 4.0 + 1.0)).abs() < 1e-12);
    assert_eq!(s.primary_score, s.weighted_score);
    assert_eq!(s.answered_count, 3);
}

#[test]
fn unanswered_items_are_counted_not_hidden() {
    let cl = checklist();
    let s = Score::compute(
        &cl,
        vec![
            ItemScore::answered("a", Answer::Yes),
            ItemScore::missing("b", ItemStatus::Unanswered, "no answer"),
            ItemScore::answered("c", Answer::Yes),
        ],
        PrimaryMetric::Pass,
    );
    assert_eq!((s.unanswered_count, s.answered_count), (1, 2));
    // Kept out of the rates, not counted as NO: both answers are YES.
    assert_eq!(s.pass_rate, 1.0);
    assert_eq!(s.weighted_score, 1.0, "over the answered items' weights");
    assert!((s.normalized_score - s.pass_rate).abs() < 1e-12);
    assert_eq!(s.scaled_score_1_5, 5.0);
    // One NO among the answered: 1/2, weights 50 (a, YES) of 50 + 20.
    let s = Score::compute(
        &cl,
        vec![
            ItemScore::answered("a", Answer::Yes),
            ItemScore::missing("b", ItemStatus::Unparseable, "no yes/no"),
            ItemScore::answered("c", Answer::No),
        ],
        PrimaryMetric::Weighted,
    );
    assert_eq!(s.pass_rate, 0.5);
    assert!((s.weighted_score - 50.0 / 70.0).abs() < 1e-12);
    // Nothing answered: zero, and every item counted unanswered.
    let s = Score::compute(&cl, vec![ItemScore::missing("a", ItemStatus::Failed, "backend down")], PrimaryMetric::Pass);
    assert_eq!((s.pass_rate, s.unanswered_count, s.answered_count), (0.0, 1, 0));
    // Aggregates: the micro rate and the categories count answered items only.
    let one = Score::compute(
        &cl,
        vec![
            ItemScore::answered("a", Answer::Yes),
            ItemScore::missing("b", ItemStatus::Unanswered, "no answer"),
            ItemScore::answered("c", Answer::No),
        ],
        PrimaryMetric::Pass,
    );
    let agg = AggregateScores::compute([(&one, &cl)]);
    assert_eq!((agg.micro_pass_rate, agg.macro_pass_rate, agg.unanswered_items), (0.5, 0.5, 1));
    let ungrouped = agg.category_pass_rates.iter().find(|c| c.category == UNGROUPED).expect("ungrouped");
    assert_eq!((ungrouped.pass_rate, ungrouped.items), (0.0, 1), "c (NO) only: b has no answer");
}

/// Issue 59, point 1: record 1 all YES, record 2's reply unparseable. Before, record 2 was a
/// primary score of 0 in the mean (0.5) and in the interval; it is unscored, counted apart.
#[test]
fn an_unparseable_reply_is_unscored_not_a_zero() {
    let cl = checklist();
    let yes = Score::compute(
        &cl,
        ["a", "b", "c"].iter().map(|i| ItemScore::answered(*i, Answer::Yes)).collect(),
        PrimaryMetric::Pass,
    );
    let garbled = Score::compute(
        &cl,
        ["a", "b", "c"].iter().map(|i| ItemScore::missing(*i, ItemStatus::Unparseable, "no yes/no")).collect(),
        PrimaryMetric::Pass,
    );
    assert!(yes.is_scored() && !garbled.is_scored());
    let mut third = yes.clone();
    third.target_id = "r3".into();
    let agg = AggregateScores::compute([(&yes, &cl), (&garbled, &cl), (&third, &cl)]);
    assert_eq!((agg.targets, agg.unscored_targets, agg.scored_targets()), (3, 1, 2));
    assert_eq!((agg.mean_primary_score, agg.macro_pass_rate, agg.micro_pass_rate), (1.0, 1.0, 1.0));
    assert_eq!(agg.unanswered_items, 3, "its items are still counted unanswered");
    assert_eq!(agg.uncertainty.as_ref().map(|u| (u.observations, u.mean)), Some((2, 1.0)));
    // Nothing scored at all: no mean to give (0, with every target unscored).
    let none = AggregateScores::compute([(&garbled, &cl)]);
    assert_eq!((none.targets, none.unscored_targets, none.mean_primary_score), (1, 1, 0.0));
    assert!(none.uncertainty.is_none());

    // With samples, a sample whose reply was unparseable abstains: the means are over the
    // others (1.0, not 2/3), and a target no sample scored is unscored.
    let s = Score::combine_samples(&cl, vec![yes.clone(), garbled.clone(), yes.clone()], PrimaryMetric::Pass);
    assert!(s.is_scored());
    assert_eq!((s.primary_score, s.sample_primary_scores.clone()), (1.0, vec![1.0, 1.0]));
    let s = Score::combine_samples(&cl, vec![garbled.clone(), garbled], PrimaryMetric::Pass);
    assert!(!s.is_scored() && s.sample_primary_scores.is_empty() && s.sample_spread.is_none());
}

#[test]
fn empty_checklist_scores_zero() {
    let cl = Checklist::default();
    let s = Score::compute(&cl, vec![], PrimaryMetric::Pass);
    assert_eq!(s.pass_rate, 0.0);
    assert_eq!(s.weighted_score, 0.0);
    assert_eq!(s.scaled_score_1_5, 1.0);
}

#[test]
fn zero_weights_give_zero_weighted_score() {
    let mut cl = checklist();
    for i in &mut cl.items {
        i.weight = 0.0;
    }
    let s = Score::compute(&cl, vec![ItemScore::answered("a", Answer::Yes)], PrimaryMetric::Weighted);
    assert_eq!(s.weighted_score, 0.0);
}

#[test]
fn confidence_bands_at_exact_boundaries() {
    assert_eq!(ConfidenceLevel::of(0.0), ConfidenceLevel::No10);
    assert_eq!(ConfidenceLevel::of(0.19999), ConfidenceLevel::No10);
    assert_eq!(ConfidenceLevel::of(0.2), ConfidenceLevel::No30);
    assert_eq!(ConfidenceLevel::of(0.4), ConfidenceLevel::Unsure);
    assert_eq!(ConfidenceLevel::of(0.6), ConfidenceLevel::Yes70);
    assert_eq!(ConfidenceLevel::of(0.8), ConfidenceLevel::Yes90);
    assert_eq!(ConfidenceLevel::of(1.0), ConfidenceLevel::Yes90);
    assert_eq!(ConfidenceLevel::Unsure.answer(), Answer::No);
}

#[test]
fn settings_fill_unset_fields_from_the_defaults_one_by_one() {
    let rlcf = ScorerConfig {
        mode: ScoringMode::Item,
        primary_metric: PrimaryMetric::Weighted,
        prompt: ScoringPrompt::Rlcf,
        ..ScorerConfig::default()
    };
    let only_reasoning = ScorerSettings { capture_reasoning: Some(true), ..ScorerSettings::default() };
    let c = only_reasoning.resolve(&rlcf);
    assert_eq!((c.mode, c.primary_metric, c.prompt), (ScoringMode::Item, PrimaryMetric::Weighted, ScoringPrompt::Rlcf));
    assert!(c.capture_reasoning);
    let rocket = ScorerConfig {
        mode: ScoringMode::Item,
        primary_metric: PrimaryMetric::Normalized,
        use_logprobs: true,
        prompt: ScoringPrompt::RocketEval,
        ..ScorerConfig::default()
    };
    let c = ScorerSettings { capture_reasoning: Some(true), ..ScorerSettings::default() }.resolve(&rocket);
    assert!(c.use_logprobs && c.wants_logprobs());
    assert_eq!(c.primary_metric, PrimaryMetric::Normalized);
    // A set field wins, false included.
    let c = ScorerSettings {
        use_logprobs: Some(false),
        primary_metric: Some(PrimaryMetric::Pass),
        ..ScorerSettings::default()
    }
    .resolve(&rocket);
    assert!(!c.wants_logprobs());
    // The normalized metric on a batch preset moves to item mode unless the mode is set.
    let batch = ScorerConfig::default();
    let normalized = ScorerSettings { primary_metric: Some(PrimaryMetric::Normalized), ..ScorerSettings::default() };
    assert_eq!(normalized.resolve(&batch).mode, ScoringMode::Item);
    let forced = ScorerSettings { mode: Some(ScoringMode::Batch), ..normalized };
    assert_eq!(forced.resolve(&batch).mode, ScoringMode::Batch);
    assert_eq!(ScorerSettings::all(&rocket).resolve(&batch), rocket);
}

#[test]
fn custom_templates_must_show_the_response_and_the_questions() {
    let check = |mode, t: &str| {
        let mut v = crate::Violations::new();
        ScorerConfig { mode, prompt_template: Some(t.into()), ..ScorerConfig::default() }.check("config", &mut v);
        v.into_result().err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(check(ScoringMode::Item, "Is {target} good?").contains("{question}"));
    assert!(check(ScoringMode::Batch, "Rate {target}").contains("numbered questions"));
    assert!(check(ScoringMode::Batch, "{question}").contains("{target}"));
    assert_eq!(check(ScoringMode::Batch, "{target}\n{checklist}"), "");
    assert_eq!(check(ScoringMode::Item, "{target} / {question} / {reference}"), "");
    assert!(check(ScoringMode::Item, "{target} {question} {refrence}").contains("refrence"));
}

#[test]
fn answers_parse_case_insensitively() {
    assert_eq!(Answer::parse("yes"), Some(Answer::Yes));
    assert_eq!(Answer::parse(" YES."), Some(Answer::Yes));
    assert_eq!(Answer::parse("No"), Some(Answer::No));
    assert_eq!(Answer::parse("maybe"), None);
}

#[test]
fn macro_micro_and_categories() {
    let cl = checklist();
    let s1 = Score::compute(
        &cl,
        vec![
            ItemScore::answered("a", Answer::Yes),
            ItemScore::answered("b", Answer::Yes),
            ItemScore::answered("c", Answer::Yes),
        ],
        PrimaryMetric::Pass,
    );
    let cl2 = Checklist { id: "cl2".into(), items: vec![ChecklistItem::new("z", "qz")], ..Default::default() };
    let s2 = Score::compute(&cl2, vec![ItemScore::answered("z", Answer::No)], PrimaryMetric::Pass);
    let agg = AggregateScores::compute([(&s1, &cl), (&s2, &cl2)]);
    assert_eq!(agg.targets, 2);
    assert!((agg.macro_pass_rate - 0.5).abs() < 1e-12);
    assert!((agg.micro_pass_rate - 0.75).abs() < 1e-12);
    assert_eq!(agg.category_pass_rates[0].category, "x");
    assert_eq!(agg.category_pass_rates[1].category, UNGROUPED);
    assert!((agg.category_pass_rates[1].pass_rate - 2.0 / 3.0).abs() < 1e-12);
}

fn sample(cl: &Checklist, target: &str, answers: &[Option<Answer>]) -> Score {
    let items = cl
        .items
        .iter()
        .zip(answers)
        .map(|(it, a)| match a {
            Some(a) => ItemScore::answered(&it.id, *a),
            None => ItemScore::missing(&it.id, ItemStatus::Unparseable, "no yes/no"),
        })
        .collect();
    let mut s = Score::compute(cl, items, PrimaryMetric::Weighted);
    s.target_id = target.into();
    s
}

#[test]
fn the_majority_counts_abstentions_apart_and_a_tie_is_a_flaky_no() {
    use Answer::{No, Yes};
    let item = |a: Option<Answer>| match a {
        Some(a) => ItemScore::answered("a", a),
        None => ItemScore::missing("a", ItemStatus::Unparseable, "garbled"),
    };
    let m = ItemScore::majority(&[item(Some(Yes)), item(None), item(Some(No)), item(Some(Yes))]);
    assert_eq!((m.answer, m.status, m.flaky, m.abstentions), (Some(Yes), ItemStatus::Answered, true, 1));
    assert_eq!(m.yes_share, Some(2.0 / 3.0));
    assert_eq!(m.sample_answers, vec![Some(Yes), None, Some(No), Some(Yes)]);
    // An abstention is never a NO: one YES and two abstentions is a unanimous YES.
    let m = ItemScore::majority(&[item(None), item(Some(Yes)), item(None)]);
    assert_eq!((m.answer, m.flaky, m.abstentions, m.yes_share), (Some(Yes), false, 2, Some(1.0)));
    let tie = ItemScore::majority(&[item(Some(Yes)), item(Some(No))]);
    assert_eq!((tie.answer, tie.flaky, tie.yes_share), (Some(No), true, Some(0.5)));
    let none = ItemScore::majority(&[item(None), item(None)]);
    assert_eq!((none.answer, none.status, none.yes_share), (None, ItemStatus::Unparseable, None));
    assert_eq!((none.error.as_str(), none.abstentions), ("garbled", 2));
}

#[test]
fn samples_combine_into_mean_aggregates_and_majority_items() {
    use Answer::{No, Yes};
    let cl = checklist();
    let samples = vec![
        sample(&cl, "t", &[Some(Yes), Some(Yes), Some(No)]),
        sample(&cl, "t", &[Some(Yes), Some(No), None]),
        sample(&cl, "t", &[Some(No), Some(Yes), Some(No)]),
    ];
    let primaries: Vec<f64> = samples.iter().map(|s| s.primary_score).collect();
    // The second sample's third item has no answer: its rates are over the two answered
    // items (weights 50 + 30).
    assert_eq!(primaries, vec![0.8, 0.625, 0.3]);
    let s = Score::combine_samples(&cl, samples.clone(), PrimaryMetric::Weighted);
    assert!((s.primary_score - 1.725 / 3.0).abs() < 1e-12);
    assert!((s.weighted_score - 1.725 / 3.0).abs() < 1e-12);
    assert!((s.pass_rate - (2.0 / 3.0 + 1.0 / 2.0 + 1.0 / 3.0) / 3.0).abs() < 1e-12);
    assert!((s.scaled_score_1_5 - (s.pass_rate * 4.0 + 1.0)).abs() < 1e-12);
    assert_eq!(s.sample_primary_scores, primaries);
    assert!((s.sample_spread.unwrap() - crate::stats::sd(&primaries)).abs() < 1e-15);
    assert!((s.sample_spread.unwrap() - 0.2537222891273055).abs() < 1e-12);
    let answers: Vec<_> = s.item_scores.iter().map(|i| (i.answer, i.flaky)).collect();
    assert_eq!(answers, vec![(Some(Yes), true), (Some(Yes), true), (Some(No), false)]);
    assert_eq!((s.abstentions, s.answered_count, s.unanswered_count, s.target_id.as_str()), (1, 3, 0, "t"));
    // One sample is the sample itself.
    assert_eq!(Score::combine_samples(&cl, samples[..1].to_vec(), PrimaryMetric::Weighted), samples[0]);
}

#[test]
fn uncertainty_is_the_standard_error_of_the_observations() {
    use Answer::{No, Yes};
    let cl = checklist();
    let one = |t: &str, a: &[Option<Answer>]| sample(&cl, t, a);
    // One sample per target: naive only, one observation per target.
    let scores = [
        one("r1", &[Some(Yes), Some(Yes), Some(No)]),
        one("r2", &[Some(No), Some(Yes), Some(No)]),
        one("r3", &[Some(Yes), Some(Yes), Some(Yes)]),
    ];
    let agg = AggregateScores::compute(scores.iter().map(|s| (s, &cl)));
    let want = crate::stats::standard_error(&[("r1", 0.8), ("r2", 0.3), ("r3", 1.0)], 0.05).unwrap();
    let u = agg.uncertainty.clone().unwrap();
    assert_eq!(u, ScoreUncertainty::from(&want));
    assert_eq!((u.observations, u.clusters, u.se_clustered), (3, 0, None));
    assert_eq!((u.se, u.ci), (want.se_naive, want.ci_naive));
    assert!((u.mean - agg.mean_primary_score).abs() < 1e-12);
    // Several samples per target: one observation per sample, clustered by target.
    let a = Score::combine_samples(
        &cl,
        vec![one("r1", &[Some(Yes), Some(Yes), Some(No)]), one("r1", &[Some(Yes), Some(No), Some(No)])],
        PrimaryMetric::Weighted,
    );
    let b = Score::combine_samples(
        &cl,
        vec![one("r2", &[Some(No), Some(No), Some(No)]), one("r2", &[Some(No), Some(Yes), Some(No)])],
        PrimaryMetric::Weighted,
    );
    let c = Score::combine_samples(
        &cl,
        vec![one("r3", &[Some(Yes), Some(Yes), Some(Yes)]), one("r3", &[Some(Yes), Some(Yes), Some(No)])],
        PrimaryMetric::Weighted,
    );
    let agg = AggregateScores::compute([(&a, &cl), (&b, &cl), (&c, &cl)]);
    let obs = [("r1", 0.8), ("r1", 0.5), ("r2", 0.0), ("r2", 0.3), ("r3", 1.0), ("r3", 0.8)];
    let want = crate::stats::standard_error(&obs, 0.05).unwrap();
    let u = agg.uncertainty.unwrap();
    assert_eq!(u, ScoreUncertainty::from(&want));
    assert_eq!((u.observations, u.clusters), (6, 3));
    assert_eq!(Some(u.se), want.se_clustered);
    assert_eq!(Some(u.ci), want.ci_clustered);
    assert!(u.inflation.is_some());
    // Fewer than two observations: no uncertainty.
    let single = one("r1", &[Some(Yes), Some(Yes), Some(No)]);
    assert_eq!(AggregateScores::compute([(&single, &cl)]).uncertainty, None);
    assert_eq!(AggregateScores::compute(std::iter::empty()).uncertainty, None);
}

#[test]
fn sample_settings_are_checked_with_their_limits() {
    let check = |samples: u32, models: &[&str]| {
        let mut v = crate::Violations::new();
        ScorerConfig { samples, sample_models: models.iter().map(|m| m.to_string()).collect(), ..Default::default() }
            .check("config", &mut v);
        v.into_result().err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert_eq!(check(1, &[]), "");
    assert_eq!(check(10, &["a", "b"]), "");
    assert!(check(0, &[]).contains("config.samples") && check(0, &[]).contains("1 to 10"));
    assert!(check(11, &[]).contains("config.samples"));
    assert!(check(2, &["a", " "]).contains("config.sample_models[1]"));
    let many = ["m"; 11];
    assert!(check(2, &many).contains("config.sample_models") && check(2, &many).contains("limit is 10"));
    // Unset settings keep the defaults: one sample, the scorer's model.
    let c = ScorerSettings::default().resolve(&ScorerConfig::default());
    assert_eq!((c.samples, c.sample_models.len()), (1, 0));
    let c = ScorerSettings { samples: Some(3), sample_models: vec!["j".into()], ..Default::default() }
        .resolve(&ScorerConfig::default());
    assert_eq!((c.samples, c.sample_models), (3, vec!["j".to_string()]));
}
