//! The names a sandbox's parts share: where forkd's own files live inside every
//! sandbox, and what the set-up, the init and the relays hand each other. Below all of
//! them, so that none imports another for a name.

/// Where forkd's own files live inside every sandbox.
pub const FORKD_DIR: &str = "/.forkd";
/// The init binary, provided by the runtime layer at the top of every layer stack.
pub const INIT_PATH: &str = crate::proto::TOOL_PROGRAM;
/// The init's control socket, relative to the sandbox root.
pub const CONTROL_SOCKET: &str = ".forkd/run/init.sock";
/// Log directory inside the sandbox.
pub const LOG_DIR: &str = "/.forkd/logs";
/// The init's control socket, as the init inside the sandbox opens it.
pub const CONTROL_SOCKET_PATH: &str = "/.forkd/run/init.sock";
/// The directory of the init's socket and of kept commands' attach sockets (root only).
pub const RUN_DIR: &str = "/.forkd/run";
/// The environment variable naming the descriptor on which a fresh init tells its set-up
/// that it listens (one byte, then the descriptor is closed). The program's entry point
/// reads it and hands it to [`crate::init::init_main`].
pub const READY_FD_ENV: &str = "FORKD_READY_FD";
/// The most a set-up spec may take on the wire.
pub const SPEC_LIMIT: usize = 64 * 1024;
