//! Times `tree_hash` and `LayerStore::import_dir` on a directory.
//!
//! ```text
//! cargo run --release -p forkd-layers --example layer_timing -- DIR [STATE_DIR]
//! ```
//! Without STATE_DIR only the hash is timed. The import goes into
//! `STATE_DIR/layers` and is removed afterwards.

use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let mut args = std::env::args_os().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: layer_timing DIR [STATE_DIR]");
        std::process::exit(2);
    };
    let t = Instant::now();
    let h =
        forkd_layers::tree_hash(&dir).unwrap_or_else(|e| panic!("hashing {}: {e}", dir.display()));
    println!("tree_hash {} = {h} in {:.2?}", dir.display(), t.elapsed());
    let t = Instant::now();
    let h2 = forkd_layers::tree_hash(&dir).unwrap();
    assert_eq!(h, h2);
    println!("tree_hash again (warm cache) in {:.2?}", t.elapsed());

    if let Some(state) = args.next().map(PathBuf::from) {
        let store = forkd_layers::LayerStore::open(&state.join("layers")).unwrap();
        let t = Instant::now();
        let id = store
            .import_dir(&dir, &mut |p| {
                if let forkd_layers::Progress::Note(n) = p {
                    println!("note: {n}");
                }
            })
            .unwrap_or_else(|e| panic!("importing {}: {e}", dir.display()));
        let info = store.info(&id).unwrap();
        println!(
            "import_dir = {id} ({} entries, {} bytes) in {:.2?}",
            info.files,
            info.size_bytes,
            t.elapsed()
        );
        store.remove(&id).unwrap();
    }
}
