//! The report's charts as inline SVG (the admin page's forest plot and score line, drawn once
//! here): text in them is escaped like any other.

use std::fmt::Write as _;

/// One row of a forest plot: an interval and its point.
pub struct Row {
    pub label: String,
    pub lo: f64,
    pub hi: f64,
    pub point: f64,
    /// Extra classes of the row's group (`final`).
    pub class: &'static str,
    /// `data-*` attributes of the row's group (name without the prefix, value).
    pub data: Vec<(&'static str, String)>,
}

/// A forest plot: a zero line, then one row per interval with its point; the ends of the data are
/// ticked unless they sit on the zero tick.
pub fn forest(rows: &[Row], id: &str, left: f64, label: &str, caption: &str) -> String {
    const W: f64 = 560.0;
    const RIGHT: f64 = 20.0;
    const ROW_H: f64 = 28.0;
    const TOP: f64 = 14.0;
    let values: Vec<f64> =
        std::iter::once(0.0).chain(rows.iter().flat_map(|r| [r.lo, r.hi, r.point])).filter(|v| v.is_finite()).collect();
    let mut min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let mut max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max - min < 1e-9 {
        min -= 0.05;
        max += 0.05;
    }
    let pad = (max - min) * 0.1;
    let (lo_end, hi_end) = (min, max);
    min -= pad;
    max += pad;
    let x = |v: f64| left + (v - min) / (max - min) * (W - left - RIGHT);
    let rows_h = ROW_H * rows.len() as f64;
    let h = TOP + rows_h + 22.0;
    let axis = TOP + rows_h;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<figure class="forest"><svg class="forest" id="{id}" viewBox="0 0 {W} {h}" role="img" aria-label="{}">"#,
        esc(label)
    );
    let _ = write!(s, r#"<line class="axis" x1="{left}" x2="{}" y1="{axis}" y2="{axis}"/>"#, W - RIGHT);
    let _ = write!(s, r#"<line class="zero" x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{axis}"/>"#, x(0.0), TOP - 8.0);
    let tick = |s: &mut String, v: f64, text: &str| {
        let _ = write!(
            s,
            r#"<text class="tick" x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x(v),
            axis + 14.0,
            esc(text)
        );
    };
    tick(&mut s, 0.0, "0");
    for end in [lo_end, hi_end] {
        if (x(end) - x(0.0)).abs() > 48.0 {
            tick(&mut s, end, &super::diff(end));
        }
    }
    for (i, r) in rows.iter().enumerate() {
        if !r.lo.is_finite() || !r.hi.is_finite() {
            continue;
        }
        let y = TOP + i as f64 * ROW_H + ROW_H / 2.0;
        let data: String = r.data.iter().map(|(k, v)| format!(r#" data-{k}="{}""#, esc(v))).collect();
        let _ = write!(s, r#"<g class="row {}"{data}>"#, r.class);
        let _ = write!(s, r#"<text class="label" x="4" y="{}">{}</text>"#, y + 4.0, esc(&r.label));
        let _ = write!(s, r#"<line class="interval" x1="{:.1}" x2="{:.1}" y1="{y}" y2="{y}"/>"#, x(r.lo), x(r.hi));
        if r.point.is_finite() {
            let _ = write!(s, r#"<circle class="point" cx="{:.1}" cy="{y}" r="5"/>"#, x(r.point));
        }
        s.push_str("</g>");
    }
    let _ = write!(s, r#"</svg><figcaption class="muted">{}</figcaption></figure>"#, esc(caption));
    s
}

/// A refinement's scores as a line: the document as given first, a dashed line at 0.85.
pub fn score_line(scores: &[f64], id: &str) -> String {
    const W: f64 = 320.0;
    const H: f64 = 90.0;
    const P: f64 = 10.0;
    let vals: Vec<f64> = scores.iter().map(|v| if v.is_finite() { *v } else { 0.0 }).collect();
    if vals.is_empty() {
        return String::new();
    }
    let mut lo = vals.iter().copied().fold(f64::INFINITY, f64::min) - 0.05;
    let mut hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max) + 0.05;
    if hi - lo < 0.2 {
        let mid = (hi + lo) / 2.0;
        lo = mid - 0.1;
        hi = mid + 0.1;
    }
    let x = |i: usize| if vals.len() == 1 { W / 2.0 } else { P + i as f64 * (W - 2.0 * P) / (vals.len() - 1) as f64 };
    let y = |v: f64| H - P - (v - lo) / (hi - lo) * (H - 2.0 * P);
    let words: Vec<String> = vals.iter().map(|v| format!("{v:.3}")).collect();
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="scores" id="{id}" viewBox="0 0 {W} {H}" role="img" aria-label="Score history: {}">"#,
        words.join(", ")
    );
    if lo <= 0.85 && 0.85 <= hi {
        let _ = write!(s, r#"<line class="threshold" x1="0" x2="{W}" y1="{0:.1}" y2="{0:.1}"/>"#, y(0.85));
    }
    if vals.len() > 1 {
        let points: Vec<String> = vals.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v))).collect();
        let _ = write!(s, r#"<polyline class="line" points="{}"/>"#, points.join(" "));
    }
    for (i, v) in vals.iter().enumerate() {
        let when = if i == 0 { "as given".to_string() } else { format!("iteration {i}") };
        let _ = write!(
            s,
            r#"<circle class="point" cx="{:.1}" cy="{:.1}" r="4"><title>{when}: {v:.3}</title></circle>"#,
            x(i),
            y(*v)
        );
    }
    s.push_str("</svg>");
    s
}

/// Text escaped for HTML content and double- or single-quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
