//! A Dockerfile as a build plan: stages of steps, each step one instruction with its
//! line, in a form the builder can run without looking at the text again.
//!
//! Parsing is `parse-dockerfile`'s (continuations, the `escape` directive, JSON exec
//! forms, quoting). This module then decides what forkd builds: every instruction of
//! the Dockerfile reference is either turned into a [`StepKind`] or refused by name,
//! with its line; nothing is ignored. Words keep their `$VAR` references: they are
//! expanded when the step runs, against the ARG and ENV values in force there
//! ([`crate::words`]).

use parse_dockerfile::{Command, Flag, Instruction, JsonOrStringArray, Source};

use crate::words;

/// A refused or malformed Dockerfile, with the line it is about (1-based).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct PlanError {
    pub line: usize,
    pub message: String,
}

fn refuse<T>(line: usize, message: impl Into<String>) -> Result<T, PlanError> {
    Err(PlanError {
        line,
        message: message.into(),
    })
}

/// A command as written: shell form (run by the stage's shell) or exec form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cmd {
    Shell(String),
    Exec(Vec<String>),
}

/// `COPY` or `ADD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySpec {
    /// `ADD`: local tar archives are unpacked at the destination.
    pub add: bool,
    /// `--from=`: a stage name or index (unexpanded).
    pub from: Option<String>,
    /// `--chown=` (unexpanded).
    pub chown: Option<String>,
    /// `--chmod=` (octal, unexpanded).
    pub chmod: Option<String>,
    pub sources: Vec<String>,
    pub dest: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    Run(Cmd),
    Copy(CopySpec),
    Workdir(String),
    /// Raw `KEY=VALUE ...` (or the legacy `KEY VALUE`) text.
    Env(String),
    /// `NAME` or `NAME=default`, raw.
    Arg(String),
    User(String),
    Label(String),
    Expose(Vec<String>),
    Entrypoint(Cmd),
    Cmd(Cmd),
    Shell(Vec<String>),
    StopSignal(String),
    Volume(Vec<String>),
}

impl StepKind {
    /// True for steps that change files (and so make a layer).
    pub fn writes_files(&self) -> bool {
        matches!(
            self,
            StepKind::Run(_) | StepKind::Copy(_) | StepKind::Workdir(_)
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// 1-based line of the instruction's keyword.
    pub line: usize,
    /// The instruction as written, continuations joined (for progress and errors).
    pub text: String,
    pub kind: StepKind,
    /// `RUN --network=none`: this step runs without network even in a build that has it.
    pub no_network: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub index: usize,
    /// `AS name`, lowercased as Docker does.
    pub name: Option<String>,
    /// The `FROM` word, unexpanded (global ARGs apply to it).
    pub base: String,
    pub line: usize,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// ARGs before the first FROM: raw `NAME[=default]`, with their lines.
    pub global_args: Vec<(usize, String)>,
    pub stages: Vec<Stage>,
}

impl Plan {
    /// The stage a `FROM` or `COPY --from` names: a stage name, or an index.
    pub fn stage_named(&self, name: &str, before: usize) -> Option<usize> {
        let lower = name.to_ascii_lowercase();
        if let Some(i) = self.stages[..before]
            .iter()
            .position(|s| s.name.as_deref() == Some(lower.as_str()))
        {
            return Some(i);
        }
        match name.parse::<usize>() {
            Ok(i) if i < before => Some(i),
            _ => None,
        }
    }

    /// The index of the stage to build: `target` by name, or the last one.
    pub fn target(&self, target: Option<&str>) -> Result<usize, String> {
        match target {
            None => Ok(self.stages.len() - 1),
            Some(t) => self
                .stages
                .iter()
                .position(|s| s.name.as_deref() == Some(t.to_ascii_lowercase().as_str()))
                .ok_or_else(|| format!("no stage named {t:?} in the Dockerfile")),
        }
    }
}

struct Lines<'a> {
    text: &'a str,
}

impl Lines<'_> {
    fn line(&self, offset: usize) -> usize {
        self.text.as_bytes()[..offset.min(self.text.len())]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1
    }
    /// The instruction's text from `start` to `end`, continuations joined.
    fn text(&self, start: usize, end: usize, escape: char) -> String {
        let raw = &self.text[start..end.min(self.text.len())];
        words::join_continuations(raw, escape).trim().to_string()
    }
}

fn command(c: &Command<'_>, escape: char, line: usize) -> Result<Cmd, PlanError> {
    Ok(match c {
        Command::Exec(v) => Cmd::Exec(v.value.iter().map(|s| s.value.to_string()).collect()),
        Command::Shell(s) => Cmd::Shell(words::join_continuations(s.value, escape)),
        _ => {
            return refuse(
                line,
                "a command form this parser version added is not supported",
            )
        }
    })
}

fn flags<'f>(
    options: impl IntoIterator<Item = &'f Flag<'f>>,
    allowed: &[&str],
    what: &str,
    line: usize,
) -> Result<Vec<(String, Option<String>)>, PlanError> {
    let mut out = Vec::new();
    for f in options {
        let name = f.name.value.to_string();
        if !allowed.contains(&name.as_str()) {
            return refuse(line, format!("{what} --{name} is not supported"));
        }
        out.push((name, f.value.as_ref().map(|v| v.value.to_string())));
    }
    Ok(out)
}

fn flag(fl: &[(String, Option<String>)], name: &str) -> Option<String> {
    fl.iter()
        .rev()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.clone())
}

fn strings<const N: usize>(a: &JsonOrStringArray<'_, N>) -> Vec<String> {
    match a {
        JsonOrStringArray::Json(v) => v.value.iter().map(|s| s.value.to_string()).collect(),
        JsonOrStringArray::String(v) => v.iter().map(|s| s.value.to_string()).collect(),
    }
}

fn copy_spec<'a>(
    add: bool,
    options: &[(String, Option<String>)],
    src: &[Source<'a>],
    dest: &str,
    line: usize,
) -> Result<CopySpec, PlanError> {
    let what = if add { "ADD" } else { "COPY" };
    let mut sources = Vec::new();
    for s in src {
        match s {
            Source::Path(p) => sources.push(p.value.to_string()),
            Source::HereDoc(_) => {
                return refuse(
                    line,
                    format!("{what} from a here-document is not supported"),
                )
            }
            #[allow(unreachable_patterns)]
            _ => return refuse(line, format!("{what}: unsupported source")),
        }
    }
    Ok(CopySpec {
        add,
        from: flag(options, "from"),
        chown: flag(options, "chown"),
        chmod: flag(options, "chmod"),
        sources,
        dest: dest.to_string(),
    })
}

/// Parses a Dockerfile into a plan, refusing what forkd does not build.
pub fn plan(text: &str) -> Result<Plan, PlanError> {
    let parsed = parse_dockerfile::parse(text).map_err(|e| PlanError {
        line: e.line().max(1),
        message: format!("{e}"),
    })?;
    let escape = parsed
        .parser_directives
        .escape
        .as_ref()
        .map(|d| d.value.value)
        .unwrap_or('\\');
    let lines = Lines { text };
    let mut global_args = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    let n = parsed.instructions.len();
    for (i, ins) in parsed.instructions.iter().enumerate() {
        let span = instruction_span(ins);
        let end = parsed
            .instructions
            .get(i + 1)
            .map(|next| instruction_span(next).start)
            .unwrap_or(text.len());
        let _ = n;
        let line = lines.line(span.start);
        let text_of = || lines.text(span.start, end, escape);
        if let Instruction::From(f) = ins {
            let fl = flags(f.options.iter(), &["platform"], "FROM", line)?;
            if let Some(p) = flag(&fl, "platform") {
                if !matches!(
                    p.as_str(),
                    "linux/amd64"
                        | "linux/x86_64"
                        | "$BUILDPLATFORM"
                        | "$TARGETPLATFORM"
                        | "${BUILDPLATFORM}"
                        | "${TARGETPLATFORM}"
                ) {
                    return refuse(
                        line,
                        format!("FROM --platform={p}: only linux/amd64 is built here"),
                    );
                }
            }
            let name = f.as_.as_ref().map(|(_, n)| n.value.to_ascii_lowercase());
            if let Some(n) = &name {
                if stages.iter().any(|s| s.name.as_ref() == Some(n)) {
                    return refuse(line, format!("stage name {n:?} is used twice"));
                }
            }
            stages.push(Stage {
                index: stages.len(),
                name,
                base: f.image.value.to_string(),
                line,
                steps: Vec::new(),
            });
            continue;
        }
        let Some(stage) = stages.last_mut() else {
            match ins {
                Instruction::Arg(a) => {
                    global_args.push((line, a.arguments.value.to_string()));
                    continue;
                }
                _ => return refuse(line, "only ARG may come before the first FROM"),
            }
        };
        let mut no_network = false;
        let kind =
            match ins {
                Instruction::Run(r) => {
                    let fl = flags(r.options.iter(), &["network"], "RUN", line)?;
                    match flag(&fl, "network").as_deref() {
                        None | Some("default") => {}
                        Some("none") => no_network = true,
                        Some(net) => {
                            return refuse(
                                line,
                                format!(
                            "RUN --network={net}: a step has the build's network (default) or none"
                        ),
                            )
                        }
                    }
                    if !r.here_docs.is_empty() {
                        return refuse(line, "RUN with a here-document is not supported");
                    }
                    StepKind::Run(command(&r.arguments, escape, line)?)
                }
                Instruction::Copy(c) => {
                    let fl = flags(
                        c.options.iter(),
                        &["from", "chown", "chmod", "link"],
                        "COPY",
                        line,
                    )?;
                    StepKind::Copy(copy_spec(false, &fl, &c.src, &c.dest.value, line)?)
                }
                Instruction::Add(a) => {
                    let fl = flags(a.options.iter(), &["chown", "chmod", "link"], "ADD", line)?;
                    StepKind::Copy(copy_spec(true, &fl, &a.src, &a.dest.value, line)?)
                }
                Instruction::Workdir(w) => StepKind::Workdir(w.arguments.value.to_string()),
                Instruction::Env(e) => StepKind::Env(e.arguments.value.to_string()),
                Instruction::Arg(a) => StepKind::Arg(a.arguments.value.to_string()),
                Instruction::User(u) => StepKind::User(u.arguments.value.to_string()),
                Instruction::Label(l) => StepKind::Label(l.arguments.value.to_string()),
                Instruction::Maintainer(m) => {
                    StepKind::Label(format!("maintainer={}", words::quote(&m.name.value)))
                }
                Instruction::Expose(e) => {
                    StepKind::Expose(e.arguments.iter().map(|s| s.value.to_string()).collect())
                }
                Instruction::Entrypoint(e) => {
                    StepKind::Entrypoint(command(&e.arguments, escape, line)?)
                }
                Instruction::Cmd(c) => StepKind::Cmd(command(&c.arguments, escape, line)?),
                Instruction::Shell(s) => {
                    StepKind::Shell(s.arguments.iter().map(|s| s.value.to_string()).collect())
                }
                Instruction::Stopsignal(s) => StepKind::StopSignal(s.arguments.value.to_string()),
                Instruction::Volume(v) => StepKind::Volume(strings(&v.arguments)),
                Instruction::Healthcheck(_) => return refuse(
                    line,
                    "HEALTHCHECK is not supported: a Harbor task's healthcheck goes in task.toml",
                ),
                Instruction::Onbuild(_) => return refuse(line, "ONBUILD is not supported"),
                Instruction::From(_) => unreachable!("handled above"),
                #[allow(unreachable_patterns)]
                _ => return refuse(line, "instruction not supported"),
            };
        stage.steps.push(Step {
            line,
            text: text_of(),
            kind,
            no_network,
        });
    }
    if stages.is_empty() {
        return refuse(lines.line(text.len()), "the Dockerfile has no FROM");
    }
    Ok(Plan {
        global_args,
        stages,
    })
}

fn instruction_span(ins: &Instruction<'_>) -> std::ops::Range<usize> {
    let kw = match ins {
        Instruction::Add(i) => &i.add,
        Instruction::Arg(i) => &i.arg,
        Instruction::Cmd(i) => &i.cmd,
        Instruction::Copy(i) => &i.copy,
        Instruction::Entrypoint(i) => &i.entrypoint,
        Instruction::Env(i) => &i.env,
        Instruction::Expose(i) => &i.expose,
        Instruction::From(i) => &i.from,
        Instruction::Healthcheck(i) => &i.healthcheck,
        Instruction::Label(i) => &i.label,
        Instruction::Maintainer(i) => &i.maintainer,
        Instruction::Onbuild(i) => &i.onbuild,
        Instruction::Run(i) => &i.run,
        Instruction::Shell(i) => &i.shell,
        Instruction::Stopsignal(i) => &i.stopsignal,
        Instruction::User(i) => &i.user,
        Instruction::Volume(i) => &i.volume,
        Instruction::Workdir(i) => &i.workdir,
        #[allow(unreachable_patterns)]
        _ => unreachable!("parse-dockerfile added an instruction"),
    };
    kw.span.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# syntax=docker/dockerfile:1\nARG BASE=debian\nFROM ${BASE} AS build\nRUN echo a \\\n  # a comment\n  && echo b\nRUN [\"sh\", \"-c\", \"echo x\"]\nENV X=\"a b\" Y=2\nWORKDIR /src\nCOPY --chown=1:2 --chmod=640 a* b/ /dst/\n\nFROM debian\nCOPY --from=build /src/out /out\nUSER nobody\nCMD [\"/out\"]\n";

    #[test]
    fn stages_steps_and_lines() {
        let p = plan(FILE).unwrap();
        assert_eq!(p.global_args, vec![(2, "BASE=debian".to_string())]);
        assert_eq!(p.stages.len(), 2);
        let s0 = &p.stages[0];
        assert_eq!(
            (s0.name.as_deref(), s0.base.as_str(), s0.line),
            (Some("build"), "${BASE}", 3)
        );
        let lines: Vec<usize> = s0.steps.iter().map(|s| s.line).collect();
        assert_eq!(lines, vec![4, 7, 8, 9, 10]);
        assert_eq!(
            s0.steps[0].kind,
            StepKind::Run(Cmd::Shell("echo a   && echo b".into()))
        );
        assert_eq!(s0.steps[0].text, "RUN echo a   && echo b");
        assert_eq!(
            s0.steps[1].kind,
            StepKind::Run(Cmd::Exec(vec!["sh".into(), "-c".into(), "echo x".into()]))
        );
        let StepKind::Copy(c) = &s0.steps[4].kind else {
            panic!()
        };
        assert_eq!(c.chown.as_deref(), Some("1:2"));
        assert_eq!(c.chmod.as_deref(), Some("640"));
        assert_eq!(c.sources, vec!["a*", "b/"]);
        assert_eq!(c.dest, "/dst/");
        let StepKind::Copy(c) = &p.stages[1].steps[0].kind else {
            panic!()
        };
        assert_eq!(c.from.as_deref(), Some("build"));
        assert_eq!(p.stage_named("build", 1), Some(0));
        assert_eq!(p.stage_named("0", 1), Some(0));
        assert_eq!(p.stage_named("1", 1), None);
        assert_eq!(p.target(None), Ok(1));
        assert_eq!(p.target(Some("BUILD")), Ok(0));
        assert!(p.target(Some("nope")).is_err());
    }

    #[test]
    fn refusals_name_the_line_and_the_instruction() {
        let cases = [
            ("FROM a\nRUN x\nFOO bar\n", 3, "FOO"),
            ("FROM a\nHEALTHCHECK CMD true\n", 2, "HEALTHCHECK"),
            ("FROM a\nONBUILD RUN x\n", 2, "ONBUILD"),
            (
                "FROM a\n\nRUN --mount=type=cache,target=/x true\n",
                3,
                "--mount",
            ),
            (
                "FROM a\nRUN --network=host true\n",
                2,
                "the build's network (default) or none",
            ),
            ("FROM a\nRUN <<EOF\necho\nEOF\n", 2, "here-document"),
            ("FROM a\nCOPY --parents a /b\n", 2, "--parents"),
            ("FROM a\nADD --checksum=sha256:00 a /b\n", 2, "--checksum"),
            ("RUN x\n", 1, "FROM"),
            ("FROM a AS x\nFROM b AS X\n", 2, "twice"),
            ("FROM --platform=linux/arm64 a\n", 1, "linux/amd64"),
            ("# only a comment\n", 1, "FROM"),
        ];
        for (text, line, word) in cases {
            let e = plan(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.to_string().contains(word), "{text:?}: {e}");
        }
    }

    #[test]
    fn escape_directive_changes_the_continuation() {
        let p = plan("# escape=`\nFROM a\nRUN echo a `\n  b\n").unwrap();
        assert_eq!(
            p.stages[0].steps[0].kind,
            StepKind::Run(Cmd::Shell("echo a   b".into()))
        );
    }
}
