//! The filters of a recursive search (grep `--include`/`--exclude`/
//! `--exclude-dir`, rg `-g`/`-t`/`-T`): which files under a search root
//! it printed lines of.

use crate::glob::glob_match;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Filter {
    /// grep `--include`: basename globs, one must match when non-empty.
    pub(super) include: Vec<String>,
    /// grep `--exclude`: basename globs.
    pub(super) exclude: Vec<String>,
    /// grep `--exclude-dir`: directory-name globs.
    pub(super) exclude_dir: Vec<String>,
    /// rg `-g`: (glob, negated); globs with `/` match the path, others the basename.
    pub(super) globs: Vec<(String, bool)>,
    /// rg `-t`: allowed extensions (empty: any).
    pub(super) types: Vec<&'static str>,
    /// rg `-T`: refused extensions.
    pub(super) not_types: Vec<&'static str>,
}

impl Filter {
    pub(super) fn admits(&self, p: &str) -> bool {
        let base = p.rsplit('/').next().unwrap_or(p);
        if !self.include.is_empty() && !self.include.iter().any(|g| glob_match(g, base)) {
            return false;
        }
        if self.exclude.iter().any(|g| glob_match(g, base)) {
            return false;
        }
        let dirs: Vec<&str> = p.split('/').collect();
        let dirs = &dirs[..dirs.len() - 1];
        if self
            .exclude_dir
            .iter()
            .any(|g| dirs.iter().any(|d| glob_match(g, d)))
        {
            return false;
        }
        let glob_hits = |g: &str| {
            if g.contains('/') {
                let g = g.strip_prefix('/').unwrap_or(g);
                glob_match(g, p) || glob_match(&format!("**/{g}"), p)
            } else {
                glob_match(g, base)
            }
        };
        if self.globs.iter().any(|(g, neg)| *neg && glob_hits(g)) {
            return false;
        }
        let positive: Vec<&str> = self
            .globs
            .iter()
            .filter(|(_, neg)| !neg)
            .map(|(g, _)| g.as_str())
            .collect();
        if !positive.is_empty() && !positive.iter().any(|g| glob_hits(g)) {
            return false;
        }
        let ext = base.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
        if !self.types.is_empty() && !self.types.contains(&ext) {
            return false;
        }
        !self.not_types.contains(&ext)
    }
}

/// Extensions of the common ripgrep file types; an unknown type filters nothing.
pub(super) fn type_exts(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "py" | "python" => &["py", "pyi"],
        "go" => &["go"],
        "rust" | "rs" => &["rs"],
        "js" => &["js", "jsx", "mjs", "cjs"],
        "ts" | "typescript" => &["ts", "tsx", "mts", "cts"],
        "java" => &["java"],
        "c" => &["c", "h"],
        "cpp" => &["cpp", "cc", "cxx", "hpp", "hh", "hxx", "h"],
        "ruby" | "rb" => &["rb"],
        "sh" => &["sh", "bash", "zsh"],
        "md" | "markdown" => &["md", "markdown"],
        "json" => &["json"],
        "yaml" => &["yaml", "yml"],
        "toml" => &["toml"],
        "html" => &["html", "htm"],
        "css" => &["css"],
        "php" => &["php"],
        "cs" | "csharp" => &["cs"],
        "kotlin" => &["kt", "kts"],
        "swift" => &["swift"],
        "scala" => &["scala"],
        _ => return None,
    })
}
