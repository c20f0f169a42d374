//! LeakSanitizer's suppressions format, for `leaks --suppressions FILE`.
//!
//! One suppression per line, `leak:PATTERN`; empty lines and lines
//! starting with `#` are ignored, spaces around a line too. A pattern
//! matches a string as sanitizer_common's template match does: it matches
//! anywhere in the string unless it starts with `^` (then at the start)
//! or ends with `$` (then at the end); `*` matches any run of characters.
//! (sanitizer_common takes every piece at its first occurrence, so that its
//! `foo$` misses `foofoo`; here a piece before `$` is matched at the end.)
//! A leak is suppressed when the pattern
//! matches the function, the source file or the module of any frame of its
//! stack.

use alloctrace_analysis::SourceFrame;

/// The `leak:` patterns of a suppressions file.
#[derive(Debug)]
pub struct Suppressions {
    patterns: Vec<String>,
}

impl Suppressions {
    /// Parses a file's text; an error names the line (1-based) and why.
    pub fn parse(text: &str) -> Result<Suppressions, String> {
        let mut patterns = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((kind, pattern)) = line.split_once(':') else {
                return Err(format!(
                    "line {}: expected `leak:PATTERN`, got {line:?}",
                    i + 1
                ));
            };
            if kind.trim() != "leak" {
                return Err(format!(
                    "line {}: unknown suppression type {:?} (only `leak` applies to leaks)",
                    i + 1,
                    kind.trim()
                ));
            }
            let pattern = pattern.trim();
            if pattern.is_empty() {
                return Err(format!("line {}: empty pattern after `leak:`", i + 1));
            }
            patterns.push(pattern.to_string());
        }
        Ok(Suppressions { patterns })
    }

    /// Whether a pattern matches any frame's function, file or module.
    pub fn suppresses(&self, frames: &[SourceFrame]) -> bool {
        self.patterns.iter().any(|p| {
            frames.iter().any(|f| {
                template_match(p, &f.function)
                    || f.file
                        .as_deref()
                        .is_some_and(|file| template_match(p, file))
                    || template_match(p, &f.module)
            })
        })
    }
}

/// sanitizer_common's template match (see the module's documentation). An
/// empty string matches nothing.
pub fn template_match(template: &str, s: &str) -> bool {
    if s.is_empty() {
        return false;
    }
    let (mut anchored, mut t) = match template.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, template),
    };
    let mut s = s;
    let mut after_star = false;
    while !t.is_empty() {
        if let Some(rest) = t.strip_prefix('*') {
            t = rest;
            anchored = false;
            after_star = true;
            continue;
        }
        if t.starts_with('$') {
            return s.is_empty() || after_star;
        }
        if s.is_empty() {
            return false;
        }
        // The literal piece up to the next `*` or `$`.
        let end = t.find(['*', '$']).unwrap_or(t.len());
        let piece = &t[..end];
        if t[end..].starts_with('$') {
            // The last piece: at the end of the string.
            return s.ends_with(piece) && (!anchored || s.len() == piece.len());
        }
        let Some(at) = s.find(piece) else {
            return false;
        };
        if anchored && at != 0 {
            return false;
        }
        s = &s[at + piece.len()..];
        t = &t[end..];
        anchored = false;
        after_star = false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_sanitizer_common_does() {
        assert!(template_match("make_name", "make_name"));
        assert!(template_match("name", "make_name"));
        assert!(!template_match("^name", "make_name"));
        assert!(template_match("^make", "make_name"));
        assert!(template_match("make$", "remake"));
        assert!(!template_match("make$", "make_name"));
        assert!(template_match("m*name", "make_name"));
        assert!(template_match("^m*e$", "make_name"));
        assert!(!template_match("^x*e", "make_name"));
        assert!(template_match("*", "anything"));
        assert!(!template_match("*", ""));
        assert!(template_match("libc.so", "/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(template_match("foo$", "foofoo"));
        assert!(!template_match("^foo$", "foofoo"));
        assert!(template_match("^foo$", "foo"));
    }

    #[test]
    fn files_parse_and_bad_lines_are_named() {
        let s = Suppressions::parse("# comment\n\n  leak:make_name  \nleak:^libc*\n").unwrap();
        assert_eq!(s.patterns, ["make_name", "^libc*"]);
        let err = Suppressions::parse("leak:a\nrace:b\n").unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(Suppressions::parse("make_name\n").is_err());
        assert!(Suppressions::parse("leak:\n").is_err());
    }

    #[test]
    fn any_frame_by_function_file_or_module() {
        let frame = |function: &str, file: Option<&str>, module: &str| SourceFrame {
            function: function.into(),
            file: file.map(Into::into),
            line: None,
            module: module.into(),
            address: String::new(),
        };
        let stack = [
            frame("make_name", Some("/src/leaky.c"), "/bin/leaky"),
            frame("main", Some("/src/leaky.c"), "/bin/leaky"),
        ];
        let s = |p: &str| Suppressions::parse(p).unwrap();
        assert!(s("leak:main$").suppresses(&stack));
        assert!(s("leak:leaky.c").suppresses(&stack));
        assert!(s("leak:/bin/leaky$").suppresses(&stack));
        assert!(!s("leak:build_table").suppresses(&stack));
        assert!(!s("leak:build_table\nleak:^ain").suppresses(&stack));
    }
}
