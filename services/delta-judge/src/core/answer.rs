//! The YES/NO answer a model reply opens with, and its probability from the first token's
//! logprobs: read the same way by Verify's issue checks and by CheckConsistency.

use assay_domain::Answer;
use assay_llm::{ChatResponse, TokenLogprob};

/// P(yes) / (P(yes) + P(no)) over the first token's alternatives (lower-cased, trimmed); 0.5 when
/// neither appears.
pub fn yes_confidence(alts: &[TokenLogprob]) -> f64 {
    answer_probability(alts, Answer::Yes).unwrap_or(0.5)
}

/// The probability of `answer` among YES and NO over the first token's alternatives
/// (lower-cased, trimmed); `None` when neither appears.
pub fn answer_probability(alts: &[TokenLogprob], answer: Answer) -> Option<f64> {
    let (mut p_yes, mut p_no) = (0.0f64, 0.0f64);
    for a in alts {
        match a.token.trim().to_lowercase().as_str() {
            "yes" => p_yes += a.logprob.exp(),
            "no" => p_no += a.logprob.exp(),
            _ => {}
        }
    }
    if p_yes + p_no < 1e-9 {
        return None;
    }
    let p = p_yes / (p_yes + p_no);
    Some(match answer {
        Answer::Yes => p,
        Answer::No => 1.0 - p,
    })
}

/// The answer a reply opens with: its first word, else (a reply that opens otherwise) the likelier
/// of YES and NO among the first token's alternatives.
pub fn reply_answer(reply: &ChatResponse) -> Option<Answer> {
    let first = reply.text.split_whitespace().next().and_then(|w| {
        // "NO," / "YES." / "NO:" open a sentence too.
        Answer::parse(w.split([',', '.', ':', ';', '-']).next().unwrap_or(w))
    });
    first.or_else(|| {
        let alts = reply.first_token_logprobs.as_deref()?;
        answer_probability(alts, Answer::Yes)
            .filter(|p| (*p - 0.5).abs() > 1e-9)
            .map(|p| if p > 0.5 { Answer::Yes } else { Answer::No })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_from_alternatives() {
        let lp = |t: &str, p: f64| TokenLogprob { token: t.into(), logprob: p.ln() };
        assert!((yes_confidence(&[lp("YES", 0.6), lp(" yes", 0.2), lp("No", 0.2)]) - 0.8).abs() < 1e-12);
        assert_eq!(yes_confidence(&[lp("maybe", 0.9)]), 0.5);
    }
}
