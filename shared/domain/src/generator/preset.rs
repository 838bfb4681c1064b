//! Instance-level presets and their defaults.

use crate::checklist::GenerationLevel;
use crate::score::{PrimaryMetric, ScorerConfig, ScoringMode, ScoringPrompt};

use super::corpus::CorpusPreset;

/// An instance-level generation preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    Tick,
    RocketEval,
    RlcfDirect,
    RlcfCandidate,
    RlcfCandidatesOnly,
    OpenRubricsPairwise,
    OpenRubricsListwise,
}

/// How a preset asks for its checklist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemShape {
    /// Plain questions (weight 100).
    Plain,
    /// Questions with an importance weight 0-100.
    Weighted,
    /// Questions with a category, `hard_rule` or `principle`.
    Categorized,
}

/// Where a preset's candidate responses come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateSource {
    /// The preset does not use candidates.
    None,
    /// Passed in, or produced by candidate models.
    PassedOrGenerated,
    /// Passed in only (a ranked list: generated candidates have no ranking).
    PassedRanked,
    /// `chosen` and `rejected`, passed in.
    Pair,
}

/// Request fields a preset can require.
pub mod fields {
    pub const INPUT: &str = "input";
    pub const REFERENCE: &str = "reference";
    pub const CANDIDATES: &str = "candidates";
    pub const CHOSEN: &str = "chosen";
    pub const REJECTED: &str = "rejected";
}

/// Any preset: instance level (`generate`) or corpus level (`generate_corpus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PresetId {
    Instance(Preset),
    Corpus(CorpusPreset),
}

impl PresetId {
    pub fn name(self) -> &'static str {
        match self {
            PresetId::Instance(p) => p.name(),
            PresetId::Corpus(p) => p.name(),
        }
    }
}

/// Defaults of one preset, as `ListPresets` reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct PresetInfo {
    pub preset: PresetId,
    pub name: String,
    pub level: GenerationLevel,
    /// Request fields the preset requires (`candidates` may instead be produced by
    /// `candidate_models` for rlcf_candidate and rlcf_candidates_only).
    pub required_fields: Vec<String>,
    pub default_max_items: u32,
    pub default_temperature: f64,
    pub default_scorer: ScorerConfig,
}

impl Preset {
    /// Every instance-level preset, in contract order.
    pub const ALL: [Preset; 7] = [
        Preset::Tick,
        Preset::RocketEval,
        Preset::RlcfDirect,
        Preset::RlcfCandidate,
        Preset::RlcfCandidatesOnly,
        Preset::OpenRubricsPairwise,
        Preset::OpenRubricsListwise,
    ];

    /// The preset's name (also the checklist's `source_method`).
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tick => "tick",
            Preset::RocketEval => "rocketeval",
            Preset::RlcfDirect => "rlcf_direct",
            Preset::RlcfCandidate => "rlcf_candidate",
            Preset::RlcfCandidatesOnly => "rlcf_candidates_only",
            Preset::OpenRubricsPairwise => "openrubrics_pairwise",
            Preset::OpenRubricsListwise => "openrubrics_listwise",
        }
    }

    /// The preset with this name (case-insensitive), if any.
    pub fn from_name(name: &str) -> Option<Preset> {
        let name = name.trim();
        Preset::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// Items kept when the request sets no maximum.
    pub fn default_max_items(self) -> u32 {
        match self {
            Preset::Tick => 8,
            Preset::RocketEval => 10,
            Preset::RlcfDirect | Preset::RlcfCandidate | Preset::RlcfCandidatesOnly => 7,
            Preset::OpenRubricsPairwise => 15,
            Preset::OpenRubricsListwise => 20,
        }
    }

    /// Generation temperature when the request's model spec sets none.
    pub fn default_temperature(self) -> f64 {
        match self {
            Preset::Tick | Preset::RocketEval => 0.7,
            Preset::RlcfDirect
            | Preset::RlcfCandidate
            | Preset::RlcfCandidatesOnly
            | Preset::OpenRubricsPairwise
            | Preset::OpenRubricsListwise => 0.0,
        }
    }

    /// How checklists of this preset should be scored.
    pub fn default_scorer(self) -> ScorerConfig {
        match self {
            Preset::Tick | Preset::OpenRubricsPairwise | Preset::OpenRubricsListwise => ScorerConfig {
                mode: ScoringMode::Batch,
                primary_metric: PrimaryMetric::Pass,
                ..ScorerConfig::default()
            },
            Preset::RocketEval => ScorerConfig {
                mode: ScoringMode::Item,
                primary_metric: PrimaryMetric::Normalized,
                use_logprobs: true,
                prompt: ScoringPrompt::RocketEval,
                ..ScorerConfig::default()
            },
            Preset::RlcfDirect | Preset::RlcfCandidate | Preset::RlcfCandidatesOnly => ScorerConfig {
                mode: ScoringMode::Item,
                primary_metric: PrimaryMetric::Weighted,
                prompt: ScoringPrompt::Rlcf,
                ..ScorerConfig::default()
            },
        }
    }

    pub fn item_shape(self) -> ItemShape {
        match self {
            Preset::Tick | Preset::RocketEval => ItemShape::Plain,
            Preset::RlcfDirect | Preset::RlcfCandidate | Preset::RlcfCandidatesOnly => ItemShape::Weighted,
            Preset::OpenRubricsPairwise | Preset::OpenRubricsListwise => ItemShape::Categorized,
        }
    }

    pub fn candidate_source(self) -> CandidateSource {
        match self {
            Preset::Tick | Preset::RocketEval | Preset::RlcfDirect => CandidateSource::None,
            Preset::RlcfCandidate | Preset::RlcfCandidatesOnly => CandidateSource::PassedOrGenerated,
            Preset::OpenRubricsListwise => CandidateSource::PassedRanked,
            Preset::OpenRubricsPairwise => CandidateSource::Pair,
        }
    }

    /// Whether the preset needs a reference answer.
    pub fn needs_reference(self) -> bool {
        match self {
            Preset::RocketEval | Preset::RlcfDirect | Preset::RlcfCandidate => true,
            Preset::Tick | Preset::RlcfCandidatesOnly | Preset::OpenRubricsPairwise | Preset::OpenRubricsListwise => {
                false
            }
        }
    }

    /// Request fields the preset requires.
    pub fn required_fields(self) -> Vec<&'static str> {
        let mut f = vec![fields::INPUT];
        if self.needs_reference() {
            f.push(fields::REFERENCE);
        }
        match self.candidate_source() {
            CandidateSource::None => {}
            CandidateSource::PassedOrGenerated | CandidateSource::PassedRanked => f.push(fields::CANDIDATES),
            CandidateSource::Pair => {
                f.push(fields::CHOSEN);
                f.push(fields::REJECTED);
            }
        }
        f
    }

    /// The preset's defaults as reported by `ListPresets`.
    pub fn info(self) -> PresetInfo {
        PresetInfo {
            preset: PresetId::Instance(self),
            name: self.name().to_string(),
            level: GenerationLevel::Instance,
            required_fields: self.required_fields().into_iter().map(String::from).collect(),
            default_max_items: self.default_max_items(),
            default_temperature: self.default_temperature(),
            default_scorer: self.default_scorer(),
        }
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl CorpusPreset {
    /// This preset's defaults (`default_max_items` 0 = no limit).
    pub fn info(self) -> PresetInfo {
        PresetInfo {
            preset: PresetId::Corpus(self),
            name: self.name().to_string(),
            level: GenerationLevel::Corpus,
            required_fields: self.required_fields().into_iter().map(String::from).collect(),
            default_max_items: self.default_max_items(),
            default_temperature: self.default_temperature(),
            default_scorer: self.default_scorer(),
        }
    }
}

/// The table of every preset: instance level in contract order, then corpus level.
pub fn preset_table() -> Vec<PresetInfo> {
    Preset::ALL.into_iter().map(Preset::info).chain(CorpusPreset::ALL.into_iter().map(CorpusPreset::info)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Preset::ALL {
            assert_eq!(Preset::from_name(p.name()), Some(p));
        }
        assert_eq!(Preset::from_name(" TICK "), Some(Preset::Tick));
        assert_eq!(Preset::from_name("feedback"), None);
    }

    #[test]
    fn table_matches_the_reference() {
        let t: Vec<(&str, u32, f64)> =
            Preset::ALL.iter().map(|p| (p.name(), p.default_max_items(), p.default_temperature())).collect();
        assert_eq!(
            t,
            vec![
                ("tick", 8, 0.7),
                ("rocketeval", 10, 0.7),
                ("rlcf_direct", 7, 0.0),
                ("rlcf_candidate", 7, 0.0),
                ("rlcf_candidates_only", 7, 0.0),
                ("openrubrics_pairwise", 15, 0.0),
                ("openrubrics_listwise", 20, 0.0),
            ]
        );
        assert_eq!(Preset::RlcfCandidate.required_fields(), vec!["input", "reference", "candidates"]);
        assert_eq!(Preset::OpenRubricsPairwise.required_fields(), vec!["input", "chosen", "rejected"]);
        assert!(Preset::RocketEval.default_scorer().wants_logprobs());
    }
}
