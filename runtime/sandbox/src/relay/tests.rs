use super::*;

/// What reaches `init.sock` can come from inside the sandbox: a request that would
/// not pass the daemon's checks is refused with an error, never a panic.
#[test]
fn requests_the_daemon_would_refuse_are_refused_not_panicked_on() {
    let empty = ExecRequest::default();
    assert!(build_command(&empty).unwrap_err().contains("argv is empty"));
    let bad_env = ExecRequest {
        argv: vec!["/bin/true".into()],
        env: vec!["NOEQUALS".into()],
        ..Default::default()
    };
    assert!(build_command(&bad_env).unwrap_err().contains("KEY=VALUE"));
    let nul = ExecRequest {
        argv: vec!["/bin/tr\0ue".into()],
        ..Default::default()
    };
    assert!(build_command(&nul).unwrap_err().contains("NUL"));
    let ok = ExecRequest {
        argv: vec!["/bin/true".into(), "x".into()],
        env: vec!["A=b=c".into()],
        ..Default::default()
    };
    let cmd = build_command(&ok).unwrap();
    assert_eq!(cmd.get_program(), "/bin/true");
    let envs: Vec<_> = cmd.get_envs().collect();
    assert!(envs.contains(&(std::ffi::OsStr::new("A"), Some(std::ffi::OsStr::new("b=c")))));
}
