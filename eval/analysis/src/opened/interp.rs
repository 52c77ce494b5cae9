//! The interpreter that walks a trajectory's command lines: it drops
//! leading `NAME=value` assignments and wrappers (`sudo`, `env`, `timeout`,
//! ...), follows `cd` and `sh -c`, leaves out commands whose output goes to
//! a file, and dispatches every other command by name to its handler (in
//! [`super::viewers`], [`super::search`] and [`super::git`]), which records
//! the content views it makes.

use super::filter::Filter;
use super::options::{parse_opts, Spec, NO_ARGS};
use super::paths::{base, join};
use super::{Loc, PathPat, View};
use crate::shell::{split_commands, SimpleCommand, Word};

#[derive(Default)]
pub(super) struct Interp {
    pub(super) views: Vec<View>,
}

impl Interp {
    pub(super) fn line(&mut self, text: &str, cwd: &mut Option<String>, depth: usize) {
        if depth > 4 {
            return;
        }
        for cmd in split_commands(text) {
            self.command(&cmd, cwd, depth);
        }
    }

    pub(super) fn command(&mut self, cmd: &SimpleCommand, cwd: &mut Option<String>, depth: usize) {
        let words = unwrap_command(&cmd.words);
        let Some(first) = words.first() else { return };
        let name = base(&first.text);
        let args = &words[1..];
        match name {
            "cd" | "pushd" => {
                cd(args, cwd);
                return;
            }
            "bash" | "sh" | "zsh" | "dash" | "ksh" => {
                self.shell(args, cwd, depth);
                return;
            }
            _ => {}
        }
        if cmd.stdout_to_file() {
            return;
        }
        match name {
            "cat" | "tac" | "more" | "most" => self.cat(args, cwd),
            "less" => self.less(args, cwd),
            "nl" => self.nl(args, cwd),
            "bat" | "batcat" => self.bat(args, cwd),
            "head" | "tail" => self.head_tail(args, cwd),
            "sed" => self.sed(args, cwd),
            "awk" | "gawk" | "mawk" | "nawk" => self.awk(args, cwd),
            "grep" | "egrep" | "fgrep" | "zgrep" => self.grep(args, cwd),
            "rg" => self.rg(args, cwd),
            "ag" | "ack" | "ack-grep" => self.ag(name, args, cwd),
            "git" => self.git(args, cwd),
            "vim" | "vi" | "nvim" | "view" | "vimdiff" | "gvim" => self.vim(args, cwd),
            "nano" | "pico" | "emacs" | "emacsclient" | "micro" => self.editor(args, cwd),
            _ => {}
        }
    }

    /// `sh -c SCRIPT` runs the script in a copy of the working directory.
    fn shell(&mut self, args: &[Word], cwd: &Option<String>, depth: usize) {
        let parsed = parse_opts(
            args,
            &Spec {
                short_arg: "oO",
                long_arg: &[],
            },
            false,
        );
        if parsed.has(&["-c"]) {
            if let Some(script) = parsed.positionals.first() {
                let mut inner = cwd.clone();
                self.line(&script.text, &mut inner, depth + 1);
            }
        }
    }

    /// Each operand (but `-`, standard input) is a file whose content is shown.
    pub(super) fn files(&mut self, cwd: &Option<String>, ops: &[Word]) {
        for w in ops {
            if w.text == "-" {
                continue;
            }
            if let Some(loc) = join(cwd, &w.text) {
                self.views.push(View::File(PathPat { loc, glob: w.glob }));
            }
        }
    }

    /// A recursive search of `roots` (the working directory when none).
    pub(super) fn tree(&mut self, cwd: &Option<String>, roots: &[Word], filter: Filter) {
        if roots.is_empty() {
            if let Some(loc) = join(cwd, ".") {
                self.views.push(View::Tree {
                    root: PathPat { loc, glob: false },
                    filter,
                });
            }
            return;
        }
        for w in roots {
            if let Some(loc) = join(cwd, &w.text) {
                self.views.push(View::Tree {
                    root: PathPat { loc, glob: w.glob },
                    filter: filter.clone(),
                });
            }
        }
    }
}

/// `cd DIR` / `pushd DIR` moves the working directory; without an operand
/// (home) it becomes unknown.
fn cd(args: &[Word], cwd: &mut Option<String>) {
    let parsed = parse_opts(args, &NO_ARGS, false);
    *cwd = match parsed.positionals.first() {
        Some(w) => join(cwd, &w.text).map(|l| match l {
            Loc::Rel(r) => r,
            Loc::Abs(a) => a,
        }),
        None => None,
    };
}

/// The command proper: leading `NAME=value` assignments and wrappers that
/// run their operand as a command (`sudo`, `env`, `timeout`, ...) removed.
/// Empty when nothing is left to run.
fn unwrap_command(mut words: &[Word]) -> &[Word] {
    // Leading `NAME=value` assignments.
    while let Some(w) = words.first() {
        let is_assignment = w.text.split_once('=').is_some_and(|(n, _)| {
            !n.is_empty()
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !n.starts_with(|c: char| c.is_ascii_digit())
        });
        if !is_assignment {
            break;
        }
        words = &words[1..];
    }
    // Wrappers that run their operand as a command.
    loop {
        let Some(first) = words.first() else {
            return words;
        };
        let name = base(&first.text);
        let Some(spec) = wrapper_spec(name) else {
            return words;
        };
        let parsed = parse_opts(&words[1..], &spec, true);
        let mut ops: &[Word] = &words[words.len() - parsed.positionals.len()..];
        if name == "env" {
            while ops.first().is_some_and(|w| w.text.contains('=')) {
                ops = &ops[1..];
            }
        }
        if name == "timeout" && !ops.is_empty() {
            ops = &ops[1..];
        }
        words = ops;
    }
}

/// The options of a wrapper command; `None` for a command that is not one.
fn wrapper_spec(name: &str) -> Option<Spec> {
    Some(match name {
        "sudo" => Spec {
            short_arg: "ugCDhprtTU",
            long_arg: &["user", "group", "chdir", "host", "prompt", "role", "type"],
        },
        "env" => Spec {
            short_arg: "uCS",
            long_arg: &["unset", "chdir", "split-string"],
        },
        "timeout" => Spec {
            short_arg: "sk",
            long_arg: &["signal", "kill-after"],
        },
        "nice" => Spec {
            short_arg: "n",
            long_arg: &["adjustment"],
        },
        "stdbuf" => Spec {
            short_arg: "ioe",
            long_arg: &["input", "output", "error"],
        },
        "ionice" => Spec {
            short_arg: "cnp",
            long_arg: &["class", "classdata", "pid"],
        },
        "exec" => Spec {
            short_arg: "a",
            long_arg: &[],
        },
        "nohup" | "time" | "command" | "builtin" | "unbuffer" => NO_ARGS,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unwrap(line: &str) -> Vec<String> {
        let words: Vec<Word> = line
            .split_whitespace()
            .map(|t| Word {
                text: t.to_string(),
                glob: false,
            })
            .collect();
        unwrap_command(&words)
            .iter()
            .map(|w| w.text.clone())
            .collect()
    }

    #[test]
    fn assignments_and_wrappers_are_removed() {
        assert_eq!(unwrap("cat a.go"), ["cat", "a.go"]);
        assert_eq!(unwrap("FOO=1 BAR_2=x cat a.go"), ["cat", "a.go"]);
        // Not an assignment: a name cannot start with a digit.
        assert_eq!(unwrap("1X=2 cat a.go"), ["1X=2", "cat", "a.go"]);
        assert_eq!(
            unwrap("sudo -u dev timeout -s KILL 10 nice -n 5 /usr/bin/head -n 3 a.go"),
            ["/usr/bin/head", "-n", "3", "a.go"]
        );
        assert_eq!(unwrap("env -u X A=1 B=2 cat a.go"), ["cat", "a.go"]);
        assert_eq!(unwrap("nohup time command cat a.go"), ["cat", "a.go"]);
        // Nothing left to run.
        assert!(unwrap("timeout 5").is_empty());
        assert!(unwrap("sudo").is_empty());
        assert!(unwrap("X=1").is_empty());
    }
}
