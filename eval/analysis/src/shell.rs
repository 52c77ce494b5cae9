//! A small shell reader: splits a command line into simple commands on
//! `;`, `&&`, `||`, `|`, `&`, parentheses and newlines, with POSIX-style
//! quoting (`'...'`, `"..."`, `$'...'`, backslashes), comments, redirections
//! and here-documents (whose bodies are skipped, so the text of a file being
//! written is never read as commands). `$(...)`, `${...}` and backquotes stay
//! inside their word unexpanded. It reads what an agent typed; it does not
//! evaluate anything.

/// Redirection operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirOp {
    /// `>`, `>|`
    Out,
    /// `>>`
    Append,
    /// `&>`, `&>>`: stdout and stderr
    OutErr,
    /// `>&`: duplicate an output fd
    DupOut,
    /// `<`, `<&`, `<>`
    In,
    /// `<<`, `<<-`
    HereDoc,
    /// `<<<`
    HereString,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub fd: Option<u32>,
    pub op: RedirOp,
    pub target: String,
}

/// A word after quote removal. `glob` is set when an unquoted `*`, `?` or `[`
/// occurs, i.e. the shell would expand it as a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Word {
    pub text: String,
    pub glob: bool,
}

/// One simple command: words and redirections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimpleCommand {
    pub words: Vec<Word>,
    pub redirects: Vec<Redirect>,
}

impl SimpleCommand {
    /// Whether standard output goes to a file (including `/dev/null`) rather
    /// than the terminal or a pipe.
    pub fn stdout_to_file(&self) -> bool {
        let mut to_file = false;
        for r in &self.redirects {
            let fd1 = r.fd.is_none() || r.fd == Some(1);
            match r.op {
                RedirOp::Out | RedirOp::Append if fd1 => {
                    to_file = !matches!(
                        r.target.as_str(),
                        "/dev/stdout" | "/dev/stderr" | "/dev/tty"
                    );
                }
                RedirOp::OutErr => {
                    to_file = !matches!(
                        r.target.as_str(),
                        "/dev/stdout" | "/dev/stderr" | "/dev/tty"
                    );
                }
                RedirOp::DupOut if fd1 => {
                    // `>&2` shows output on the terminal; `>&file` (bash) writes a file.
                    to_file = !r.target.chars().all(|c| c.is_ascii_digit() || c == '-');
                }
                _ => {}
            }
        }
        to_file
    }
}

/// Split a command line into its simple commands, in order.
pub fn split_commands(line: &str) -> Vec<SimpleCommand> {
    Reader::new(line).run()
}

struct Reader {
    chars: Vec<char>,
    i: usize,
    out: Vec<SimpleCommand>,
    cur: SimpleCommand,
    heredocs: Vec<(String, bool)>,
}

const META: &[char] = &[';', '&', '|', '<', '>', '(', ')', '\n'];

impl Reader {
    fn new(line: &str) -> Self {
        Reader {
            chars: line.chars().collect(),
            i: 0,
            out: Vec::new(),
            cur: SimpleCommand::default(),
            heredocs: Vec::new(),
        }
    }

    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).copied()
    }

    fn finish(&mut self) {
        let cmd = std::mem::take(&mut self.cur);
        if !cmd.words.is_empty() || !cmd.redirects.is_empty() {
            self.out.push(cmd);
        }
    }

    fn run(mut self) -> Vec<SimpleCommand> {
        while let Some(c) = self.peek(0) {
            match c {
                ' ' | '\t' | '\r' => self.i += 1,
                '\n' => {
                    self.i += 1;
                    self.finish();
                    self.skip_heredoc_bodies();
                }
                ';' | '(' | ')' => {
                    self.i += 1;
                    self.finish();
                }
                '|' => {
                    self.i += if matches!(self.peek(1), Some('|' | '&')) {
                        2
                    } else {
                        1
                    };
                    self.finish();
                }
                '&' if self.peek(1) == Some('>') => {
                    self.i += 2;
                    if self.peek(0) == Some('>') {
                        self.i += 1;
                    }
                    self.redirect(None, RedirOp::OutErr);
                }
                '&' => {
                    self.i += if self.peek(1) == Some('&') { 2 } else { 1 };
                    self.finish();
                }
                '#' => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                '<' | '>' => self.redirect_op(None),
                _ => {
                    // `2>file`: digits directly followed by a redirection.
                    let digits = self.chars[self.i..]
                        .iter()
                        .take_while(|c| c.is_ascii_digit())
                        .count();
                    if digits > 0 && matches!(self.peek(digits), Some('<' | '>')) {
                        let fd: String = self.chars[self.i..self.i + digits].iter().collect();
                        self.i += digits;
                        self.redirect_op(fd.parse().ok());
                        continue;
                    }
                    let w = self.word();
                    if self.cur.words.is_empty() && (w.text == "{" || w.text == "}") && !w.glob {
                        self.finish();
                    } else {
                        self.cur.words.push(w);
                    }
                }
            }
        }
        self.finish();
        self.out
    }

    fn redirect_op(&mut self, fd: Option<u32>) {
        let c = self.peek(0).expect("called on < or >");
        self.i += 1;
        let op = if c == '>' {
            match self.peek(0) {
                Some('>') => {
                    self.i += 1;
                    RedirOp::Append
                }
                Some('&') => {
                    self.i += 1;
                    RedirOp::DupOut
                }
                Some('|') => {
                    self.i += 1;
                    RedirOp::Out
                }
                _ => RedirOp::Out,
            }
        } else {
            match self.peek(0) {
                Some('<') if self.peek(1) == Some('<') => {
                    self.i += 2;
                    RedirOp::HereString
                }
                Some('<') => {
                    self.i += 1;
                    let strip = self.peek(0) == Some('-');
                    if strip {
                        self.i += 1;
                    }
                    self.skip_blanks();
                    let delim = self.word();
                    self.heredocs.push((delim.text.clone(), strip));
                    self.cur.redirects.push(Redirect {
                        fd,
                        op: RedirOp::HereDoc,
                        target: delim.text,
                    });
                    return;
                }
                Some('&' | '>') => {
                    self.i += 1;
                    RedirOp::In
                }
                _ => RedirOp::In,
            }
        };
        self.redirect(fd, op);
    }

    fn redirect(&mut self, fd: Option<u32>, op: RedirOp) {
        self.skip_blanks();
        let target = if self.peek(0).is_some_and(|c| !META.contains(&c)) {
            self.word().text
        } else {
            String::new()
        };
        self.cur.redirects.push(Redirect { fd, op, target });
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(0), Some(' ' | '\t')) {
            self.i += 1;
        }
    }

    /// After a newline, drop the bodies of pending here-documents.
    fn skip_heredoc_bodies(&mut self) {
        for (delim, strip) in std::mem::take(&mut self.heredocs) {
            loop {
                if self.i >= self.chars.len() {
                    return;
                }
                let start = self.i;
                while self.peek(0).is_some_and(|c| c != '\n') {
                    self.i += 1;
                }
                let line: String = self.chars[start..self.i].iter().collect();
                if self.peek(0) == Some('\n') {
                    self.i += 1;
                }
                let line = line.trim_end_matches('\r');
                let line = if strip {
                    line.trim_start_matches('\t')
                } else {
                    line
                };
                if line == delim {
                    break;
                }
            }
        }
    }

    fn word(&mut self) -> Word {
        let mut text = String::new();
        let mut glob = false;
        while let Some(c) = self.peek(0) {
            match c {
                ' ' | '\t' | '\r' => break,
                c if META.contains(&c) => break,
                '\'' => {
                    self.i += 1;
                    while let Some(c) = self.peek(0) {
                        self.i += 1;
                        if c == '\'' {
                            break;
                        }
                        text.push(c);
                    }
                }
                '"' => {
                    self.i += 1;
                    while let Some(c) = self.peek(0) {
                        self.i += 1;
                        match c {
                            '"' => break,
                            '\\' => match self.peek(0) {
                                Some(n @ ('"' | '\\' | '$' | '`')) => {
                                    text.push(n);
                                    self.i += 1;
                                }
                                Some('\n') => self.i += 1,
                                _ => text.push('\\'),
                            },
                            '$' if self.peek(0) == Some('(') => {
                                text.push('$');
                                self.balanced('(', ')', &mut text);
                            }
                            _ => text.push(c),
                        }
                    }
                }
                '\\' => {
                    self.i += 1;
                    match self.peek(0) {
                        Some('\n') => self.i += 1,
                        Some(n) => {
                            text.push(n);
                            self.i += 1;
                        }
                        None => {}
                    }
                }
                '$' => {
                    self.i += 1;
                    match self.peek(0) {
                        Some('\'') => {
                            self.i += 1;
                            self.ansi_c(&mut text);
                        }
                        Some('(') => {
                            text.push('$');
                            self.balanced('(', ')', &mut text);
                        }
                        Some('{') => {
                            text.push('$');
                            self.balanced('{', '}', &mut text);
                        }
                        _ => text.push('$'),
                    }
                }
                '`' => {
                    text.push('`');
                    self.i += 1;
                    while let Some(c) = self.peek(0) {
                        self.i += 1;
                        text.push(c);
                        if c == '`' {
                            break;
                        }
                    }
                }
                '*' | '?' | '[' => {
                    glob = true;
                    text.push(c);
                    self.i += 1;
                }
                _ => {
                    text.push(c);
                    self.i += 1;
                }
            }
        }
        Word { text, glob }
    }

    /// Copy a balanced `(...)` or `{...}` group verbatim into the word.
    fn balanced(&mut self, open: char, close: char, text: &mut String) {
        let mut depth = 0usize;
        let mut quote: Option<char> = None;
        while let Some(c) = self.peek(0) {
            self.i += 1;
            text.push(c);
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '\'' || c == '"' => quote = Some(c),
                None if c == open => depth += 1,
                None if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return;
                    }
                }
                None => {}
            }
        }
    }

    /// The body of `$'...'` with the common escapes.
    fn ansi_c(&mut self, text: &mut String) {
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '\'' => return,
                '\\' => {
                    let n = self.peek(0);
                    self.i += 1;
                    match n {
                        Some('n') => text.push('\n'),
                        Some('t') => text.push('\t'),
                        Some(o) => text.push(o),
                        None => {}
                    }
                }
                _ => text.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<Vec<String>> {
        split_commands(line)
            .into_iter()
            .map(|c| c.words.into_iter().map(|w| w.text).collect())
            .collect()
    }

    #[test]
    fn splits_on_operators_and_newlines() {
        assert_eq!(
            words("cd src && cat a.go | head -n 5; ls || echo x & wc -l b\nnl c"),
            vec![
                vec!["cd", "src"],
                vec!["cat", "a.go"],
                vec!["head", "-n", "5"],
                vec!["ls"],
                vec!["echo", "x"],
                vec!["wc", "-l", "b"],
                vec!["nl", "c"],
            ]
        );
        assert_eq!(
            words("(cd x; cat y) && { cat z; }"),
            vec![vec!["cd", "x"], vec!["cat", "y"], vec!["cat", "z"],]
        );
    }

    #[test]
    fn quoting_and_escapes() {
        assert_eq!(
            words(r#"grep -rn "a; b" 'c && d' e\ f "x\"y" $'t\tu'"#),
            vec![vec!["grep", "-rn", "a; b", "c && d", "e f", "x\"y", "t\tu"]]
        );
        assert_eq!(
            words("echo $(cat a; cat b) `x;y`"),
            vec![vec!["echo", "$(cat a; cat b)", "`x;y`"]]
        );
        assert_eq!(
            words("cat a # cat b\ncat c"),
            vec![vec!["cat", "a"], vec!["cat", "c"]]
        );
        let c = &split_commands("cat src/*.go '*.rs'")[0];
        assert!(c.words[1].glob && !c.words[2].glob);
    }

    #[test]
    fn redirections() {
        let c = &split_commands("cat a > out 2>&1")[0];
        assert_eq!(c.words.len(), 2);
        assert_eq!(c.redirects.len(), 2);
        assert!(c.stdout_to_file());
        assert!(split_commands("cat a >/dev/null")[0].stdout_to_file());
        assert!(!split_commands("cat a 2>/dev/null")[0].stdout_to_file());
        assert!(!split_commands("cat a >&2")[0].stdout_to_file());
        assert!(split_commands("cat a &> log")[0].stdout_to_file());
        assert!(!split_commands("cat a < in")[0].stdout_to_file());
    }

    #[test]
    fn heredoc_bodies_are_skipped() {
        let line = "cat > new.py <<'EOF'\ncat secret.go\nprint(1)\nEOF\nhead other.go\npython - <<-END\n\tcat x\n\tEND\ntail y";
        assert_eq!(
            words(line),
            vec![
                vec!["cat"],
                vec!["head", "other.go"],
                vec!["python", "-"],
                vec!["tail", "y"]
            ]
        );
    }
}
