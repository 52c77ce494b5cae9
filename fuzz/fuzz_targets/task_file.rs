//! A task directory whose `task.toml` is arbitrary bytes (beside a valid instruction and
//! tests): loaded or refused with an error, never a panic.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch("task_file").join("task");
    if !dir.join("tests").is_dir() {
        std::fs::create_dir_all(dir.join("tests")).expect("task directory");
        std::fs::write(dir.join("instruction.md"), "Fix it.\n").expect("instruction");
        std::fs::write(dir.join("tests/test.sh"), "exit 0\n").expect("tests");
    }
    std::fs::write(dir.join("task.toml"), data).expect("task.toml");
    let _ = forkd::eval::task::Task::load(&dir);
});
