//! The section judge panel (the Stage 6 judges): every judge is one model call
//! with a JSON-schema reply giving a score in [0, 1] per criterion and targeted issues per section.
//! Judges run concurrently; a judge whose call fails or whose reply cannot be used is reported as
//! failed with its reason, never as a zero score, and the other judges' verdicts stand.
//!
//! Parsing is tolerant of shape but never invents values:
//! - every requested criterion needs a numeric score (a number or a numeric string) in [0, 1]; a
//!   score that is missing, non-numeric or out of range fails the judge (the scale is not guessed);
//! - an issue with an unknown severity or without a criterion is dropped and noted in the result
//!   (`JudgeResult.error` next to the verdict), the rest of the verdict stands;
//! - an issue whose criterion is not one of the request's is kept under the judge's name for it;
//! - an issue naming a section the document does not have is kept with an empty section id and
//!   counted in `unknown_section_issues`;
//! - section scores are optional; entries for unknown sections or criteria are dropped (noted),
//!   a non-numeric or out-of-range one fails the judge like a criterion score.
//!
//! Focused judging (a request with read-only `context`, e.g. re-judging the sections an iteration
//! changed): the judges see PART of the document, through their own template
//! ([`FOCUSED_TEMPLATE`]). The judged sections are quoted in full between `<section>` tags; each
//! context section, in document order (by `index`), is an excerpt between `<context>` tags fenced
//! like the sections: the last [`CONTEXT_EXCERPT_CHARS`] characters of one that comes before a
//! judged section, the first [`CONTEXT_EXCERPT_CHARS`] of one that comes after, both ends of one
//! between two judged sections, the whole of one short enough. The criterion scores then describe
//! the judged sections; the prompt and the schema demand a section score for every judged section
//! and criterion (the schema's section ids are the judged ones only; missing entries are noted);
//! an issue or a section score naming a context section is dropped with a note. Without context
//! the whole-document prompt and schema are exactly as they were.
//!
//! Layout: `prompt` (the whole-document and focused prompts), `schema` (the reply schema and the
//! reply tokens), `parse` (a reply checked against the request), `panel` (the judges' calls); this
//! module only declares and re-exports them.

mod panel;
mod parse;
mod prompt;
mod schema;
#[cfg(test)]
mod tests;

pub use panel::PHASE;
pub use parse::{ParsedVerdict, parse_verdict, parse_verdict_with_context};
pub use prompt::{CONTEXT_EXCERPT_CHARS, FOCUSED_TEMPLATE, TEMPLATE, render_focused_prompt, render_prompt};
pub use schema::{
    MAX_ISSUES_PER_SECTION, SCHEMA_TEXT_CHARS, default_max_tokens, focused_max_tokens, focused_reply_schema,
    reply_schema,
};
