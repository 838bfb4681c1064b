//! A small labeled YES/NO set to measure how well a local model judges: obvious facts and
//! "does this text satisfy this requirement" checks, balanced 15 YES / 15 NO.

use assay_llm::{ChatModel, ChatRequest, Message, ResponseFormat};

/// (question, expected answer is YES).
pub const JUDGE_SET: &[(&str, bool)] = &[
    ("Is Paris the capital of France?", true),
    ("Is the Pacific Ocean larger than the Atlantic Ocean?", true),
    ("Is water made of hydrogen and oxygen?", true),
    ("Does a week have seven days?", true),
    ("Is 2 + 2 equal to 4?", true),
    ("Is the Sun a star?", true),
    ("Do fish live in water?", true),
    ("Is Berlin the capital of Spain?", false),
    ("Is 10 smaller than 3?", false),
    ("Can humans breathe underwater without any equipment?", false),
    ("Is ice hotter than boiling water?", false),
    ("Does a triangle have five sides?", false),
    ("Is the Moon bigger than the Earth?", false),
    ("Do cats have six legs?", false),
    (
        "Text: \"The meeting is on Monday at 10am in room 4.\"\nRequirement: The text mentions a time.\nDoes the text satisfy the requirement?",
        true,
    ),
    (
        "Text: \"I love sunny days at the beach.\"\nRequirement: The text is written in French.\nDoes the text satisfy the requirement?",
        false,
    ),
    (
        "Text: \"Bonjour, comment allez-vous ?\"\nRequirement: The text is written in French.\nDoes the text satisfy the requirement?",
        true,
    ),
    (
        "Text: \"Call me at 555-0100.\"\nRequirement: The text contains a phone number.\nDoes the text satisfy the requirement?",
        true,
    ),
    (
        "Text: \"The weather is nice today.\"\nRequirement: The text contains a phone number.\nDoes the text satisfy the requirement?",
        false,
    ),
    (
        "Text: \"Apples, bananas and cherries are fruits.\"\nRequirement: The text mentions bananas.\nDoes the text satisfy the requirement?",
        true,
    ),
    (
        "Text: \"Dogs are loyal animals.\"\nRequirement: The text mentions cats.\nDoes the text satisfy the requirement?",
        false,
    ),
    (
        "Text: \"Error: file not found.\"\nRequirement: The text reports an error.\nDoes the text satisfy the requirement?",
        true,
    ),
    (
        "Text: \"All tests passed successfully.\"\nRequirement: The text reports an error.\nDoes the text satisfy the requirement?",
        false,
    ),
    (
        "Text: \"Thank you so much, this was wonderful!\"\nRequirement: The text expresses a positive sentiment.\nDoes the text satisfy the requirement?",
        true,
    ),
    (
        "Text: \"This is the worst product I have ever bought.\"\nRequirement: The text expresses a positive sentiment.\nDoes the text satisfy the requirement?",
        false,
    ),
    ("Text: \"hello\"\nRequirement: The text is longer than 50 words.\nDoes the text satisfy the requirement?", false),
    (
        "Text: \"SELECT * FROM users;\"\nRequirement: The text is an SQL query.\nDoes the text satisfy the requirement?",
        true,
    ),
    (
        "Text: \"Once upon a time there was a king.\"\nRequirement: The text is an SQL query.\nDoes the text satisfy the requirement?",
        false,
    ),
    ("Is 7 an even number?", false),
    ("Is Tokyo in Japan?", true),
];

/// The system prompt used for the judge set.
pub const JUDGE_SYSTEM: &str = "You are a careful evaluator. Answer the question truthfully with YES or NO.";

/// The request used for one judge question (greedy, closed YES/NO choice, top-20 logprobs).
pub fn judge_request(question: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![Message::system(JUDGE_SYSTEM), Message::user(question)],
        temperature: Some(0.0),
        max_tokens: Some(4),
        response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
        top_logprobs: Some(20),
        ..ChatRequest::default()
    }
}

/// Result of running the judge set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JudgeReport {
    pub total: usize,
    pub correct: usize,
    /// How many times the model answered YES.
    pub said_yes: usize,
    /// Questions answered wrongly.
    pub wrong: Vec<String>,
    /// Area under the ROC curve of the first-token margin log P(yes) - log P(no): whether the
    /// model's probabilities rank YES items above NO items (0.5 = no signal), which a scorer
    /// using logprobs with a calibrated threshold can exploit even when greedy answers are biased.
    pub auc: f64,
}

impl JudgeReport {
    pub fn accuracy(&self) -> f64 {
        if self.total == 0 { 0.0 } else { self.correct as f64 / self.total as f64 }
    }
}

/// log P(yes) - log P(no) of the first token, from its alternatives (case-insensitive prefixes
/// of "yes" and "no"; missing mass counts as e^-30).
pub fn yes_no_margin(alternatives: &[assay_llm::TokenLogprob]) -> f64 {
    let mass = |word: &str| {
        alternatives
            .iter()
            .filter(|l| {
                let t = l.token.trim().to_lowercase();
                !t.is_empty() && word.starts_with(&t)
            })
            .map(|l| l.logprob.exp())
            .sum::<f64>()
            .max((-30f64).exp())
            .ln()
    };
    mass("yes") - mass("no")
}

/// Area under the ROC curve of `scores` for the positive `labels` (ties count half).
pub fn auc(scores: &[f64], labels: &[bool]) -> f64 {
    let (mut wins, mut pairs) = (0.0, 0.0);
    for (i, &si) in scores.iter().enumerate() {
        for (j, &sj) in scores.iter().enumerate() {
            if labels[i] && !labels[j] {
                pairs += 1.0;
                wins += if si > sj {
                    1.0
                } else if si == sj {
                    0.5
                } else {
                    0.0
                };
            }
        }
    }
    if pairs == 0.0 { 0.5 } else { wins / pairs }
}

/// Runs [`JUDGE_SET`] through `model`.
pub async fn run_judge_set(model: &dyn ChatModel) -> Result<JudgeReport, assay_llm::LlmError> {
    let mut report = JudgeReport { total: JUDGE_SET.len(), ..JudgeReport::default() };
    let (mut margins, mut labels) = (Vec::new(), Vec::new());
    for (question, expected_yes) in JUDGE_SET {
        let reply = model.chat(judge_request(question)).await?;
        margins.push(yes_no_margin(reply.first_token_logprobs.as_deref().unwrap_or_default()));
        labels.push(*expected_yes);
        let said_yes = reply.text.trim() == "YES";
        report.said_yes += usize::from(said_yes);
        if said_yes == *expected_yes {
            report.correct += 1;
        } else {
            report.wrong.push(question.lines().next().unwrap_or(question).to_string());
        }
    }
    report.auc = auc(&margins, &labels);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_and_margin() {
        assert_eq!(auc(&[3.0, 2.0, 1.0, 0.0], &[true, true, false, false]), 1.0);
        assert_eq!(auc(&[0.0, 1.0], &[true, false]), 0.0);
        assert_eq!(auc(&[1.0, 1.0], &[true, false]), 0.5);
        let lp = |t: &str, l: f64| assay_llm::TokenLogprob { token: t.into(), logprob: l };
        let m = yes_no_margin(&[lp("Yes", -1.0), lp(" NO", -2.0), lp("Y", -3.0), lp("The", -0.5)]);
        assert!((m - (((-1f64).exp() + (-3f64).exp()).ln() + 2.0)).abs() < 1e-9);
        assert_eq!(JUDGE_SET.iter().filter(|(_, y)| *y).count(), 15);
    }
}
