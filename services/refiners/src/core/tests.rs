//! Pure tests of the refiners' logic (no model calls).

use super::*;
use crate::core::dedup::{merged_item, parse_merge};
use crate::core::tagger::parse_tag;
use assay_llm::ChatResponse;
use std::collections::BTreeMap;

fn unit(deg: f64) -> Vec<f32> {
    let r = deg.to_radians();
    vec![r.cos() as f32, r.sin() as f32]
}

fn fields_of(e: StageError) -> Vec<String> {
    let StageError::InvalidArgument(v) = e else { panic!("not invalid argument: {e}") };
    v.into_iter().map(|f| f.field).collect()
}

#[test]
fn clusters_are_connected_components() {
    // A~B (cos 20deg = 0.94), B~C (0.94), A!~C (cos 40deg = 0.77); D and E far from everything.
    let v = vec![unit(0.0), unit(120.0), unit(20.0), unit(40.0), unit(-100.0)];
    let c = cluster(&v, 0.85);
    assert_eq!(c.clusters, vec![vec![0, 2, 3], vec![1], vec![4]]);
    assert!((c.nearest[0] - 20f64.to_radians().cos()).abs() < 1e-6);
    // At a threshold above cos 20deg nothing links.
    let c = cluster(&v, 0.95);
    assert_eq!(c.clusters.len(), 5);
    // Threshold 1: only identical directions link (>=).
    let c = cluster(&[unit(10.0), unit(10.0), unit(11.0)], 1.0 - 1e-12);
    assert_eq!(c.clusters, vec![vec![0, 1], vec![2]]);
}

#[test]
fn cosine_matrix_is_symmetric_and_handles_zero_vectors() {
    let m = cosine_matrix(&[vec![3.0, 4.0], vec![4.0, 3.0], vec![0.0, 0.0]]);
    assert!((m.get(0, 1) - 24.0 / 25.0).abs() < 1e-9);
    assert_eq!(m.get(0, 1), m.get(1, 0));
    assert!((m.get(0, 0) - 1.0).abs() < 1e-12);
    assert_eq!(m.get(2, 0), 0.0);
}

#[test]
fn merged_item_carries_id_mean_weight_and_sources() {
    let mut a = ChecklistItem::new("q1", "Is it short?");
    a.weight = 100.0;
    a.category = Some("style".into());
    a.source_indices = vec![3, 1];
    let mut b = ChecklistItem::new("q4", "Is it brief?");
    b.weight = 40.0;
    b.source_indices = vec![1, 7];
    let m = merged_item(&[&a, &b], "Is it concise?".into(), "q1-merged".into());
    assert_eq!(m.id, "q1-merged");
    assert_eq!(m.weight, 70.0);
    assert_eq!(m.category.as_deref(), Some("style"));
    assert_eq!(m.merged_from, vec!["q1", "q4"]);
    assert_eq!(m.source_indices, vec![1, 3, 7]);
    assert_eq!(m.metadata["merged_from"], r#"["q1","q4"]"#);
    assert_eq!(m.metadata["original_questions"], r#"["Is it short?","Is it brief?"]"#);
}

fn reply(text: &str) -> ChatResponse {
    ChatResponse { text: text.into(), ..Default::default() }
}

#[test]
fn merge_replies_parse_leniently_but_not_silently() {
    assert_eq!(parse_merge(&reply(r#"{"question": " Is it concise? "}"#)).unwrap(), "Is it concise?");
    assert_eq!(parse_merge(&reply("```json\n{\"question\": \"Q?\"}\n```")).unwrap(), "Q?");
    assert_eq!(parse_merge(&reply("\"Is it clear?\"")).unwrap(), "Is it clear?");
    // Plain text is used as the question, as the original does.
    assert_eq!(parse_merge(&reply("Is it clear?")).unwrap(), "Is it clear?");
    assert!(parse_merge(&reply(r#"{"q": "x"}"#)).is_err());
    assert!(parse_merge(&reply(r#"{"question": "#)).is_err());
    assert!(parse_merge(&reply("  ")).is_err());
}

#[test]
fn tag_replies_need_both_booleans() {
    let (ga, ss, r) =
        parse_tag(&reply(r#"{"reasoning": "fine", "generally_applicable": true, "section_specific": "False"}"#))
            .unwrap();
    assert_eq!((ga, ss, r.as_str()), (true, false, "fine"));
    assert!(parse_tag(&reply(r#"{"generally_applicable": true}"#)).is_err());
    assert!(parse_tag(&reply("yes, both")).is_err());
    assert!(parse_tag(&reply(r#"{"generally_applicable": 1, "section_specific": true}"#)).is_err());
}

#[test]
fn sample_draw_is_deterministic_distinct_and_sorted() {
    let a = sample_indices(50, 10, 0);
    assert_eq!(a, sample_indices(50, 10, 0));
    assert_eq!(a.len(), 10);
    assert!(a.windows(2).all(|w| w[0] < w[1]));
    assert!(a.iter().all(|&i| i < 50));
    assert_ne!(a, sample_indices(50, 10, 1));
    assert_eq!(sample_indices(4, 10, 0), vec![0, 1, 2, 3]);
    assert_eq!(sample_indices(0, 3, 0), Vec::<usize>::new());
}

// ---- Selector ----

fn cfg(max: usize, beam: usize) -> BeamConfig {
    BeamConfig { max_questions: max, beam_width: beam, length_penalty: 0.0005, alpha: 0.5 }
}

/// The original's beam search, transcribed literally: every candidate scored from scratch, one
/// full stable sort per step, duplicates kept.
fn reference_beam(sim: &Similarity, coverage: Option<&CoverageMap>, c: &BeamConfig) -> Vec<usize> {
    let n = sim.len();
    let mut beam: Vec<(Vec<usize>, f64)> = vec![(Vec::new(), 0.0)];
    for _ in 0..c.max_questions {
        let mut cands = Vec::new();
        for (set, _) in &beam {
            for idx in 0..n {
                if set.contains(&idx) {
                    continue;
                }
                let mut s = set.clone();
                s.push(idx);
                s.sort_unstable();
                let score = set_metrics(&s, sim, coverage, c).score;
                cands.push((s, score));
            }
        }
        if cands.is_empty() {
            break;
        }
        cands.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        cands.truncate(c.beam_width);
        beam = cands;
    }
    let best = beam.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
    beam.into_iter().find(|b| b.1 == best).unwrap().0
}

fn hand_matrix() -> Similarity {
    Similarity::from_rows(&[
        vec![1.0, 0.9, 0.5, 0.6],
        vec![0.9, 1.0, 0.4, 0.0],
        vec![0.5, 0.4, 1.0, 0.3],
        vec![0.6, 0.0, 0.3, 1.0],
    ])
}

#[test]
fn beam_search_matches_the_original_on_hand_cases() {
    // Expectations produced by autochecklist 0.2.3's Selector._beam_search on the same matrices.
    let sim = hand_matrix();
    // Singletons all tie, so beam width 1 keeps {0} and pairs it with its most diverse partner.
    let r = beam_search(&sim, None, &cfg(2, 1));
    assert_eq!(r.indices, vec![0, 2]);
    assert!((r.diversity - 0.5).abs() < 1e-12);
    assert!((r.score - (0.5 - 0.001)).abs() < 1e-12);
    // Width 2 also extends {1}, which reaches the best pair {1, 3}.
    let r = beam_search(&sim, None, &cfg(2, 2));
    assert_eq!(r.indices, vec![1, 3]);
    assert!((r.diversity - 1.0).abs() < 1e-12);
    // Coverage: observation 0 covered by item 3, observations 1 and 2 by item 2.
    let items: Vec<ChecklistItem> = (0..4).map(|i| ChecklistItem::new(format!("i{i}"), "q")).collect();
    let entries = vec![
        CoverageEntry { observation: "o0".into(), item_ids: vec!["i3".into()] },
        CoverageEntry { observation: "o1".into(), item_ids: vec!["i2".into(), "unknown".into()] },
        CoverageEntry { observation: "o2".into(), item_ids: vec!["i2".into()] },
    ];
    let map = CoverageMap::build(&items, &entries);
    let r = beam_search(&sim, Some(&map), &cfg(2, 1));
    assert_eq!(r.indices, vec![2, 3]);
    assert!((r.diversity - 0.7).abs() < 1e-12);
    assert!((r.coverage - 1.0).abs() < 1e-12);
    assert!((r.score - (0.5 * 1.0 + 0.5 * 0.7 - 0.001)).abs() < 1e-12);
}

#[test]
fn beam_keeps_a_set_reached_twice_twice_as_the_original_does() {
    // Found by comparing the original with a variant that drops duplicate sets: the original
    // returns [0, 1, 2], the deduplicating variant [1, 2, 3]. Values are multiples of 1/8, so
    // every sum is exact and ties are real.
    let sim = Similarity::from_rows(&[
        vec![1.0, 0.25, 0.75, 0.625, 0.875],
        vec![0.25, 1.0, 0.25, 0.5, 0.25],
        vec![0.75, 0.25, 1.0, 0.0, 1.0],
        vec![0.625, 0.5, 0.0, 1.0, 0.75],
        vec![0.875, 0.25, 1.0, 0.75, 1.0],
    ]);
    assert_eq!(beam_search(&sim, None, &cfg(3, 2)).indices, vec![0, 1, 2]);
    assert_eq!(reference_beam(&sim, None, &cfg(3, 2)), vec![0, 1, 2]);
}

#[test]
fn incremental_beam_search_equals_the_literal_transcription() {
    for seed in 0..20u64 {
        let n = 9 + (seed as usize % 5);
        let vectors: Vec<Vec<f32>> =
            (0..n).map(|i| assay_testkit::hash_embedding(&format!("q{seed}-{i}"), 6)).collect();
        let sim = cosine_matrix(&vectors);
        let items: Vec<ChecklistItem> = (0..n).map(|i| ChecklistItem::new(format!("i{i}"), "q")).collect();
        let entries: Vec<CoverageEntry> = (0..7)
            .map(|o| CoverageEntry {
                observation: format!("o{o}"),
                item_ids: (0..n)
                    .filter(|i| (i * 7 + o + seed as usize).is_multiple_of(5))
                    .map(|i| format!("i{i}"))
                    .collect(),
            })
            .collect();
        let map = CoverageMap::build(&items, &entries);
        for (max, beam) in [(3, 1), (4, 3), (5, 5)] {
            let c = cfg(max, beam);
            assert_eq!(beam_search(&sim, None, &c).indices, reference_beam(&sim, None, &c), "seed {seed}");
            assert_eq!(
                beam_search(&sim, Some(&map), &c).indices,
                reference_beam(&sim, Some(&map), &c),
                "seed {seed} coverage"
            );
        }
    }
}

#[test]
fn coverage_follows_merged_ids() {
    let mut merged = ChecklistItem::new("a-merged", "q");
    merged.merged_from = vec!["a".into(), "b".into()];
    let items = vec![merged, ChecklistItem::new("c", "q")];
    let entries = vec![
        CoverageEntry { observation: "x".into(), item_ids: vec!["b".into()] },
        CoverageEntry { observation: "y".into(), item_ids: vec!["c".into(), "a".into()] },
    ];
    let map = CoverageMap::build(&items, &entries);
    assert_eq!(map.item_observations, vec![vec![0, 1], vec![1]]);
    assert_eq!(map.observations, 2);
}

#[test]
fn diversity_of_small_sets_is_one() {
    let sim = hand_matrix();
    assert_eq!(set_metrics(&[], &sim, None, &cfg(2, 1)).diversity, 1.0);
    assert_eq!(set_metrics(&[2], &sim, None, &cfg(2, 1)).diversity, 1.0);
    let m = set_metrics(&[0, 1, 2], &sim, None, &cfg(2, 1));
    assert!((m.diversity - (1.0 - (0.9 + 0.5 + 0.4) / 3.0)).abs() < 1e-12);
}

// ---- validation ----

#[test]
fn bad_options_name_their_fields() {
    let items = vec![ChecklistItem::new("a", "q?")];
    let steps = vec![
        RefinerStep::Deduplicate(DedupOptions { threshold: Some(1.5), ..Default::default() }),
        RefinerStep::Tag(TagOptions { concurrency: 1000, ..Default::default() }),
        RefinerStep::UnitTest(UnitTestOptions { max_samples: Some(0), threshold: Some(0.0), ..Default::default() }),
        RefinerStep::Select(SelectOptions {
            max_questions: Some(0),
            beam_width: Some(0),
            length_penalty: Some(-1.0),
            alpha: Some(f64::NAN),
            ..Default::default()
        }),
    ];
    assert_eq!(
        fields_of(validate_steps(&steps).unwrap_err()),
        vec![
            "steps[0].deduplicate.threshold",
            "steps[1].tag.concurrency",
            "steps[2].unit_test.samples",
            "steps[2].unit_test.threshold",
            "steps[2].unit_test.max_samples",
            "steps[3].select.max_questions",
            "steps[3].select.beam_width",
            "steps[3].select.length_penalty",
            "steps[3].select.alpha",
        ]
    );
    assert_eq!(fields_of(validate_steps(&[]).unwrap_err()), vec!["steps"]);
    validate_chain(&items, &[RefinerStep::Tag(TagOptions::default())]).unwrap();

    let mut v = Violations::new();
    let mut dup = vec![ChecklistItem::new("a", "q"), ChecklistItem::new("a", " "), ChecklistItem::new("", "q")];
    dup[0].weight = f64::NAN;
    validate_items(&dup, "items", &mut v);
    assert_eq!(
        fields_of(v.into_result().unwrap_err()),
        vec!["items[0].weight", "items[1].id", "items[1].question", "items[2].id"]
    );
    let mut v = Violations::new();
    let many: Vec<ChecklistItem> = (0..=MAX_ITEMS).map(|i| ChecklistItem::new(i.to_string(), "q")).collect();
    validate_items(&many, "items", &mut v);
    let StageError::InvalidArgument(f) = v.into_result().unwrap_err() else { unreachable!() };
    assert!(f[0].description.contains("the limit is 2000"), "{}", f[0].description);
}

#[test]
fn unit_test_samples_may_come_without_answers_but_not_without_text() {
    let sample = |text: &str| Sample { id: "s1".into(), text: text.into(), answers: BTreeMap::new() };
    let o = UnitTestOptions { samples: vec![sample("t")], ..Default::default() };
    let mut v = Violations::new();
    validate_unit_test(&o, "", &mut v);
    assert!(v.into_result().is_ok(), "unanswered samples are scored first");
    let o = UnitTestOptions { samples: vec![sample(" ")], ..Default::default() };
    let mut v = Violations::new();
    validate_unit_test(&o, "", &mut v);
    assert_eq!(fields_of(v.into_result().unwrap_err()), vec!["samples[0].text"]);
}
