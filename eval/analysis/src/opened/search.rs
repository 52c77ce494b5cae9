//! Search commands that print matching lines: `grep` (and `egrep`,
//! `fgrep`, `zgrep`), `rg`, `ag` and `ack`. An operand is a file shown, or
//! with a recursive search a root under which every file passing the
//! search's filters is shown; listing and counting modes show nothing.

use super::filter::{type_exts, Filter};
use super::interp::Interp;
use super::options::{parse_opts, Spec};
use super::paths::join;
use super::{PathPat, View};
use crate::shell::Word;

impl Interp {
    pub(super) fn grep(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "efmABCdD",
                long_arg: &[
                    "regexp",
                    "file",
                    "max-count",
                    "after-context",
                    "before-context",
                    "context",
                    "include",
                    "exclude",
                    "exclude-dir",
                    "exclude-from",
                    "label",
                    "binary-files",
                    "devices",
                    "directories",
                    "group-separator",
                ],
            },
            false,
        );
        let Some(ops) = p.searched(&["-L", "--silent"]) else {
            return;
        };
        let recursive = p.has(&["-r", "-R", "--recursive", "--dereference-recursive"])
            || p.values(&["-d", "--directories"]).any(|v| v == "recurse");
        if recursive {
            let filter = Filter {
                include: p.values(&["--include"]).map(str::to_string).collect(),
                exclude: p.values(&["--exclude"]).map(str::to_string).collect(),
                exclude_dir: p.values(&["--exclude-dir"]).map(str::to_string).collect(),
                ..Filter::default()
            };
            self.tree(cwd, ops, filter);
        } else {
            for w in ops {
                if let Some(loc) = join(cwd, &w.text) {
                    self.views.push(View::File(PathPat { loc, glob: w.glob }));
                }
            }
        }
    }

    pub(super) fn rg(&mut self, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "efgtTABCmMjErd",
                long_arg: &[
                    "regexp",
                    "file",
                    "glob",
                    "iglob",
                    "type",
                    "type-not",
                    "after-context",
                    "before-context",
                    "context",
                    "max-count",
                    "max-columns",
                    "threads",
                    "encoding",
                    "replace",
                    "max-depth",
                    "type-add",
                    "type-clear",
                    "color",
                    "colors",
                    "sort",
                    "sortr",
                    "pre",
                    "pre-glob",
                    "path-separator",
                    "context-separator",
                    "field-match-separator",
                    "field-context-separator",
                    "ignore-file",
                    "max-filesize",
                    "dfa-size-limit",
                    "regex-size-limit",
                    "engine",
                    "generate",
                    "hyperlink-format",
                ],
            },
            false,
        );
        let Some(ops) = p.searched(&["--files", "--count-matches", "--type-list"]) else {
            return;
        };
        let mut filter = Filter::default();
        for g in p.values(&["-g", "--glob", "--iglob"]) {
            match g.strip_prefix('!') {
                Some(neg) => filter.globs.push((neg.to_string(), true)),
                None => filter.globs.push((g.to_string(), false)),
            }
        }
        for t in p.values(&["-t", "--type"]) {
            if let Some(exts) = type_exts(t) {
                filter.types.extend_from_slice(exts);
            }
        }
        for t in p.values(&["-T", "--type-not"]) {
            if let Some(exts) = type_exts(t) {
                filter.not_types.extend_from_slice(exts);
            }
        }
        self.tree(cwd, ops, filter);
    }

    pub(super) fn ag(&mut self, name: &str, args: &[Word], cwd: &Option<String>) {
        let p = parse_opts(
            args,
            &Spec {
                short_arg: "ABCGmp",
                long_arg: &[
                    "after",
                    "before",
                    "context",
                    "file-search-regex",
                    "max-count",
                    "path-to-ignore",
                    "depth",
                    "ignore",
                    "ignore-dir",
                    "type",
                    "match",
                ],
            },
            false,
        );
        let listing: &[&str] = if name == "ag" {
            &[
                "-l",
                "-L",
                "-c",
                "-g",
                "--count",
                "--files-with-matches",
                "--files-without-matches",
                "--list-file-types",
            ]
        } else {
            &[
                "-l",
                "-L",
                "-c",
                "-f",
                "-g",
                "--count",
                "--files-with-matches",
                "--files-without-matches",
                "--help-types",
            ]
        };
        if p.has(listing) {
            return;
        }
        let ops = p.positionals.get(1..).unwrap_or(&[]);
        self.tree(cwd, ops, Filter::default());
    }
}
