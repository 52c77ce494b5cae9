//! Shell-style glob matching, one implementation for all of forkd: the evaluator's
//! operands (`src/*.go`) and file filters (`grep --include='*.py'`, `rg -g
//! '**/tests/*'`), and image builds' COPY sources and `.dockerignore` patterns: `*`,
//! `?`, `[...]` (with `!`/`^` negation and ranges), `\` escapes, `**`, and `**/`
//! matching zero or more whole directories. `*` and `?` do not match `/`.

#![forbid(unsafe_code)]

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Lit(char),
    Any,
    Star,
    /// `**` not followed by `/`: anything, across directories.
    DoubleStar,
    /// `**/`: zero or more whole directories.
    DoubleStarSlash,
    Class {
        ranges: Vec<(char, char)>,
        negated: bool,
    },
}

fn tokenize(pat: &str) -> Vec<Tok> {
    let chars: Vec<char> = pat.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' if chars.get(i + 1) == Some(&'*') => {
                let at_segment_start = i == 0 || chars[i - 1] == '/';
                if at_segment_start && chars.get(i + 2) == Some(&'/') {
                    out.push(Tok::DoubleStarSlash);
                    i += 3;
                } else {
                    out.push(Tok::DoubleStar);
                    i += 2;
                }
            }
            '*' => {
                out.push(Tok::Star);
                i += 1;
            }
            '?' => {
                out.push(Tok::Any);
                i += 1;
            }
            '[' => match parse_class(&chars[i + 1..]) {
                Some((tok, used)) => {
                    out.push(tok);
                    i += 1 + used;
                }
                None => {
                    out.push(Tok::Lit('['));
                    i += 1;
                }
            },
            '\\' if i + 1 < chars.len() => {
                out.push(Tok::Lit(chars[i + 1]));
                i += 2;
            }
            c => {
                out.push(Tok::Lit(c));
                i += 1;
            }
        }
    }
    out
}

/// Parse the inside of `[...]`; returns the token and the characters used
/// including the closing bracket.
fn parse_class(rest: &[char]) -> Option<(Tok, usize)> {
    let mut i = 0;
    let negated = matches!(rest.first(), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    while i < rest.len() {
        let c = rest[i];
        if c == ']' && !first {
            return Some((Tok::Class { ranges, negated }, i + 1));
        }
        first = false;
        if i + 2 < rest.len() && rest[i + 1] == '-' && rest[i + 2] != ']' {
            ranges.push((c, rest[i + 2]));
            i += 3;
        } else {
            ranges.push((c, c));
            i += 1;
        }
    }
    None
}

/// Whether `text` matches the glob `pat` as a whole.
pub fn glob_match(pat: &str, text: &str) -> bool {
    let toks = tokenize(pat);
    let t: Vec<char> = text.chars().collect();
    let (m, n) = (toks.len(), t.len());
    // dp[j] for token index i+1, computed from the last token backwards.
    let mut next = vec![false; n + 1];
    next[n] = true;
    for i in (0..m).rev() {
        let mut cur = vec![false; n + 1];
        match &toks[i] {
            Tok::Star => {
                cur[n] = next[n];
                for j in (0..n).rev() {
                    cur[j] = next[j] || (t[j] != '/' && cur[j + 1]);
                }
            }
            Tok::DoubleStar => {
                cur[n] = next[n];
                for j in (0..n).rev() {
                    cur[j] = next[j] || cur[j + 1];
                }
            }
            Tok::DoubleStarSlash => {
                // Either nothing, or anything up to and including a '/'.
                let mut tail = false;
                cur[n] = next[n];
                for j in (0..n).rev() {
                    tail = (t[j] == '/' && next[j + 1]) || tail;
                    cur[j] = next[j] || tail;
                }
            }
            tok => {
                for j in 0..n {
                    let c = t[j];
                    let ok = match tok {
                        Tok::Lit(l) => *l == c,
                        Tok::Any => c != '/',
                        Tok::Class { ranges, negated } => {
                            c != '/'
                                && (ranges.iter().any(|(a, b)| (*a..=*b).contains(&c)) != *negated)
                        }
                        _ => unreachable!(),
                    };
                    cur[j] = ok && next[j + 1];
                }
            }
        }
        next = cur;
    }
    next[0]
}

#[cfg(test)]
mod tests {
    use super::glob_match as m;

    #[test]
    fn globs() {
        assert!(m("*.py", "a.py"));
        assert!(!m("*.py", "dir/a.py"));
        assert!(m("src/*.go", "src/a.go"));
        assert!(!m("src/*.go", "src/x/a.go"));
        assert!(m("**/*.go", "a.go"));
        assert!(m("**/*.go", "x/y/a.go"));
        assert!(m("src/**", "src/x/y"));
        assert!(m("src/**/t.rs", "src/t.rs"));
        assert!(m("src/**/t.rs", "src/a/b/t.rs"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "a/c"));
        assert!(m("[a-c]x", "bx"));
        assert!(!m("[!a-c]x", "bx"));
        assert!(m("[!a-c]x", "dx"));
        assert!(m("[]]", "]"));
        assert!(m("\\*", "*"));
        assert!(!m("\\*", "a"));
        assert!(m("", ""));
        assert!(!m("", "a"));
        assert!(m("*", ""));
    }
}
