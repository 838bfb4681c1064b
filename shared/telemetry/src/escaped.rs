//! Log lines that cannot be forged: text from callers and models (records, replies, error
//! messages) reaches log fields, and a newline, a carriage return or a terminal escape inside it
//! would start a line of its own or drive the reader's terminal. Every such character of a
//! formatted line is written escaped (`\n`, `\u{1b}`), all but the line's own final newline.

use std::io::Write;

use tracing_subscriber::fmt::MakeWriter;

/// Standard error, each event's line escaped ([`escape_line`]). `keep_escapes`: the formatter
/// colours its lines (a terminal), so ESC is its own and kept.
#[derive(Debug, Clone, Copy)]
pub struct EscapedStderr {
    pub keep_escapes: bool,
}

impl<'a> MakeWriter<'a> for EscapedStderr {
    type Writer = EscapedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        EscapedWriter { keep_escapes: self.keep_escapes }
    }
}

/// One event's writer.
pub struct EscapedWriter {
    keep_escapes: bool,
}

impl Write for EscapedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = escape_line(&String::from_utf8_lossy(buf), self.keep_escapes);
        std::io::stderr().lock().write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `text` with its control characters (but tabs, the final newline and, with `keep_escapes`,
/// ESC) and the Unicode line separators and direction overrides written as escapes.
pub fn escape_line(text: &str, keep_escapes: bool) -> String {
    let (body, end) = match text.strip_suffix('\n') {
        Some(body) => (body, "\n"),
        None => (text, ""),
    };
    let mut out = String::with_capacity(text.len() + 8);
    for c in body.chars() {
        let forging = (c.is_control() && c != '\t' && !(keep_escapes && c == '\u{1b}'))
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if forging {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push_str(end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forged_line_or_escape_stays_inside_its_line() {
        let forged = "run failed error=bad\n2026-01-01T00:00:00Z  INFO forged=yes\r\u{1b}[2J\u{0}\u{85}\n";
        assert_eq!(
            escape_line(forged, false),
            "run failed error=bad\\n2026-01-01T00:00:00Z  INFO forged=yes\\r\\u{1b}[2J\\u{0}\\u{85}\n"
        );
        assert_eq!(escape_line("a\u{2028}b\u{202e}c\td", false), "a\\u{2028}b\\u{202e}c\td");
        // A coloured line keeps its own escapes.
        assert_eq!(escape_line("\u{1b}[32mINFO\u{1b}[0m x\n", true), "\u{1b}[32mINFO\u{1b}[0m x\n");
        assert_eq!(escape_line("plain text, no change", false), "plain text, no change");
    }
}
