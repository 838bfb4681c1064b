//! The verbs. Each verb's module holds its options (a clap `Args`), its `run` and how it ends
//! (`Result<Ending, CliError>`, [`error`]); what several verbs share lives in [`common`],
//! [`session`], [`follow`], [`input`], [`source`] and [`render`]. This file only names the modules,
//! so no verb depends on it.

pub mod agreement;
pub mod common;
pub mod compare;
pub mod debate;
pub mod demo;
pub mod error;
pub mod eval;
pub mod follow;
pub mod generate;
pub mod input;
pub mod models;
pub mod power;
pub mod refine;
pub mod refine_text;
pub mod render;
pub mod report;
pub mod runs;
pub mod serve;
pub mod session;
pub mod source;
pub mod timings;
pub mod up;
