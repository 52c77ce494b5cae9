//! Commands that print or open the files named as operands: pagers and
//! printers (`cat`, `tac`, `more`, `most`, `less`, `nl`, `bat`, `head`,
//! `tail`), stream editors that print (`sed` without `-i`, `awk`), and
//! editors (the vi family, `nano`, `pico`, `emacs`, `micro`). One handler
//! per command family, called from the dispatch in [`super::interp`].

use super::interp::Interp;
use super::options::{parse_opts, Spec, NO_ARGS};
use crate::shell::Word;

impl Interp {
    /// `cat`, `tac`, `more`, `most`: operands, `+N` positions left out.
    pub(super) fn cat(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(args, &NO_ARGS, false);
        let ops: Vec<Word> = p
            .positionals
            .into_iter()
            .filter(|w| !w.text.starts_with('+'))
            .collect();
        self.files(cwd, &ops);
    }

    /// `less`: operands, `+CMD` left out.
    pub(super) fn less(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "bhjkoOpPtTxyz#",
                long_arg: &[],
            },
            false,
        );
        let ops: Vec<Word> = p
            .positionals
            .into_iter()
            .filter(|w| !w.text.starts_with('+'))
            .collect();
        self.files(cwd, &ops);
    }

    /// `nl`: operands.
    pub(super) fn nl(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "bdfhilnsvw",
                long_arg: &[],
            },
            false,
        );
        self.files(cwd, &p.positionals);
    }

    /// `bat` / `batcat`: operands.
    pub(super) fn bat(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "lrHm",
                long_arg: &[
                    "language",
                    "line-range",
                    "highlight-line",
                    "style",
                    "theme",
                    "map-syntax",
                    "tabs",
                    "wrap",
                    "terminal-width",
                    "color",
                    "paging",
                    "decorations",
                    "file-name",
                    "diff-context",
                    "italic-text",
                    "pager",
                    "squeeze-limit",
                    "nonprintable-notation",
                    "binary",
                ],
            },
            false,
        );
        self.files(cwd, &p.positionals);
    }

    /// `head` / `tail`: operands.
    pub(super) fn head_tail(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "ncs",
                long_arg: &[
                    "lines",
                    "bytes",
                    "sleep-interval",
                    "pid",
                    "max-unchanged-stats",
                ],
            },
            false,
        );
        self.files(cwd, &p.positionals);
    }

    /// `sed`: operands after the script; an in-place edit (`-i`) prints nothing.
    pub(super) fn sed(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "efl",
                long_arg: &["expression", "file", "line-length"],
            },
            false,
        );
        if p.has(&["-i", "--in-place"]) {
            return;
        }
        let script_given = p.has(&["-e", "-f", "--expression", "--file"]);
        let ops = if script_given {
            &p.positionals[..]
        } else {
            p.positionals.get(1..).unwrap_or(&[])
        };
        self.files(cwd, ops);
    }

    /// `awk` and its variants: operands after the program, `var=value` assignments left out.
    pub(super) fn awk(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "fvF",
                long_arg: &["file", "assign", "field-separator"],
            },
            false,
        );
        let prog_given = p.has(&["-f", "--file"]);
        let ops = if prog_given {
            &p.positionals[..]
        } else {
            p.positionals.get(1..).unwrap_or(&[])
        };
        let ops: Vec<Word> = ops
            .iter()
            .filter(|w| !w.text.contains('='))
            .cloned()
            .collect();
        self.files(cwd, &ops);
    }

    /// The vi family: operands, `+CMD` left out.
    pub(super) fn vim(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "cSuiTtqwWs",
                long_arg: &["cmd"],
            },
            false,
        );
        let ops: Vec<Word> = p
            .positionals
            .into_iter()
            .filter(|w| !w.text.starts_with('+'))
            .collect();
        self.files(cwd, &ops);
    }

    /// `nano`, `pico`, `emacs`, `emacsclient`, `micro`: operands, `+LINE` left out.
    pub(super) fn editor(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(args, &NO_ARGS, false);
        let ops: Vec<Word> = p
            .positionals
            .into_iter()
            .filter(|w| !w.text.starts_with('+'))
            .collect();
        self.files(cwd, &ops);
    }
}
