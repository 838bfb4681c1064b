//! One item's score: the yes/no answer, its confidence band, whether the item was answered, and
//! the majority of several samples' answers to one item.

use serde::{Deserialize, Serialize};

/// A yes/no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    Yes,
    No,
}

impl Answer {
    /// Case-insensitive YES/NO (surrounding whitespace and punctuation ignored).
    pub fn parse(s: &str) -> Option<Answer> {
        let t = s.trim().trim_matches(|c: char| !c.is_alphanumeric());
        if t.eq_ignore_ascii_case("yes") {
            Some(Answer::Yes)
        } else if t.eq_ignore_ascii_case("no") {
            Some(Answer::No)
        } else {
            None
        }
    }
}

/// Confidence band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfidenceLevel {
    No10,
    No30,
    Unsure,
    Yes70,
    Yes90,
}

impl ConfidenceLevel {
    /// Band of a confidence: < 0.2 no_10; < 0.4 no_30; < 0.6 unsure; < 0.8 yes_70; else yes_90.
    pub fn of(confidence: f64) -> ConfidenceLevel {
        if confidence < 0.2 {
            ConfidenceLevel::No10
        } else if confidence < 0.4 {
            ConfidenceLevel::No30
        } else if confidence < 0.6 {
            ConfidenceLevel::Unsure
        } else if confidence < 0.8 {
            ConfidenceLevel::Yes70
        } else {
            ConfidenceLevel::Yes90
        }
    }

    /// The answer a band implies (unsure counts as no).
    pub fn answer(self) -> Answer {
        match self {
            ConfidenceLevel::No10 | ConfidenceLevel::No30 | ConfidenceLevel::Unsure => Answer::No,
            ConfidenceLevel::Yes70 | ConfidenceLevel::Yes90 => Answer::Yes,
        }
    }
}

/// Whether an item got a usable answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ItemStatus {
    Answered,
    Unanswered,
    Unparseable,
    Failed,
}

/// The answer to one item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemScore {
    pub item_id: String,
    pub answer: Option<Answer>,
    pub confidence: Option<f64>,
    pub confidence_level: Option<ConfidenceLevel>,
    pub reasoning: Option<String>,
    pub status: ItemStatus,
    pub error: String,
    /// With several samples: each sample's answer in sample order (`None`: that sample abstained).
    /// Empty with one sample.
    pub sample_answers: Vec<Option<Answer>>,
    /// YES samples / answered samples; `None` with one sample or when no sample answered.
    pub yes_share: Option<f64>,
    /// The answered samples disagree.
    pub flaky: bool,
    /// Samples with no answer for this item (unparseable, unanswered or failed), never a NO.
    pub abstentions: u32,
}

impl ItemScore {
    pub fn answered(item_id: impl Into<String>, answer: Answer) -> Self {
        Self {
            item_id: item_id.into(),
            answer: Some(answer),
            confidence: None,
            confidence_level: None,
            reasoning: None,
            status: ItemStatus::Answered,
            error: String::new(),
            sample_answers: Vec::new(),
            yes_share: None,
            flaky: false,
            abstentions: 0,
        }
    }

    pub fn missing(item_id: impl Into<String>, status: ItemStatus, error: impl Into<String>) -> Self {
        Self {
            item_id: item_id.into(),
            answer: None,
            confidence: None,
            confidence_level: None,
            reasoning: None,
            status,
            error: error.into(),
            sample_answers: Vec::new(),
            yes_share: None,
            flaky: false,
            abstentions: 0,
        }
    }

    pub fn is_yes(&self) -> bool {
        self.answer == Some(Answer::Yes)
    }

    /// The item was answered (it counts in the rates).
    pub fn has_answer(&self) -> bool {
        self.status == ItemStatus::Answered && self.answer.is_some()
    }

    /// One item judged by several samples (`samples[i]` is sample i's score of this item, at least
    /// one): the majority over the samples that answered (a tie is NO, and flaky), the yes-share,
    /// the abstentions (samples without an answer, never counted as NO). Answered when at least one
    /// sample answered, else the first sample's status and error. Confidence is the mean of the
    /// answered samples' confidences; reasoning the first one agreeing with the majority.
    pub fn majority(samples: &[ItemScore]) -> ItemScore {
        let answered: Vec<&ItemScore> =
            samples.iter().filter(|s| s.status == ItemStatus::Answered && s.answer.is_some()).collect();
        let sample_answers: Vec<Option<Answer>> =
            samples.iter().map(|s| if s.status == ItemStatus::Answered { s.answer } else { None }).collect();
        let abstentions = (samples.len() - answered.len()) as u32;
        let Some(first) = samples.first() else {
            return ItemScore::missing("", ItemStatus::Unanswered, "no sample");
        };
        if answered.is_empty() {
            return ItemScore {
                sample_answers,
                abstentions,
                ..ItemScore::missing(&first.item_id, first.status, &first.error)
            };
        }
        let yes = answered.iter().filter(|s| s.is_yes()).count();
        let no = answered.len() - yes;
        let answer = if yes > no { Answer::Yes } else { Answer::No };
        let confidences: Vec<f64> = answered.iter().filter_map(|s| s.confidence).collect();
        let confidence = (!confidences.is_empty()).then(|| confidences.iter().sum::<f64>() / confidences.len() as f64);
        ItemScore {
            item_id: first.item_id.clone(),
            answer: Some(answer),
            confidence,
            confidence_level: confidence.map(ConfidenceLevel::of),
            reasoning: answered.iter().find(|s| s.answer == Some(answer)).and_then(|s| s.reasoning.clone()),
            status: ItemStatus::Answered,
            error: String::new(),
            sample_answers,
            yes_share: Some(yes as f64 / answered.len() as f64),
            flaky: yes > 0 && no > 0,
            abstentions,
        }
    }
}
