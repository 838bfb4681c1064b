//! Krippendorff's alpha, as the `krippendorff` Python package computes it. The computation lives in
//! [`assay_domain::stats::krippendorff`] (shared with `assay agreement`); the arbiter uses it from
//! there under its historical path.

pub use assay_domain::stats::krippendorff::{Agreement, Level, Ratings, Undefined, agreement, alpha};
