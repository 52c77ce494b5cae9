//! Unified diffs (`git diff` style, `a/` and `b/` prefixes) reduced to what
//! the signatures need: which files a patch touches and, per file, the lines
//! it adds in order. Hunk bodies are consumed by the line counts of their
//! `@@` headers, so an added line that itself starts with `++` or `--` is
//! never mistaken for a file header.
//!
//! Also the longest-common-subsequence length behind the "kept" signature,
//! computed with Myers' O((N+M)D) algorithm: inherited code is mostly kept,
//! so D is small and this is close to linear in practice.

use std::collections::BTreeSet;

/// One file of a patch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilePatch {
    /// Path before the change; `None` for a created file.
    pub old_path: Option<String>,
    /// Path after the change; `None` for a deleted file.
    pub new_path: Option<String>,
    /// The `+` lines, without the marker, in order.
    pub added: Vec<String>,
    /// Number of `-` lines.
    pub removed: usize,
    pub binary: bool,
}

impl FilePatch {
    /// The path the file has after the patch, or before it if deleted.
    pub fn path(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or("")
    }
}

/// A parsed unified diff.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patch {
    pub files: Vec<FilePatch>,
}

/// Why a patch did not parse; `line` is 1-based.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchError {
    pub line: usize,
    pub reason: String,
}

impl std::fmt::Display for PatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

enum ParseState {
    Header,
    Hunk {
        old_left: usize,
        new_left: usize,
    },
    /// Inside a `GIT binary patch` block: skip until the next file.
    Binary,
}

impl Patch {
    /// Parse a unified diff. Lines outside any file (a commit message, say)
    /// are ignored; a malformed hunk header is an error.
    pub fn parse(text: &str) -> Result<Patch, PatchError> {
        let mut files: Vec<FilePatch> = Vec::new();
        let mut cur: Option<FilePatch> = None;
        let mut cur_has_hunks = false;
        let mut state = ParseState::Header;
        let lines: Vec<&str> = text.split('\n').collect();
        // `split` yields a trailing empty piece after the final newline.
        let count = if text.ends_with('\n') {
            lines.len() - 1
        } else {
            lines.len()
        };
        let mut i = 0;
        while i < count {
            let raw = lines[i];
            let lineno = i + 1;
            i += 1;
            if let ParseState::Hunk { old_left, new_left } = &mut state {
                let (kind, body) = match raw.chars().next() {
                    Some(c @ ('+' | '-' | ' ' | '\\')) => (c, &raw[1..]),
                    // Some tools strip the single space of an empty context line.
                    None => (' ', ""),
                    Some(_) => {
                        return Err(PatchError {
                            line: lineno,
                            reason: format!(
                                "hunk ends early: expected {old_left} more old and {new_left} more new lines"
                            ),
                        })
                    }
                };
                let file = cur.as_mut().expect("a hunk always belongs to a file");
                match kind {
                    '+' => {
                        file.added.push(body.to_string());
                        *new_left = new_left.saturating_sub(1);
                    }
                    '-' => {
                        file.removed += 1;
                        *old_left = old_left.saturating_sub(1);
                    }
                    ' ' => {
                        *old_left = old_left.saturating_sub(1);
                        *new_left = new_left.saturating_sub(1);
                    }
                    _ => {} // "\ No newline at end of file"
                }
                if *old_left == 0 && *new_left == 0 {
                    // A trailing "\ No newline" marker is skipped as header noise.
                    state = ParseState::Header;
                }
                continue;
            }
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            if let Some(rest) = line.strip_prefix("diff --git ") {
                if let Some(f) = cur.take() {
                    files.push(f);
                }
                let (old, new) = split_git_header(rest);
                cur = Some(FilePatch {
                    old_path: old,
                    new_path: new,
                    ..FilePatch::default()
                });
                cur_has_hunks = false;
                state = ParseState::Header;
                continue;
            }
            if matches!(state, ParseState::Binary) {
                continue;
            }
            if let Some(rest) = line.strip_prefix("--- ") {
                let next_is_new = i < count && lines[i].starts_with("+++ ");
                if next_is_new && (cur.is_none() || cur_has_hunks) {
                    // A plain unified diff without `diff --git` lines.
                    if let Some(f) = cur.take() {
                        files.push(f);
                    }
                    cur = Some(FilePatch::default());
                    cur_has_hunks = false;
                }
                if let Some(f) = cur.as_mut() {
                    f.old_path = header_path(rest, "a/");
                }
            } else if let Some(rest) = line.strip_prefix("+++ ") {
                if let Some(f) = cur.as_mut() {
                    f.new_path = header_path(rest, "b/");
                }
            } else if let Some(rest) = line.strip_prefix("rename from ") {
                if let Some(f) = cur.as_mut() {
                    f.old_path = Some(unquote(rest));
                }
            } else if let Some(rest) = line.strip_prefix("rename to ") {
                if let Some(f) = cur.as_mut() {
                    f.new_path = Some(unquote(rest));
                }
            } else if line.starts_with("new file mode") {
                if let Some(f) = cur.as_mut() {
                    f.old_path = None;
                }
            } else if line.starts_with("deleted file mode") {
                if let Some(f) = cur.as_mut() {
                    f.new_path = None;
                }
            } else if line.starts_with("Binary files ") {
                if let Some(f) = cur.as_mut() {
                    f.binary = true;
                }
            } else if line.starts_with("GIT binary patch") {
                if let Some(f) = cur.as_mut() {
                    f.binary = true;
                }
                state = ParseState::Binary;
            } else if line.starts_with("@@") {
                if cur.is_none() {
                    return Err(PatchError {
                        line: lineno,
                        reason: "hunk before any file header".into(),
                    });
                }
                let (old_left, new_left) = parse_hunk_header(line).ok_or_else(|| PatchError {
                    line: lineno,
                    reason: format!("malformed hunk header {line:?}"),
                })?;
                cur_has_hunks = true;
                if old_left > 0 || new_left > 0 {
                    state = ParseState::Hunk { old_left, new_left };
                }
            }
        }
        if let ParseState::Hunk { old_left, new_left } = state {
            return Err(PatchError {
                line: count,
                reason: format!(
                    "patch ends inside a hunk: {old_left} old and {new_left} new lines missing"
                ),
            });
        }
        if let Some(f) = cur.take() {
            files.push(f);
        }
        Ok(Patch { files })
    }

    /// Every path the patch touches, before or after the change.
    pub fn changed_paths(&self) -> BTreeSet<&str> {
        let mut out = BTreeSet::new();
        for f in &self.files {
            if let Some(p) = &f.old_path {
                out.insert(p.as_str());
            }
            if let Some(p) = &f.new_path {
                out.insert(p.as_str());
            }
        }
        out
    }

    /// Whether the patch touches `path`.
    pub fn touches(&self, path: &str) -> bool {
        self.files
            .iter()
            .any(|f| f.old_path.as_deref() == Some(path) || f.new_path.as_deref() == Some(path))
    }

    /// The lines added to the file that is at `path` after the patch.
    pub fn added_lines<'a>(&'a self, path: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.files
            .iter()
            .filter(move |f| f.new_path.as_deref() == Some(path))
            .flat_map(|f| f.added.iter().map(String::as_str))
    }
}

/// `a/x b/y` of a `diff --git` line. Unquoted paths with spaces are split in
/// the middle when both halves name the same file; `---`/`+++` lines, when
/// present, override whatever is guessed here.
fn split_git_header(rest: &str) -> (Option<String>, Option<String>) {
    if rest.starts_with('"') {
        let mut words = Vec::new();
        let mut s = rest;
        while !s.is_empty() {
            s = s.trim_start();
            if let Some(stripped) = s.strip_prefix('"') {
                match closing_quote(stripped) {
                    Some(end) => {
                        words.push(unquote(&s[..end + 2]));
                        s = &stripped[end + 1..];
                    }
                    None => {
                        words.push(unquote(s));
                        s = "";
                    }
                }
            } else {
                let end = s.find(' ').unwrap_or(s.len());
                words.push(s[..end].to_string());
                s = &s[end..];
            }
        }
        let strip = |w: &String, p: &str| w.strip_prefix(p).map(str::to_string);
        return (
            words.first().and_then(|w| strip(w, "a/")),
            words.get(1).and_then(|w| strip(w, "b/")),
        );
    }
    // Same name on both sides: "a/<p> b/<p>" has length 2 * len(p) + 5.
    if rest.len() % 2 == 1 {
        let half = (rest.len() - 1) / 2;
        let (a, b) = (&rest[..half], &rest[half + 1..]);
        if let (Some(a), Some(b)) = (a.strip_prefix("a/"), b.strip_prefix("b/")) {
            if a == b {
                return (Some(a.to_string()), Some(b.to_string()));
            }
        }
    }
    match rest.find(" b/") {
        Some(i) => (
            rest[..i].strip_prefix("a/").map(str::to_string),
            Some(rest[i + 3..].to_string()),
        ),
        None => (None, None),
    }
}

fn closing_quote(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The path of a `---`/`+++` line, without prefix, timestamp or quoting;
/// `None` for `/dev/null`.
fn header_path(rest: &str, prefix: &str) -> Option<String> {
    let rest = if rest.starts_with('"') {
        rest
    } else {
        rest.split('\t').next().unwrap_or(rest)
    };
    let path = unquote(rest.trim_end());
    if path == "/dev/null" {
        return None;
    }
    Some(
        path.strip_prefix(prefix)
            .map(str::to_string)
            .unwrap_or(path),
    )
}

/// Undo git's C-style quoting of unusual path names.
fn unquote(s: &str) -> String {
    let Some(inner) = s.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return s.to_string();
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let raw = inner.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' || i + 1 == raw.len() {
            bytes.push(raw[i]);
            i += 1;
            continue;
        }
        let c = raw[i + 1];
        i += 2;
        match c {
            b'n' => bytes.push(b'\n'),
            b't' => bytes.push(b'\t'),
            b'r' => bytes.push(b'\r'),
            b'a' => bytes.push(7),
            b'b' => bytes.push(8),
            b'f' => bytes.push(12),
            b'v' => bytes.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                let mut digits = 1;
                while digits < 3 && i < raw.len() && (b'0'..=b'7').contains(&raw[i]) {
                    v = v * 8 + u32::from(raw[i] - b'0');
                    i += 1;
                    digits += 1;
                }
                bytes.push(v as u8);
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `@@ -a[,b] +c[,d] @@` -> (b, d); a missing count means 1.
fn parse_hunk_header(line: &str) -> Option<(usize, usize)> {
    let body = line.strip_prefix("@@ ")?;
    let end = body.find(" @@")?;
    let mut parts = body[..end].split(' ');
    let old = parts.next()?.strip_prefix('-')?;
    let new = parts.next()?.strip_prefix('+')?;
    let count = |r: &str| -> Option<usize> {
        match r.split_once(',') {
            Some((start, n)) => {
                start.parse::<usize>().ok()?;
                n.parse().ok()
            }
            None => {
                r.parse::<usize>().ok()?;
                Some(1)
            }
        }
    };
    Some((count(old)?, count(new)?))
}

/// Length of a longest common subsequence of `a` and `b` (exact, in order).
pub fn lcs_len<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[prefix..], &b[prefix..]);
    let suffix = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (a, b) = (&a[..a.len() - suffix], &b[..b.len() - suffix]);
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 {
        return prefix + suffix;
    }
    // Myers: v[k + offset] is the furthest x reached on diagonal k = x - y
    // with d insertions and deletions; the first d reaching (n, m) is the
    // edit distance, and LCS = (n + m - d) / 2.
    let max = n + m;
    let offset = max as isize + 1;
    let mut v = vec![0usize; 2 * max + 3];
    for d in 0..=max as isize {
        let mut k = -d;
        while k <= d {
            let idx = (k + offset) as usize;
            let mut x = if k == -d || (k != d && v[idx - 1] < v[idx + 1]) {
                v[idx + 1]
            } else {
                v[idx - 1] + 1
            };
            let mut y = (x as isize - k) as usize;
            while x < n && y < m && a[x] == b[y] {
                x += 1;
                y += 1;
            }
            v[idx] = x;
            if x >= n && y >= m {
                return prefix + suffix + (n + m - d as usize) / 2;
            }
            k += 2;
        }
    }
    unreachable!("the edit distance is at most n + m")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_FILES: &str = "\
diff --git a/src/lib.rs b/src/lib.rs
index 1111111..2222222 100644
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -1,3 +1,4 @@
 fn a() {}
-fn b() {}
+fn b() { 1 }
+++ looks like a header but is an added line
 fn c() {}
diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1,2 @@
+hello
+world
\\ No newline at end of file
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/img.png b/img.png
Binary files a/img.png and b/img.png differ
";

    #[test]
    fn parses_files_and_added_lines() {
        let p = Patch::parse(TWO_FILES).unwrap();
        assert_eq!(p.files.len(), 4);
        let lib = &p.files[0];
        assert_eq!(lib.path(), "src/lib.rs");
        assert_eq!(
            lib.added,
            vec![
                "fn b() { 1 }",
                "++ looks like a header but is an added line"
            ]
        );
        assert_eq!(lib.removed, 1);
        assert_eq!(p.files[1].old_path, None);
        assert_eq!(p.files[1].added, vec!["hello", "world"]);
        assert_eq!(p.files[2].new_path, None);
        assert_eq!(p.files[2].path(), "gone.txt");
        assert!(p.files[3].binary);
        let changed: Vec<_> = p.changed_paths().into_iter().collect();
        assert_eq!(
            changed,
            vec!["gone.txt", "img.png", "new.txt", "src/lib.rs"]
        );
        assert_eq!(
            p.added_lines("new.txt").collect::<Vec<_>>(),
            vec!["hello", "world"]
        );
    }

    #[test]
    fn renames_spaces_and_quoting() {
        let text = "diff --git a/old name.txt b/new name.txt\nsimilarity index 90%\nrename from old name.txt\nrename to new name.txt\n\
diff --git \"a/t\\303\\251st.txt\" \"b/t\\303\\251st.txt\"\n--- \"a/t\\303\\251st.txt\"\n+++ \"b/t\\303\\251st.txt\"\n@@ -1 +1 @@\n-x\n+y\n\
diff --git a/same name.go b/same name.go\n--- a/same name.go\t2024-01-01\n+++ b/same name.go\t2024-01-01\n@@ -0,0 +1 @@\n+z\n";
        let p = Patch::parse(text).unwrap();
        assert_eq!(p.files[0].old_path.as_deref(), Some("old name.txt"));
        assert_eq!(p.files[0].new_path.as_deref(), Some("new name.txt"));
        assert_eq!(p.files[1].path(), "t\u{e9}st.txt");
        assert_eq!(p.files[1].added, vec!["y"]);
        assert_eq!(p.files[2].path(), "same name.go");
        assert_eq!(
            split_git_header("a/x y b/x y"),
            (Some("x y".into()), Some("x y".into()))
        );
    }

    #[test]
    fn plain_unified_diff_without_git_lines() {
        let text = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n--- a/y\n+++ b/y\n@@ -1 +1,2 @@\n q\n+r\n";
        let p = Patch::parse(text).unwrap();
        assert_eq!(p.files.len(), 2);
        assert_eq!(p.files[0].added, vec!["c"]);
        assert_eq!(p.files[1].path(), "y");
        assert_eq!(p.files[1].added, vec!["r"]);
    }

    #[test]
    fn malformed_hunks_are_errors() {
        assert_eq!(
            Patch::parse("diff --git a/x b/x\n@@ -1,x +1 @@\n")
                .unwrap_err()
                .line,
            2
        );
        let err = Patch::parse("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n")
            .unwrap_err();
        assert!(err.reason.contains("ends inside a hunk"), "{err}");
        assert!(Patch::parse("@@ -1 +1 @@\n-a\n+b\n").is_err());
        // Text that is not a diff at all is an empty patch.
        assert_eq!(Patch::parse("just a note\n").unwrap().files.len(), 0);
    }

    fn lcs_dp<T: PartialEq>(a: &[T], b: &[T]) -> usize {
        let mut dp = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in 1..=a.len() {
            for j in 1..=b.len() {
                dp[i][j] = if a[i - 1] == b[j - 1] {
                    dp[i - 1][j - 1] + 1
                } else {
                    dp[i - 1][j].max(dp[i][j - 1])
                };
            }
        }
        dp[a.len()][b.len()]
    }

    #[test]
    fn lcs_matches_hand_examples_and_dynamic_programming() {
        assert_eq!(lcs_len(&["a", "b", "c"], &["a", "b", "c"]), 3);
        assert_eq!(lcs_len(&["a", "b", "c"], &["c", "b", "a"]), 1);
        assert_eq!(lcs_len(&["a", "b", "c", "d"], &["a", "x", "c", "d"]), 3);
        assert_eq!(lcs_len::<&str>(&[], &["a"]), 0);
        assert_eq!(lcs_len(&["a", "b"], &["b", "a", "b"]), 2);
        // Pseudo-random small sequences against the quadratic reference.
        let mut s = 0x1234_5678_u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..500 {
            let n = (next() % 12) as usize;
            let m = (next() % 12) as usize;
            let a: Vec<u64> = (0..n).map(|_| next() % 4).collect();
            let b: Vec<u64> = (0..m).map(|_| next() % 4).collect();
            assert_eq!(lcs_len(&a, &b), lcs_dp(&a, &b), "{a:?} {b:?}");
        }
    }
}
