//! Checklists.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Default item weight.
pub const DEFAULT_WEIGHT: f64 = 100.0;

/// One yes/no question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChecklistItem {
    pub id: String,
    pub question: String,
    /// 0-100.
    pub weight: f64,
    pub category: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub merged_from: Vec<String>,
    pub source_indices: Vec<u32>,
}

impl ChecklistItem {
    pub fn new(id: impl Into<String>, question: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            question: question.into(),
            weight: DEFAULT_WEIGHT,
            category: None,
            metadata: BTreeMap::new(),
            merged_from: Vec::new(),
            source_indices: Vec::new(),
        }
    }
}

/// Instance or corpus level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum GenerationLevel {
    #[default]
    Instance,
    Corpus,
}

/// An ordered list of yes/no questions.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Checklist {
    pub id: String,
    pub items: Vec<ChecklistItem>,
    pub source_method: String,
    pub generation_level: GenerationLevel,
    pub input: String,
    pub corpus_description: String,
    /// Seconds since the Unix epoch.
    pub created_at: Option<i64>,
    pub metadata: BTreeMap<String, String>,
}

/// Label used for items without a category.
pub const UNGROUPED: &str = "ungrouped";

impl Checklist {
    /// Items grouped by category, groups in first-appearance order.
    pub fn by_category(&self) -> Vec<(String, Vec<&ChecklistItem>)> {
        let mut groups: Vec<(String, Vec<&ChecklistItem>)> = Vec::new();
        for item in &self.items {
            let cat = item.category.clone().filter(|c| !c.is_empty()).unwrap_or_else(|| UNGROUPED.to_string());
            match groups.iter_mut().find(|(c, _)| *c == cat) {
                Some((_, v)) => v.push(item),
                None => groups.push((cat, vec![item])),
            }
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_keeps_first_appearance_order() {
        let mut a = ChecklistItem::new("a", "q1");
        a.category = Some("style".into());
        let b = ChecklistItem::new("b", "q2");
        let mut c = ChecklistItem::new("c", "q3");
        c.category = Some("facts".into());
        let mut d = ChecklistItem::new("d", "q4");
        d.category = Some("style".into());
        let cl = Checklist { items: vec![a, b, c, d], ..Default::default() };
        let groups: Vec<(String, Vec<String>)> =
            cl.by_category().into_iter().map(|(c, v)| (c, v.iter().map(|i| i.id.clone()).collect())).collect();
        assert_eq!(
            groups,
            vec![
                ("style".to_string(), vec!["a".to_string(), "d".to_string()]),
                (UNGROUPED.to_string(), vec!["b".to_string()]),
                ("facts".to_string(), vec!["c".to_string()]),
            ]
        );
    }
}
