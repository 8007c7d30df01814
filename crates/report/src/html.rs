//! HTML escaping and link sanitising: the one place every text and link from data goes
//! through before it reaches a page — the run report, its charts, the trend index, the
//! comparison, and `serve`'s listings.

/// HTML/XML escaping for text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Made visible, never acted on: control characters as their pictures (␛, ␇,
            // ␀ …); by name the marks that reorder text (U+202E would show tool arguments
            // reversed), the invisible ones (zero-width spaces and joiners, the word
            // joiner, a byte-order mark: an attacker's text could hide words between
            // them) and the line and paragraph separators (a break no other text has).
            '\n' | '\t' | '\r' => out.push(ch),
            c @ '\u{0}'..='\u{1f}' => out.push(char::from_u32(0x2400 + c as u32).unwrap_or('?')),
            '\u{7f}' => out.push('␡'),
            c @ ('\u{80}'..='\u{9f}'
            | '\u{00ad}'
            | '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}') => {
                let _ = std::fmt::Write::write_fmt(&mut out, format_args!("⟨U+{:04X}⟩", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// A link target from data, only if it is a plain relative path (no scheme, no
/// absolute path): a trace path or a run folder's name must not become `javascript:`
/// or a file elsewhere. The one sanitiser of the report and the index.
pub(crate) fn safe_href(path: &str) -> Option<String> {
    let scheme = path.split('/').next().is_some_and(|first| first.contains(':'));
    (!path.is_empty() && !scheme && !path.starts_with('/') && !path.starts_with('\\')).then(|| esc(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_are_made_visible() {
        assert_eq!(esc("a\u{1b}[31mb\u{7}\u{0}"), "a␛[31mb␇␀");
        assert_eq!(esc("pay \u{202e}321 SU\u{202c}\n"), "pay ⟨U+202E⟩321 SU⟨U+202C⟩\n");
        assert_eq!(esc("\u{2067}x\u{2069}"), "⟨U+2067⟩x⟨U+2069⟩");
    }

    #[test]
    fn invisible_characters_and_separators_are_named() {
        // What an attacker model may write into a template: each shown by its name.
        for c in ['\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}', '\u{feff}', '\u{2028}', '\u{2029}', '\u{00ad}'] {
            let shown = esc(&format!("ig{c}nore"));
            assert_eq!(shown, format!("ig⟨U+{:04X}⟩nore", c as u32));
            assert!(!shown.contains(c));
        }
        assert_eq!(esc("Grüße — ok ✓"), "Grüße — ok ✓", "visible text stays as it is");
    }

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn only_plain_relative_paths_become_links() {
        assert_eq!(safe_href("traces/a&b.json").as_deref(), Some("traces/a&amp;b.json"));
        assert_eq!(safe_href("javascript:alert(1)"), None);
        assert_eq!(safe_href("/etc/passwd"), None);
        assert_eq!(safe_href(""), None);
    }
}
