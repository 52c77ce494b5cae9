//! GNU-style option parsing for the commands the interpreter knows: which
//! options take an argument ([`Spec`]), and the flags and operands of one
//! command line ([`Parsed`]).

use crate::shell::Word;

/// Options of one command: which take an argument.
pub(super) struct Spec {
    pub(super) short_arg: &'static str,
    pub(super) long_arg: &'static [&'static str],
}

#[derive(Debug, Default)]
pub(super) struct Parsed {
    /// `-x` or `--name`, with the value when the option takes one.
    pub(super) flags: Vec<(String, Option<String>)>,
    pub(super) positionals: Vec<Word>,
}

impl Parsed {
    pub(super) fn has(&self, names: &[&str]) -> bool {
        self.flags.iter().any(|(f, _)| names.contains(&f.as_str()))
    }

    /// The files a search (grep, rg, git grep) shows the contents of: its operands after
    /// the pattern (the first operand, unless `-e`/`-f` gave it); none when a flag that
    /// prints names, counts or nothing instead of lines is set: one all three share, or
    /// one of the tool's own in `listing`.
    pub(super) fn searched(&self, listing: &[&str]) -> Option<&[Word]> {
        const SHARED: &[&str] = &[
            "-l",
            "-c",
            "-q",
            "--files-with-matches",
            "--files-without-match",
            "--count",
            "--quiet",
        ];
        if self.has(SHARED) || self.has(listing) {
            return None;
        }
        Some(if self.has(&["-e", "-f", "--regexp", "--file"]) {
            &self.positionals[..]
        } else {
            self.positionals.get(1..).unwrap_or(&[])
        })
    }

    pub(super) fn values<'a>(&'a self, names: &'a [&'a str]) -> impl Iterator<Item = &'a str> + 'a {
        self.flags
            .iter()
            .filter(move |(f, _)| names.contains(&f.as_str()))
            .filter_map(|(_, v)| v.as_deref())
    }
}

/// GNU-style option parsing; with `stop_at_operand`, everything from the
/// first operand on is an operand (wrappers such as `sudo` and `timeout`).
pub(super) fn parse_opts(args: &[Word], spec: &Spec, stop_at_operand: bool) -> Parsed {
    let mut out = Parsed::default();
    let mut i = 0;
    let mut only_operands = false;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        let t = a.text.as_str();
        if only_operands || t == "-" || !t.starts_with('-') || t.len() < 2 {
            out.positionals.push(a.clone());
            if stop_at_operand {
                only_operands = true;
            }
            continue;
        }
        if t == "--" {
            only_operands = true;
            continue;
        }
        if let Some(long) = t.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let value = if value.is_none() && spec.long_arg.contains(&name) && i < args.len() {
                i += 1;
                Some(args[i - 1].text.clone())
            } else {
                value
            };
            out.flags.push((format!("--{name}"), value));
            continue;
        }
        let chars: Vec<char> = t[1..].chars().collect();
        for (j, c) in chars.iter().enumerate() {
            if spec.short_arg.contains(*c) {
                let rest: String = chars[j + 1..].iter().collect();
                let value = if !rest.is_empty() {
                    Some(rest)
                } else if i < args.len() {
                    i += 1;
                    Some(args[i - 1].text.clone())
                } else {
                    None
                };
                out.flags.push((format!("-{c}"), value));
                break;
            }
            out.flags.push((format!("-{c}"), None));
        }
    }
    out
}

pub(super) const NO_ARGS: Spec = Spec {
    short_arg: "",
    long_arg: &[],
};
