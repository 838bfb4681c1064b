//! Answers: normalisation, consensus, majority vote.

use std::collections::BTreeMap;

use super::types::RefinedSolution;

/// An answer in comparable form: lower case, numbers in canonical form (`1,000.50` -> `1000.5`,
/// `42.0` -> `42`, `+3` -> `3`), fractions of whole numbers reduced and written as decimals when
/// they terminate (`1/2` -> `0.5`, `6/4` -> `1.5`, `2/6` -> `1/3`), every other character that is
/// not a letter or a digit removed (punctuation, whitespace, symbols).
pub fn normalize_answer(answer: &str) -> String {
    let lower = answer.trim().to_lowercase();
    let chars: Vec<char> = lower.chars().collect();
    let mut out = String::with_capacity(lower.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts_number = c.is_ascii_digit()
            || (matches!(c, '-' | '+' | '.')
                && chars.get(i + 1).is_some_and(char::is_ascii_digit)
                && !chars.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric()));
        if starts_number {
            let (number, mut next) = read_number(&chars, i);
            if chars.get(next) == Some(&'/') && chars.get(next + 1).is_some_and(char::is_ascii_digit) {
                let (denominator, after) = read_number(&chars, next + 1);
                out.push_str(&fraction(&number, &denominator));
                next = after;
            } else {
                out.push_str(&number);
            }
            i = next;
            continue;
        }
        if c.is_alphanumeric() {
            out.push(c);
        }
        i += 1;
    }
    out
}

/// The number starting at `start` in canonical form, and the index after it.
fn read_number(chars: &[char], start: usize) -> (String, usize) {
    let mut i = start;
    let mut raw = String::new();
    if matches!(chars[i], '-' | '+') {
        raw.push(chars[i]);
        i += 1;
    }
    let mut seen_dot = false;
    while i < chars.len() {
        let c = chars[i];
        let next_digit = chars.get(i + 1).is_some_and(char::is_ascii_digit);
        if c.is_ascii_digit() {
            raw.push(c);
        } else if c == ',' && next_digit && !seen_dot && raw.chars().any(|d| d.is_ascii_digit()) {
            // Thousands separator.
        } else if c == '.' && next_digit && !seen_dot {
            seen_dot = true;
            raw.push(c);
        } else {
            break;
        }
        i += 1;
    }
    (canonical_number(&raw), i)
}

/// `[-+]digits[.digits]` without a plus sign, leading zeros, trailing fraction zeros or an empty
/// fraction, and without the sign of zero (exact: no floating point).
fn canonical_number(raw: &str) -> String {
    let (negative, digits) = match raw.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, raw.trim_start_matches('+')),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let frac = frac.trim_end_matches('0');
    let body = if frac.is_empty() { int.to_string() } else { format!("{int}.{frac}") };
    if negative && body != "0" { format!("-{body}") } else { body }
}

/// `numerator/denominator` (canonical numbers) reduced: a terminating decimal in canonical form,
/// else `p/q` in lowest terms; kept as written when not both whole numbers that fit in 128 bits.
fn fraction(numerator: &str, denominator: &str) -> String {
    let as_written = || format!("{numerator}/{denominator}");
    let (Ok(n), Ok(d)) = (numerator.parse::<i128>(), denominator.parse::<i128>()) else {
        return as_written();
    };
    if d <= 0 {
        return as_written();
    }
    let g = gcd(n.unsigned_abs(), d.unsigned_abs());
    let (n, d) = (n / g as i128, d / g as i128);
    if d == 1 {
        return n.to_string();
    }
    // A terminating decimal: d = 2^a 5^b, n / d = n * 2^(k-a) 5^(k-b) / 10^k with k = max(a, b).
    let (mut rest, mut twos, mut fives) = (d, 0u32, 0u32);
    while rest % 2 == 0 {
        rest /= 2;
        twos += 1;
    }
    while rest % 5 == 0 {
        rest /= 5;
        fives += 1;
    }
    if rest != 1 {
        return format!("{n}/{d}");
    }
    let k = twos.max(fives);
    let scaled = 2i128
        .checked_pow(k - twos)
        .and_then(|f| f.checked_mul(5i128.checked_pow(k - fives)?))
        .and_then(|f| f.checked_mul(n));
    let Some(scaled) = scaled else { return format!("{n}/{d}") };
    let digits = scaled.unsigned_abs().to_string();
    let k = k as usize;
    let padded = format!("{digits:0>width$}", width = k + 1);
    let (int, frac) = padded.split_at(padded.len() - k);
    let sign = if scaled < 0 { "-" } else { "" };
    canonical_number(&format!("{sign}{int}.{frac}"))
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// Whether every answer is non-empty and all are equal after [`normalize_answer`].
pub fn answers_agree<'a>(answers: impl IntoIterator<Item = &'a str>) -> bool {
    let normalized: Vec<String> = answers.into_iter().map(normalize_answer).collect();
    !normalized.is_empty() && !normalized[0].is_empty() && normalized.iter().all(|a| *a == normalized[0])
}

/// A majority vote over refined answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Vote {
    /// The most confident solver holding the winning answer (earlier solver on a tie).
    pub winner_solver_id: String,
    /// The winner's own answer (not the normalised form).
    pub answer: String,
    /// Solvers holding the winning answer.
    pub votes: usize,
    pub total: usize,
}

/// Majority vote over the refined answers after normalisation: the answer most solvers hold; on a
/// tie (e.g. three different answers) the group whose most confident member is the most confident,
/// then the earliest solver. `None` without refined solutions.
pub fn majority_vote(refined: &[RefinedSolution]) -> Option<Vote> {
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in refined.iter().enumerate() {
        groups.entry(normalize_answer(&r.final_answer)).or_default().push(i);
    }
    // Members of a group, best first: higher confidence, then earlier position.
    let best = |members: &[usize]| -> usize {
        let mut m = members.to_vec();
        m.sort_by(|a, b| refined[*b].confidence.total_cmp(&refined[*a].confidence).then(a.cmp(b)));
        m[0]
    };
    let (_, members) = groups.iter().max_by(|(_, a), (_, b)| {
        let (ba, bb) = (best(a), best(b));
        a.len().cmp(&b.len()).then(refined[ba].confidence.total_cmp(&refined[bb].confidence)).then(bb.cmp(&ba))
    })?;
    let winner = &refined[best(members)];
    Some(Vote {
        winner_solver_id: winner.solver_id.clone(),
        answer: winner.final_answer.clone(),
        votes: members.len(),
        total: refined.len(),
    })
}
