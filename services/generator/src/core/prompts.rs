//! The generator's prompt templates (Assay's own, under `prompts/`), per preset.

use assay_domain::generator::Preset;

/// An instance preset's prompt template.
pub fn template(preset: Preset) -> &'static str {
    match preset {
        Preset::Tick => include_str!("../../prompts/tick.txt"),
        Preset::RocketEval => include_str!("../../prompts/rocketeval.txt"),
        Preset::RlcfDirect => include_str!("../../prompts/rlcf_direct.txt"),
        Preset::RlcfCandidate => include_str!("../../prompts/rlcf_candidate.txt"),
        Preset::RlcfCandidatesOnly => include_str!("../../prompts/rlcf_candidates_only.txt"),
        Preset::OpenRubricsPairwise => include_str!("../../prompts/openrubrics_pairwise.txt"),
        Preset::OpenRubricsListwise => include_str!("../../prompts/openrubrics_listwise.txt"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_use_only_known_placeholders() {
        for p in Preset::ALL {
            let unknown = assay_domain::template::unknown_placeholders(template(p), super::super::PLACEHOLDERS);
            assert!(unknown.is_empty(), "{p}: {unknown:?}");
            assert!(template(p).contains("{input}"), "{p}");
            let t = template(p);
            assert!(t.contains("{max_items}") || t.contains("{item_count}"), "{p}");
        }
    }

    #[test]
    fn the_item_count_never_asks_for_more_than_the_maximum() {
        use super::super::item_count;
        assert_eq!(item_count(2, 1), "exactly one question");
        assert_eq!(item_count(2, 2), "exactly 2 questions");
        assert_eq!(item_count(2, 8), "between 2 and 8 questions");
        assert_eq!(item_count(1, 1), "exactly one question");
        assert_eq!(item_count(1, 10), "between 1 and 10 questions");
    }
}
