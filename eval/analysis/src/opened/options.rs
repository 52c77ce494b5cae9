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
