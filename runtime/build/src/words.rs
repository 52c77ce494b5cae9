//! Dockerfile words: continuation joining, `$VAR` expansion, quoting, and the
//! `KEY=VALUE` lists of ENV, LABEL and ARG.
//!
//! Expansion follows the Dockerfile reference: `$NAME`, `${NAME}`, `${NAME:-word}`
//! (word when unset or empty), `${NAME:+word}` (word when set and not empty), and
//! `${NAME-word}`/`${NAME+word}` (the same tests on set-ness alone). Inside single
//! quotes nothing is expanded; the escape character (`\` unless the `escape` directive
//! says otherwise) makes the next character literal. Quotes are removed.

use std::collections::BTreeMap;

/// Values in force at a step: ARGs and ENVs, later ones winning.
pub type Vars = BTreeMap<String, String>;

/// Joins an instruction's continuation lines: an escape at the end of a line (trailing
/// blanks allowed) joins it to the next, and comment or blank lines inside a
/// continuation are dropped, as Docker does.
pub fn join_continuations(raw: &str, escape: char) -> String {
    let mut out = String::new();
    let mut continuing = false;
    let lines: Vec<&str> = raw.split('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if continuing {
            let t = line.trim_start();
            if t.starts_with('#') || t.is_empty() {
                continue;
            }
        }
        let trimmed = line.trim_end_matches([' ', '\t']);
        if let Some(head) = trimmed.strip_suffix(escape) {
            out.push_str(head);
            continuing = true;
        } else {
            out.push_str(line);
            continuing = false;
            if i + 1 < lines.len() && !lines[i + 1..].iter().all(|l| l.trim().is_empty()) {
                out.push('\n');
            }
        }
    }
    out
}

/// Double-quotes `s` for use as a Dockerfile word.
pub fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c == '"' || c == '\\' || c == '$' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

struct Lexer<'a> {
    chars: Vec<char>,
    pos: usize,
    vars: &'a Vars,
    escape: char,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn name(&mut self) -> String {
        let mut n = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                n.push(c);
                self.pos += 1;
            } else {
                break;
            }
        }
        n
    }

    /// After a `$`: the expansion, appended to `out`.
    fn dollar(&mut self, out: &mut String) -> Result<(), String> {
        match self.peek() {
            Some('{') => {
                self.pos += 1;
                let name = self.name();
                if name.is_empty() {
                    return Err("${} with no variable name".into());
                }
                let value = self.vars.get(&name);
                match self.peek() {
                    Some('}') => {
                        self.pos += 1;
                        out.push_str(value.map(String::as_str).unwrap_or(""));
                    }
                    Some(c @ (':' | '-' | '+')) => {
                        let colon = c == ':';
                        if colon {
                            self.pos += 1;
                        }
                        let op = self.peek();
                        if !matches!(op, Some('-' | '+')) {
                            return Err(format!("${{{name}:...}}: only :- and :+ are supported"));
                        }
                        self.pos += 1;
                        // The word runs to the matching brace; it is itself expanded.
                        let mut word = String::new();
                        let mut depth = 0;
                        loop {
                            match self.peek() {
                                None => return Err(format!("${{{name}...: missing }}")),
                                Some('}') if depth == 0 => {
                                    self.pos += 1;
                                    break;
                                }
                                Some(c) => {
                                    if c == '{' {
                                        depth += 1;
                                    } else if c == '}' {
                                        depth -= 1;
                                    }
                                    word.push(c);
                                    self.pos += 1;
                                }
                            }
                        }
                        let set = match value {
                            Some(v) => !colon || !v.is_empty(),
                            None => false,
                        };
                        let word = expand(&word, self.vars, self.escape)?;
                        match op {
                            Some('-') if set => out.push_str(value.unwrap()),
                            Some('-') => out.push_str(&word),
                            _ if set => out.push_str(&word),
                            _ => {}
                        }
                    }
                    _ => return Err(format!("${{{name}: missing }}")),
                }
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let name = self.name();
                out.push_str(self.vars.get(&name).map(String::as_str).unwrap_or(""));
            }
            _ => out.push('$'),
        }
        Ok(())
    }

    /// Reads words: whitespace outside quotes separates them when `split`.
    fn words(&mut self, split: bool) -> Result<Vec<String>, String> {
        let mut words = Vec::new();
        let mut cur = String::new();
        let mut have = false;
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                c if c == self.escape => match self.peek() {
                    Some(n) => {
                        self.pos += 1;
                        cur.push(n);
                        have = true;
                    }
                    None => cur.push(c),
                },
                '\'' => {
                    have = true;
                    loop {
                        match self.peek() {
                            None => return Err("unterminated single quote".into()),
                            Some('\'') => {
                                self.pos += 1;
                                break;
                            }
                            Some(c) => {
                                cur.push(c);
                                self.pos += 1;
                            }
                        }
                    }
                }
                '"' => {
                    have = true;
                    loop {
                        match self.peek() {
                            None => return Err("unterminated double quote".into()),
                            Some('"') => {
                                self.pos += 1;
                                break;
                            }
                            Some(c) if c == self.escape => {
                                self.pos += 1;
                                match self.peek() {
                                    Some(n @ ('"' | '$')) => {
                                        cur.push(n);
                                        self.pos += 1;
                                    }
                                    Some(n) if n == self.escape => {
                                        cur.push(n);
                                        self.pos += 1;
                                    }
                                    _ => cur.push(c),
                                }
                            }
                            Some('$') => {
                                self.pos += 1;
                                self.dollar(&mut cur)?;
                            }
                            Some(c) => {
                                cur.push(c);
                                self.pos += 1;
                            }
                        }
                    }
                }
                '$' => {
                    have = true;
                    self.dollar(&mut cur)?;
                }
                c if split && c.is_whitespace() => {
                    if have || !cur.is_empty() {
                        words.push(std::mem::take(&mut cur));
                        have = false;
                    }
                }
                c => {
                    cur.push(c);
                    have = true;
                }
            }
        }
        if have || !cur.is_empty() {
            words.push(cur);
        }
        Ok(words)
    }
}

fn lexer<'a>(raw: &str, vars: &'a Vars, escape: char) -> Lexer<'a> {
    Lexer {
        chars: raw.chars().collect(),
        pos: 0,
        vars,
        escape,
    }
}

/// Expands and unquotes `raw` as one word (blanks kept), e.g. a WORKDIR or a path.
pub fn expand(raw: &str, vars: &Vars, escape: char) -> Result<String, String> {
    Ok(lexer(raw.trim(), vars, escape)
        .words(false)?
        .into_iter()
        .next()
        .unwrap_or_default())
}

/// Expands and unquotes `raw` into blank-separated words.
pub fn split(raw: &str, vars: &Vars, escape: char) -> Result<Vec<String>, String> {
    lexer(raw, vars, escape).words(true)
}

/// `KEY=VALUE ...` pairs (ENV, LABEL), or the legacy `KEY VALUE...` form of ENV when
/// `legacy` and the first word has no `=`.
pub fn pairs(
    raw: &str,
    vars: &Vars,
    escape: char,
    legacy: bool,
) -> Result<Vec<(String, String)>, String> {
    let raw = raw.trim();
    let first = raw.split_whitespace().next().unwrap_or("");
    if legacy && !first.contains('=') {
        let rest = raw[first.len()..].trim();
        if rest.is_empty() {
            return Err(format!("{first} has no value"));
        }
        return Ok(vec![(first.to_string(), expand(rest, vars, escape)?)]);
    }
    let mut out = Vec::new();
    for w in split(raw, vars, escape)? {
        let Some((k, v)) = w.split_once('=') else {
            return Err(format!("{w:?} is not KEY=VALUE"));
        };
        if k.is_empty() {
            return Err(format!("{w:?} has an empty key"));
        }
        out.push((k.to_string(), v.to_string()));
    }
    if out.is_empty() {
        return Err("no KEY=VALUE given".into());
    }
    Ok(out)
}

/// An ARG: its name and default (expanded), from `NAME` or `NAME=default`.
pub fn arg(raw: &str, vars: &Vars, escape: char) -> Result<(String, Option<String>), String> {
    let raw = raw.trim();
    let (name, default) = match raw.split_once('=') {
        Some((n, d)) => (n, Some(expand(d, vars, escape)?)),
        None => (raw, None),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("ARG name {name:?} is not a valid name"));
    }
    Ok((name.to_string(), default))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        [("A", "1"), ("E", ""), ("P", "/usr/bin")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn continuations_join_and_drop_comments() {
        assert_eq!(
            join_continuations("echo a \\\n  # c\n\n  && echo b", '\\'),
            "echo a   && echo b"
        );
        assert_eq!(join_continuations("a `  \nb", '`'), "a b");
        assert_eq!(join_continuations("plain", '\\'), "plain");
    }

    #[test]
    fn expansion_forms() {
        let v = vars();
        let e = |s| expand(s, &v, '\\').unwrap();
        assert_eq!(e("$A/${A}x"), "1/1x");
        assert_eq!(e("${E:-d} ${E-d} ${NOPE:-d} ${A:-d}"), "d  d 1");
        assert_eq!(e("${A:+yes} ${E:+yes}|${E+set}"), "yes |set");
        assert_eq!(e("'$A' \"$A\" \\$A"), "$A 1 $A");
        assert_eq!(e("${NOPE:-$P/x}"), "/usr/bin/x");
        assert_eq!(e("cost $5"), "cost $5");
        assert!(expand("${A", &v, '\\').is_err());
        assert!(expand("${A:?x}", &v, '\\').is_err());
        assert!(expand("'open", &v, '\\').is_err());
    }

    #[test]
    fn pairs_and_legacy_env() {
        let v = vars();
        assert_eq!(
            pairs("X=\"a b\" Y=$A Z=", &v, '\\', true).unwrap(),
            vec![
                ("X".into(), "a b".into()),
                ("Y".into(), "1".into()),
                ("Z".into(), "".into())
            ]
        );
        assert_eq!(
            pairs("PATH $P:/opt/bin now", &v, '\\', true).unwrap(),
            vec![("PATH".into(), "/usr/bin:/opt/bin now".into())]
        );
        assert!(pairs("x y", &v, '\\', false).is_err());
        assert!(pairs("=v", &v, '\\', false).is_err());
        assert_eq!(
            arg("V=${A}.0", &v, '\\').unwrap(),
            ("V".into(), Some("1.0".into()))
        );
        assert_eq!(arg("V", &v, '\\').unwrap(), ("V".into(), None));
        assert!(arg("a-b", &v, '\\').is_err());
    }
}
