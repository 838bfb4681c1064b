//! Where a run's results are kept among its checkpoints: one key per position (see
//! `crate::Results`).

use assay_domain::StageError;

/// Checkpoint key prefix of the results, each under its position in eight digits (a run holds at
/// most `MAX_RUN_RECORDS`, 10 million, results, so keys sort as positions do). The layout is the
/// one runs stored before this API used, so they resume and page as before.
pub(crate) const PREFIX: &str = "record:";

/// The key of the result at `index`.
pub(crate) fn key(index: u64) -> String {
    format!("{PREFIX}{index:08}")
}

/// The key a page from position `first` on starts after.
pub(crate) fn after(first: u64) -> String {
    first.checked_sub(1).map(key).unwrap_or_default()
}

/// The position a stored result's key names.
pub(crate) fn index_of(key: &str) -> Result<u64, StageError> {
    key.strip_prefix(PREFIX)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| StageError::Internal(format!("run store: {key:?} is not a result's key")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_by_position_and_name_it_back() {
        let keys: Vec<String> = [0u64, 9, 10, 99_999_999].into_iter().map(key).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "positions sort as their keys do");
        for (k, i) in keys.iter().zip([0u64, 9, 10, 99_999_999]) {
            assert_eq!(index_of(k).unwrap(), i);
        }
        assert_eq!(after(0), "", "the first page starts before every key");
        assert_eq!(after(5), key(4));
        assert!(index_of("checklist:x").is_err(), "another checkpoint is no result");
    }
}
