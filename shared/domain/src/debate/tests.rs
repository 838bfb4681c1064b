//! The debate's types, answers and checks.

use crate::error::{StageError, Violations};

use super::checks::*;
use super::*;

#[test]
fn blank_solution_ids_do_not_name_the_default_solvers() {
    // A blank solver id is the default one wherever a solver is given, so it cannot name one
    // when solvers are filled from the solutions either (found by the round-trip property).
    let ids: Vec<String> = solvers_or_default(vec![], &["\t", " ", "x"]).into_iter().map(|s| s.id).collect();
    assert_eq!(ids, ["solver_1", "solver_2", "solver_3"]);
    let ids: Vec<String> = solvers_or_default(vec![], &["a", "b", "c"]).into_iter().map(|s| s.id).collect();
    assert_eq!(ids, ["a", "b", "c"]);
}

#[test]
fn answers_are_normalised() {
    assert_eq!(normalize_answer("  The Answer: 42. "), "theanswer42");
    assert_eq!(normalize_answer("42"), normalize_answer("42.0"));
    assert_eq!(normalize_answer("1,000"), normalize_answer("1000"));
    assert_eq!(normalize_answer("$1,000.50"), "1000.5");
    assert_eq!(normalize_answer("+3"), "3");
    assert_eq!(normalize_answer("-0.0"), "0");
    assert_eq!(normalize_answer("x = -2"), "x-2");
    assert_eq!(normalize_answer("3.14"), "3.14");
    assert_ne!(normalize_answer("3.14"), normalize_answer("314"));
    assert_eq!(normalize_answer("Paris!"), normalize_answer("paris"));
    assert_eq!(normalize_answer("a1.5b"), "a1.5b");
    assert_eq!(normalize_answer("x2-3"), "x23");
    assert_eq!(normalize_answer(".5"), "0.5");
    assert_eq!(normalize_answer("1, 2, 3"), "123");
    assert_eq!(normalize_answer("007"), "7");
    // Fractions: reduced, decimal when they terminate, never run together with their digits.
    assert_eq!(normalize_answer("1/2"), "0.5");
    assert_eq!(normalize_answer("1/2"), normalize_answer("0.5"));
    assert_ne!(normalize_answer("1/2"), normalize_answer("12"));
    assert_eq!(normalize_answer("6/4"), "1.5");
    assert_eq!(normalize_answer("-3/8"), "-0.375");
    assert_eq!(normalize_answer("2/6"), "1/3");
    assert_eq!(normalize_answer("2/6"), normalize_answer("1/3"));
    assert_eq!(normalize_answer("10/5"), "2");
    assert_eq!(normalize_answer("x = 3/4 cup"), "x0.75cup");
    assert_eq!(normalize_answer("1/0"), "1/0");
    assert_eq!(normalize_answer("1.5/3"), "1.5/3");
    assert_eq!(normalize_answer("7/1024"), "0.0068359375");
    assert_ne!(normalize_answer("12345678901234567890"), normalize_answer("12345678901234567891"));
}

#[test]
fn agreement_needs_equal_non_empty_answers() {
    assert!(answers_agree(["42", "42.0", " 42. "]));
    assert!(!answers_agree(["42", "43", "42"]));
    assert!(!answers_agree(["", "", ""]));
    assert!(!answers_agree(Vec::<&str>::new()));
}

fn refined(id: &str, answer: &str, confidence: f64) -> RefinedSolution {
    RefinedSolution { solver_id: id.into(), final_answer: answer.into(), confidence, ..Default::default() }
}

#[test]
fn majority_vote_takes_the_most_held_answer_then_confidence() {
    let v = majority_vote(&[refined("a", "41", 0.9), refined("b", "42", 0.6), refined("c", "42.0", 0.7)]).unwrap();
    assert_eq!((v.winner_solver_id.as_str(), v.answer.as_str(), v.votes, v.total), ("c", "42.0", 2, 3));
    let v = majority_vote(&[refined("a", "1", 0.5), refined("b", "2", 0.8), refined("c", "3", 0.8)]).unwrap();
    assert_eq!((v.winner_solver_id.as_str(), v.votes), ("b", 1));
    assert!(majority_vote(&[]).is_none());
}

#[test]
fn solvers_are_none_or_three_with_unique_ids() {
    let mut v = Violations::new();
    check_solvers(&default_solvers()[..2], "", &mut v);
    let e = v.into_result().unwrap_err();
    assert!(e.to_string().contains("solvers: has 2 solvers"), "{e}");
    let mut solvers = default_solvers();
    solvers[2].id = "solver_1".into();
    let mut v = Violations::new();
    check_solvers(&solvers, "request", &mut v);
    assert!(v.into_result().unwrap_err().to_string().contains("request.solvers[2].id"));
    let filled = solvers_or_default(Vec::new(), &["a", "b", "c"]);
    assert_eq!(filled.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(filled[1].model.temperature, Some(0.5));
}

fn solution(id: &str) -> Solution {
    Solution { solver_id: id.into(), final_answer: "42".into(), confidence: 0.5, ..Default::default() }
}

fn review(by: &str, of: &str) -> Review {
    Review { reviewer_id: by.into(), target_solver_id: of.into(), ..Default::default() }
}

#[test]
fn refinement_names_the_missing_solution_and_review() {
    let ids = ["solver_1", "solver_2", "solver_3"];
    let all_reviews: Vec<Review> =
        ids.iter().flat_map(|a| ids.iter().filter(move |b| *b != a).map(move |b| review(a, b))).collect();
    let request = RefineRequest {
        problem: "p".into(),
        solutions: vec![solution("solver_1"), solution("solver_2")],
        reviews: all_reviews[1..].to_vec(),
        ..Default::default()
    };
    let StageError::InvalidArgument(vs) = request.checked("").unwrap_err() else { panic!("not invalid") };
    let text: Vec<String> = vs.iter().map(|v| format!("{}: {}", v.field, v.description)).collect();
    assert!(text.iter().any(|t| t.contains("solutions: has no solution of solver \"solver_3\"")), "{text:?}");
    assert!(text.iter().any(|t| t.contains("missing the review by solver_1")), "{text:?}");
    let request = RefineRequest {
        problem: "p".into(),
        solutions: ids.iter().map(|i| solution(i)).collect(),
        ..Default::default()
    };
    let e = request.checked("").unwrap_err();
    assert!(matches!(&e, StageError::FailedPrecondition(m) if m.contains("reviews is empty: run Review")), "{e}");
    let ok = RefineRequest {
        problem: "p".into(),
        solutions: ids.iter().map(|i| solution(i)).collect(),
        reviews: all_reviews,
        ..Default::default()
    };
    assert_eq!(ok.checked("").unwrap().solvers.len(), 3);
}

#[test]
fn a_self_review_is_refused() {
    let ids = ["solver_1", "solver_2", "solver_3"];
    let mut reviews: Vec<Review> =
        ids.iter().flat_map(|a| ids.iter().filter(move |b| *b != a).map(move |b| review(a, b))).collect();
    reviews[0].target_solver_id = "solver_1".into();
    let request = ReviewRequest {
        problem: "p".into(),
        solutions: ids.iter().map(|i| solution(i)).collect(),
        ..Default::default()
    };
    assert!(request.checked("").is_ok());
    let request = RefineRequest {
        problem: "p".into(),
        solutions: ids.iter().map(|i| solution(i)).collect(),
        reviews,
        ..Default::default()
    };
    assert!(request.checked("").unwrap_err().to_string().contains("reviews itself"));
}

#[test]
fn raw_replies_are_bounded() {
    let long = "é".repeat(MAX_RAW_REPLY_BYTES);
    let r = RawReply::new(&long, "length");
    assert_eq!((r.text.len(), r.bytes as usize), (MAX_RAW_REPLY_BYTES, 2 * MAX_RAW_REPLY_BYTES));
    assert!(r.truncated() && !RawReply::new("{}", "stop").truncated());
    let mut s = solution("a");
    s.raw_replies = vec![RawReply::new("{}", "stop"); 3];
    s.raw_replies[1].text = "x".repeat(MAX_RAW_REPLY_BYTES + 1);
    let mut v = Violations::new();
    check_solution(&s, "solutions[0]", &mut v);
    let e = v.into_result().unwrap_err().to_string();
    assert!(e.contains("solutions[0].raw_replies: has 3 entries; the limit is 2"), "{e}");
    assert!(e.contains("solutions[0].raw_replies[1].text: is 16385 bytes; the limit is 16384 bytes"), "{e}");
}

#[test]
fn rounds_and_problem_are_bounded() {
    let r = DebateRequest { problem: " ".into(), rounds: 0, ..Default::default() };
    let e = r.checked("request").unwrap_err().to_string();
    assert!(e.contains("request.problem: must not be empty") && e.contains("request.rounds"), "{e}");
    let r = DebateRequest { problem: "x".repeat(MAX_PROBLEM_BYTES + 1), ..Default::default() };
    assert!(r.checked("").unwrap_err().to_string().contains("the limit is 32768 bytes"));
}
