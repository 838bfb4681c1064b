//! The issue checks: one YES/NO "was issue X fixed?" model call per issue, its prompt, and the
//! verdict and rejection reason read from its reply.

use assay_domain::template::render;
use assay_domain::verify::{IssueVerification, VerifyRequest};
use assay_domain::{Answer, JudgeIssue, Section, Usage};
use assay_llm::{ChatRequest, ChatResponse, Message, Purpose, ResolvedChat, ResponseFormat};

use crate::core::answer::{answer_probability, reply_answer};

/// The "was issue X fixed?" prompt.
pub const VERIFY_TEMPLATE: &str = include_str!("../../../prompts/verify_issue.txt");

/// One issue's check: the verification, its usage, whether logprobs were missing, and why a YES
/// did not count (below `min_fix_confidence`).
pub(super) struct IssueResult {
    pub(super) verification: IssueVerification,
    pub(super) usage: Usage,
    pub(super) logprobs_missing: bool,
    pub(super) demand_unmet: Option<String>,
}

/// The verdict of one reply: the model's answer; with `min_fix_confidence`, a YES must also reach it.
pub(super) fn interpret(issue_id: &str, reply: &ChatResponse, min_fix_confidence: Option<f64>) -> IssueResult {
    let mut v = IssueVerification {
        issue_id: issue_id.to_string(),
        fixed: false,
        confidence: None,
        answer: reply_answer(reply),
        error: String::new(),
    };
    let alts = reply.first_token_logprobs.as_deref().filter(|l| !l.is_empty());
    let logprobs_missing = alts.is_none();
    let mut demand_unmet = None;
    match v.answer {
        Some(answer) => {
            v.confidence = alts.and_then(|a| answer_probability(a, answer));
            v.fixed = answer == Answer::Yes;
            if let (true, Some(min)) = (v.fixed, min_fix_confidence) {
                match v.confidence {
                    Some(c) if c >= min => {}
                    Some(c) => {
                        v.fixed = false;
                        demand_unmet = Some(format!(
                            "issue {issue_id} answered YES at confidence {c:.2}, below min_fix_confidence {min:.2}"
                        ));
                    }
                    None => {
                        v.fixed = false;
                        demand_unmet = Some(format!(
                            "issue {issue_id} answered YES with no confidence to hold against min_fix_confidence \
                             {min:.2} (the backend gave no logprobs)"
                        ));
                    }
                }
            }
        }
        None => {
            let shown: String = reply.text.chars().take(60).collect();
            v.error = format!("the reply holds no yes/no answer: {shown:?}");
        }
    }
    IssueResult { verification: v, usage: reply.usage.clone(), logprobs_missing, demand_unmet }
}

/// The verification prompt of one issue. The issue (a judge's text) and both versions of the
/// section (caller and model text) are fenced (see [`assay_domain::template::fence_untrusted`]) so
/// they cannot close the tags they are quoted between and pose as instructions after the rule.
pub fn prompt(issue: &JudgeIssue, before: &Section, after: &Section) -> String {
    use assay_domain::template::fence_untrusted as fence;
    render(
        VERIFY_TEMPLATE,
        &[
            ("issue_id", &fence(&issue.id)),
            ("criterion", &fence(&issue.criterion)),
            ("severity", issue.severity.as_str()),
            ("description", &fence(&issue.description)),
            ("fix_instruction", &fence(&issue.fix_instruction)),
            ("location", &fence(&issue.location)),
            ("before", &fence(&before.content)),
            ("after", &fence(&after.content)),
        ],
    )
}

pub(super) async fn check_issue(
    chat: &ResolvedChat,
    purpose: Purpose,
    request: &VerifyRequest,
    issue: &JudgeIssue,
) -> IssueResult {
    let req = ChatRequest {
        // The answer must be the first token for its logprobs to mean anything.
        response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
        top_logprobs: Some(5),
        ..chat.request(vec![Message::user(prompt(issue, &request.before, &request.after))], purpose)
    };
    match chat.model.chat(req).await {
        Ok(reply) => interpret(&issue.id, &reply, request.min_fix_confidence),
        Err(e) => {
            tracing::warn!(issue = %issue.id, error = %e, "issue check failed");
            IssueResult {
                verification: IssueVerification {
                    issue_id: issue.id.clone(),
                    fixed: false,
                    confidence: None,
                    answer: None,
                    error: e.to_string(),
                },
                usage: Usage::default(),
                logprobs_missing: false,
                demand_unmet: None,
            }
        }
    }
}

pub(super) fn issue_reason(r: &IssueResult) -> Option<String> {
    let v = &r.verification;
    if !v.error.is_empty() {
        Some(format!("issue {} not verified: {}", v.issue_id, v.error))
    } else if v.fixed {
        None
    } else if let Some(why) = &r.demand_unmet {
        Some(why.clone())
    } else {
        Some(match v.confidence {
            Some(c) => format!("issue {} not fixed (the model answered NO, confidence {c:.2})", v.issue_id),
            None => format!("issue {} not fixed (the model answered NO)", v.issue_id),
        })
    }
}
