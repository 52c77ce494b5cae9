//! `forkd exec`, and the streaming client shared with foreground `forkd run`: output is
//! written as it arrives, stdin is forwarded with `-i`, and `-t` puts the local terminal
//! in raw mode and runs the command on a pseudo-terminal in the sandbox.

use super::Ctx;
use crate::api::{ExecResult, SandboxInfo};
use clap::Args;
use forkd_sandbox::proto::{self, ExecExit, ExecRequest, Kind};
use std::io::{Read, Write};

#[derive(Args, Clone)]
pub struct ExecOpts {
    /// Keep stdin open and forward it
    #[arg(short, long)]
    pub interactive: bool,
    /// Allocate a pseudo-terminal
    #[arg(short, long)]
    pub tty: bool,
    /// Set environment variables (KEY=VALUE)
    #[arg(short, long = "env")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox
    #[arg(short, long)]
    pub workdir: Option<String>,
    /// User: NAME, UID or UID:GID
    #[arg(short, long)]
    pub user: Option<String>,
    /// Kill the command's whole process tree after this many seconds (exit code 124)
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Run the words as one shell command line (sh -c)
    #[arg(long)]
    pub sh: bool,
}

#[derive(Args)]
pub struct ExecArgs {
    /// Run in the background; output goes to the sandbox log NAME (see `forkd logs`)
    #[arg(short, long)]
    pub detach: bool,
    /// Log name for a detached command
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub opts: ExecOpts,
    pub sandbox: String,
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub fn build_request(opts: &ExecOpts, command: &[String]) -> ExecRequest {
    let (argv, shell) = if opts.sh {
        (Vec::new(), Some(command.join(" ")))
    } else {
        (command.to_vec(), None)
    };
    ExecRequest {
        argv,
        shell,
        env: opts.env.clone(),
        cwd: opts.workdir.clone(),
        user: opts.user.clone(),
        timeout_ms: opts.timeout.map(|s| (s * 1000.0) as u64),
        tty: opts.tty,
        stdin: opts.interactive,
        ..Default::default()
    }
}

pub fn run(ctx: &Ctx, args: ExecArgs) -> anyhow::Result<i32> {
    let mut req = build_request(&args.opts, &args.command);
    if args.detach {
        req.detach = true;
        req.log = args.name.clone();
        let body = serde_json::to_value(&req)?;
        let r: ExecResult = ctx.client.call(
            "POST",
            &format!("/v1/sandboxes/{}/exec", args.sandbox),
            Some(&body),
        )?;
        if ctx.json {
            ctx.print_json(&r);
        } else {
            println!("{}", r.pid);
        }
        return Ok(0);
    }
    if ctx.json {
        // Collected, not streamed: one JSON document with base64 output.
        let body = serde_json::to_value(&req)?;
        let r: ExecResult = ctx.client.call(
            "POST",
            &format!("/v1/sandboxes/{}/exec", args.sandbox),
            Some(&body),
        )?;
        ctx.print_json(&r);
        return Ok(r.exit.exit_code);
    }
    let _: SandboxInfo =
        ctx.client
            .call("GET", &format!("/v1/sandboxes/{}", args.sandbox), None)?;
    stream(ctx, &args.sandbox, &req)
}

/// Runs `req` on an upgraded connection, streaming its output; returns its exit code.
pub fn stream(ctx: &Ctx, sandbox: &str, req: &ExecRequest) -> anyhow::Result<i32> {
    let mut conn = ctx.client.exec_stream(sandbox, req)?;
    let raw = if req.tty { RawTerminal::enable() } else { None };
    if req.tty {
        if let Some((rows, cols)) = terminal_size() {
            let mut b = rows.to_be_bytes().to_vec();
            b.extend_from_slice(&cols.to_be_bytes());
            proto::write_frame(&mut conn, Kind::Resize, &b)?;
        }
    }
    if req.stdin || req.tty {
        let mut w = conn.try_clone()?;
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 32 * 1024];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = proto::write_frame(&mut w, Kind::StdinEof, &[]);
                        return;
                    }
                    Ok(n) => {
                        if proto::write_frame(&mut w, Kind::Stdin, &buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let result = loop {
        match proto::read_frame(&mut conn)? {
            Some((Kind::Stdout, d)) => {
                out.write_all(&d)?;
                out.flush()?;
            }
            Some((Kind::Stderr, d)) => {
                err.write_all(&d)?;
            }
            Some((Kind::Exit, body)) => break Ok(serde_json::from_slice::<ExecExit>(&body)?),
            Some((Kind::Error, body)) => {
                break Err(anyhow::anyhow!(
                    "{}",
                    forkd_sandbox::host::error_message(&body)
                ))
            }
            Some(_) => {}
            None => {
                break Err(anyhow::anyhow!(
                    "the daemon closed the connection before the command's exit"
                ))
            }
        }
    };
    drop(raw);
    let exit = result?;
    if exit.timed_out {
        eprintln!(
            "forkd: command timed out after {:.1}s; its process tree was killed",
            exit.duration_us as f64 / 1e6
        );
        return Ok(124);
    }
    Ok(exit.exit_code)
}

fn terminal_size() -> Option<(u16, u16)> {
    let out = std::process::Command::new("stty")
        .arg("size")
        .stdin(std::process::Stdio::inherit())
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    let mut it = s.split_whitespace().filter_map(|x| x.parse().ok());
    Some((it.next()?, it.next()?))
}

/// Puts the local terminal in raw mode for the lifetime of the value.
struct RawTerminal(nix::sys::termios::Termios);

impl RawTerminal {
    fn enable() -> Option<Self> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(RawTerminal(saved))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(
            std::io::stdin(),
            nix::sys::termios::SetArg::TCSANOW,
            &self.0,
        );
    }
}
