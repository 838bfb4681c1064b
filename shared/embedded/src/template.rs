//! Prompt formats of the local chat models.

use assay_llm::{Message, ResponseFormat, Role};

/// Which local GGUF model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LocalModelChoice {
    /// SmolLM2-135M-Instruct (Q4_1): instruction tuned, ChatML. The default: on the labeled
    /// YES/NO set (`judge::JUDGE_SET`, `benches/local.rs`) both models are near chance, but
    /// SmolLM2 answers both ways while gemma-3-270m answers YES to nearly everything, and SmolLM2
    /// is smaller and about 4x faster under grammar constraints (49k vs 262k vocabulary).
    #[default]
    Smollm2,
    /// gemma-3-270m (Q4_K_M): a base (not instruction tuned) model.
    Gemma3,
}

impl LocalModelChoice {
    /// Model name reported in responses and accepted in requests.
    pub fn model_name(self) -> &'static str {
        match self {
            LocalModelChoice::Smollm2 => "smollm2-135m-instruct",
            LocalModelChoice::Gemma3 => "gemma-3-270m",
        }
    }

    /// The prompt style that judged best for this model.
    pub fn default_prompt_style(self) -> PromptStyle {
        match self {
            LocalModelChoice::Smollm2 => PromptStyle::Chat,
            LocalModelChoice::Gemma3 => PromptStyle::Chat,
        }
    }

    /// Parses `smollm2` / `gemma3` (and the model names).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "smollm2" | "smollm2-135m-instruct" | "smollm" => Some(LocalModelChoice::Smollm2),
            "gemma3" | "gemma-3-270m" | "gemma" | "gemma3-270m" => Some(LocalModelChoice::Gemma3),
            _ => None,
        }
    }
}

impl std::str::FromStr for LocalModelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s).ok_or_else(|| format!("unknown local model {s:?} (expected smollm2 or gemma3)"))
    }
}

impl std::fmt::Display for LocalModelChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LocalModelChoice::Smollm2 => "smollm2",
            LocalModelChoice::Gemma3 => "gemma3",
        })
    }
}

/// How messages become a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptStyle {
    /// The model's chat template (ChatML for SmolLM2, gemma turns for gemma-3).
    Chat,
    /// Plain text ("System/User/Assistant:" transcript), for base models.
    Completion,
}

/// A piece of prompt text: template markup (special tokens parsed) or content (never parsed as
/// special tokens, so user text cannot inject template markup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Markup(String),
    Content(String),
}

const SMOLLM2_DEFAULT_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// The instruction appended to the last user message for constrained formats.
pub fn format_hint(format: &ResponseFormat, messages: &[Message]) -> Option<String> {
    match format {
        ResponseFormat::Text => None,
        ResponseFormat::Choice(opts) => Some(format!("Answer with exactly one of: {}.", opts.join(", "))),
        ResponseFormat::JsonSchema { schema, .. } => {
            let mentions_json = messages.iter().any(|m| m.content.to_ascii_lowercase().contains("json"));
            if mentions_json {
                None
            } else {
                Some(format!("Respond with a JSON value matching this JSON schema: {schema}"))
            }
        }
    }
}

/// Builds the prompt for `messages`, ending where the assistant's reply starts.
pub fn render(model: LocalModelChoice, style: PromptStyle, messages: &[Message], hint: Option<&str>) -> Vec<Segment> {
    let mut msgs: Vec<Message> = messages.to_vec();
    if let Some(h) = hint {
        match msgs.iter_mut().rev().find(|m| m.role == Role::User) {
            Some(last) => last.content = format!("{}\n\n{h}", last.content.trim_end()),
            None => msgs.push(Message::user(h)),
        }
    }
    let mut out = Vec::new();
    let markup = |out: &mut Vec<Segment>, s: &str| out.push(Segment::Markup(s.to_string()));
    let content = |out: &mut Vec<Segment>, s: &str| out.push(Segment::Content(s.to_string()));
    match (style, model) {
        (PromptStyle::Chat, LocalModelChoice::Smollm2) => {
            if msgs.first().is_none_or(|m| m.role != Role::System) {
                markup(&mut out, "<|im_start|>system\n");
                content(&mut out, SMOLLM2_DEFAULT_SYSTEM);
                markup(&mut out, "<|im_end|>\n");
            }
            for m in &msgs {
                let role = match m.role {
                    Role::System => "system",
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                markup(&mut out, &format!("<|im_start|>{role}\n"));
                content(&mut out, &m.content);
                markup(&mut out, "<|im_end|>\n");
            }
            markup(&mut out, "<|im_start|>assistant\n");
        }
        (PromptStyle::Chat, LocalModelChoice::Gemma3) => {
            // Gemma has no system role: system text is prefixed to the first user turn.
            let system: Vec<&str> =
                msgs.iter().filter(|m| m.role == Role::System).map(|m| m.content.as_str()).collect();
            let mut pending_system = (!system.is_empty()).then(|| system.join("\n\n"));
            for m in msgs.iter().filter(|m| m.role != Role::System) {
                let role = if m.role == Role::Assistant { "model" } else { "user" };
                markup(&mut out, &format!("<start_of_turn>{role}\n"));
                if role == "user"
                    && let Some(s) = pending_system.take()
                {
                    content(&mut out, &format!("{s}\n\n"));
                }
                content(&mut out, m.content.trim());
                markup(&mut out, "<end_of_turn>\n");
            }
            if let Some(s) = pending_system {
                markup(&mut out, "<start_of_turn>user\n");
                content(&mut out, &s);
                markup(&mut out, "<end_of_turn>\n");
            }
            markup(&mut out, "<start_of_turn>model\n");
        }
        (PromptStyle::Completion, _) => {
            let mut text = String::new();
            for m in &msgs {
                match m.role {
                    Role::System => text.push_str(&format!("{}\n\n", m.content.trim())),
                    Role::User => text.push_str(&format!("Question: {}\n", m.content.trim())),
                    Role::Assistant => text.push_str(&format!("Answer: {}\n\n", m.content.trim())),
                }
            }
            text.push_str("Answer:");
            content(&mut out, &text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(segs: &[Segment]) -> String {
        segs.iter()
            .map(|s| match s {
                Segment::Markup(t) | Segment::Content(t) => t.as_str(),
            })
            .collect()
    }

    #[test]
    fn chatml() {
        let p = render(
            LocalModelChoice::Smollm2,
            PromptStyle::Chat,
            &[Message::system("S"), Message::user("Q")],
            Some("Answer with exactly one of: YES, NO."),
        );
        assert_eq!(
            flat(&p),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ\n\nAnswer with exactly one of: YES, NO.<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn gemma_turns() {
        let p = render(LocalModelChoice::Gemma3, PromptStyle::Chat, &[Message::system("S"), Message::user("Q")], None);
        assert_eq!(flat(&p), "<start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\n");
    }

    #[test]
    fn choice_parse() {
        assert_eq!("gemma3".parse::<LocalModelChoice>().unwrap(), LocalModelChoice::Gemma3);
        assert!("gpt".parse::<LocalModelChoice>().is_err());
    }
}
