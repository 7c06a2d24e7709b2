//! The README is a test (issue 16, items 7 and 8). Every command block of `README.md` (a fenced
//! block whose language is `sh`, `bash`, `shell`, `console` or none) carries a marker on the line
//! before it: `<!-- readme: run -->` or `<!-- readme: skip REASON -->` (the reason is required).
//! The runnable blocks are run in README order against a fresh `plinth serve` started on its
//! embedded default in an empty temporary directory, with the built `plinth` first on `PATH`.
//!
//! How a block runs, and the only liberties taken with its text:
//! - Everything runs in a network namespace of its own (`unshare --net`) with only loopback up,
//!   so the README's `localhost:8080` is the fresh server exactly as written, and an example
//!   address (a BMC at 10.1.0.11) can never be reached: nothing leaves the machine.
//! - `/etc/plinth` and `/var/lib/plinth` are rewritten to directories under the temporary one.
//! - Each block runs in `bash` with `set -euo pipefail`; variables it exports carry over to later
//!   blocks (the README's `export PLINTH_TOKEN=...`). `curl` gets `--fail-with-body`, so an HTTP
//!   error answer fails the block (a `curl -s` that gets a 415 would otherwise pass).
//! - A `plinth serve` line is started, must announce `serving HTTP on`, and is stopped; its
//!   `--http` is moved to `127.0.0.1:0` (the fresh server already holds 8080).
//! - The working directory holds what the README tells the reader to have: a copy of the
//!   repository's `inventory/` (paths rewritten as above) and Talos' `config.schema.json` of
//!   v1.11.6 (from `../shared`, as the README says to take it from the Talos release).
//!
//! The README's first block is checked, not run: exactly two commands, the server and the test
//! script, which exists and which `.ci/run` runs as its last line.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_plinth");
/// Fence languages that are commands to run (none counts: a block cannot dodge by omitting it).
const COMMAND_LANGS: &[&str] = &["", "sh", "bash", "shell", "console"];
/// How long all runnable blocks together may take.
const RUN_LIMIT: Duration = Duration::from_secs(300);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shared() -> PathBuf {
    std::env::var_os("PLINTH_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared"))
}

#[derive(Debug, Clone, PartialEq)]
enum Marker {
    Run,
    Skip(String),
}

#[derive(Debug)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    marker: Option<Marker>,
    text: String,
}

/// `<!-- readme: run -->` or `<!-- readme: skip REASON -->`; `Err` for a malformed marker.
fn marker(line: &str) -> Option<Result<Marker, String>> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim()
        .strip_prefix("readme:")?
        .trim();
    Some(if inner == "run" {
        Ok(Marker::Run)
    } else if let Some(reason) = inner.strip_prefix("skip") {
        let reason = reason.trim();
        if reason.is_empty() {
            Err("a skip marker needs its reason".to_string())
        } else {
            Ok(Marker::Skip(reason.to_string()))
        }
    } else {
        Err(format!("unknown marker `{inner}` (run or skip REASON)"))
    })
}

/// The fenced blocks of a Markdown text with the marker just above each, and the problems found:
/// malformed markers, markers not followed by a block.
fn blocks(md: &str) -> (Vec<Block>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut pending: Option<(usize, Marker)> = None;
    let mut lines = md.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let n = i + 1;
        if let Some(fence) = line.strip_prefix("```") {
            let lang = fence.trim().to_string();
            let mut text = String::new();
            let mut closed = false;
            for (_, l) in lines.by_ref() {
                if l.trim_end() == "```" {
                    closed = true;
                    break;
                }
                text.push_str(l);
                text.push('\n');
            }
            if !closed {
                problems.push(format!("README.md:{n}: block never closed"));
            }
            out.push(Block {
                line: n,
                lang,
                marker: pending.take().map(|(_, m)| m),
                text,
            });
            continue;
        }
        if let Some(m) = marker(line) {
            if let Some((at, _)) = pending.take() {
                problems.push(format!("README.md:{at}: marker not followed by a block"));
            }
            match m {
                Ok(m) => pending = Some((n, m)),
                Err(e) => problems.push(format!("README.md:{n}: {e}")),
            }
        } else if !line.trim().is_empty() {
            if let Some((at, _)) = pending.take() {
                problems.push(format!(
                    "README.md:{at}: marker not directly above a block (line {n} is between)"
                ));
            }
        }
    }
    if let Some((at, _)) = pending {
        problems.push(format!("README.md:{at}: marker not followed by a block"));
    }
    (out, problems)
}

fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).expect("README.md")
}

#[test]
fn readme_every_command_block_is_marked() {
    let (blocks, mut problems) = blocks(&readme());
    for b in &blocks {
        if COMMAND_LANGS.contains(&b.lang.as_str()) && b.marker.is_none() {
            problems.push(format!(
                "README.md:{}: command block without `<!-- readme: run -->` or \
                 `<!-- readme: skip REASON -->` above it",
                b.line
            ));
        }
        if !COMMAND_LANGS.contains(&b.lang.as_str()) && b.marker.is_some() {
            problems.push(format!(
                "README.md:{}: a `{}` block is not a command block; drop its marker",
                b.line, b.lang
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let runnable = blocks.iter().filter(|b| b.marker == Some(Marker::Run));
    assert!(runnable.count() >= 5, "the README runs its commands");
}

/// The marker check itself finds what it must: an unmarked block, a marker without a reason, a
/// marker separated from its block.
#[test]
fn readme_marker_check_finds_unmarked_blocks() {
    let md = "# x\n\n```sh\nplinth serve\n```\n\n<!-- readme: skip -->\n```\nls\n```\n\
              <!-- readme: run -->\ntext\n```sh\nls\n```\n```toml\na = 1\n```\n";
    let (b, problems) = blocks(md);
    assert_eq!(b.len(), 4);
    assert_eq!(b[0].marker, None);
    assert!(problems
        .iter()
        .any(|p| p.contains(":7: a skip marker needs")));
    assert!(problems
        .iter()
        .any(|p| p.contains(":11: marker not directly")));
    assert_eq!(b[3].lang, "toml");
}

/// The command to run the tests: the second line of the README's first block, without comment.
fn readme_test_command(first: &Block) -> String {
    let lines: Vec<&str> = first
        .text
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "the README opens with exactly two commands (server, tests): {lines:?}"
    );
    assert!(lines[0].contains("serve"), "first the server: {}", lines[0]);
    lines[1].to_string()
}

#[test]
fn readme_opens_with_the_server_and_the_test_script() {
    let (blocks, _) = blocks(&readme());
    let first = blocks.first().expect("a block");
    let cmd = readme_test_command(first);
    // The test command is a script of the repository that installs what the tests need.
    let script = cmd.split_whitespace().next().expect("command");
    let path = repo().join(script);
    let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    use std::os::unix::fs::PermissionsExt;
    assert!(
        meta.permissions().mode() & 0o111 != 0,
        "{script} is executable"
    );
    let text = std::fs::read_to_string(&path).expect("script");
    for needed in [
        "apt-get install",
        "chromium-driver",
        "binutils",
        "redfish-venv.sh",
        "cargo nextest run",
        "pg_isready",
    ] {
        assert!(text.contains(needed), "{script} does {needed}");
    }
    // .ci/run installs, checks formatting and lints, then runs exactly the README's command.
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    let last = ci
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('#'))
        .expect("a command");
    assert_eq!(last, cmd, ".ci/run ends with the README's test command");
    assert!(ci.contains("cargo fmt --all --check"), ".ci/run checks fmt");
    assert!(
        ci.contains("cargo clippy --all-targets -- -D warnings"),
        ".ci/run runs clippy"
    );
}

/// Copy `from` into `to`, rewriting the system paths in text files as the blocks are rewritten.
fn copy_tree(from: &Path, to: &Path, rewrite: &dyn Fn(&str) -> String) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir").flatten() {
        let p = e.path();
        let t = to.join(e.file_name());
        if p.is_dir() {
            copy_tree(&p, &t, rewrite);
        } else {
            let text = std::fs::read_to_string(&p).expect("inventory is text");
            std::fs::write(&t, rewrite(&text)).expect("write");
        }
    }
}

/// The shell around the blocks: loopback up, the fresh server, `plinth serve` and `curl` as the
/// module documentation says, then each block with its exit status on a `@@end LINE STATUS` line.
fn runner_script(root: &Path, work: &Path, blocks: &[(usize, PathBuf)]) -> String {
    let bin_dir = Path::new(BIN).parent().expect("bin dir");
    let mut s = format!(
        r#"set -u
ROOT={root}
ip link set lo up
export PATH={bin}:$PATH HOME=$ROOT/home COLUMNS=100
unset PLINTH_CONFIG PLINTH_DATABASE_URL PLINTH_SECRET_KEY PLINTH_SERVER PLINTH_TOKEN
mkdir -p "$HOME"
cd {work}
RUST_LOG=warn plinth serve >/dev/null 2>"$ROOT/server.log" &
server=$!
echo $server > "$ROOT/server.pid"
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT TERM INT
for _ in $(seq 1 300); do
    grep -q 'serving HTTP on' "$ROOT/server.log" && break
    kill -0 $server 2>/dev/null || {{ echo '@@server died'; cat "$ROOT/server.log"; exit 1; }}
    sleep 0.1
done
grep -q 'serving HTTP on' "$ROOT/server.log" || {{ echo '@@server silent'; exit 1; }}

readme_serve_check() {{
    local args=() prev="" a has_http=0 pid
    for a in "$@"; do
        if [ "$prev" = --http ]; then a=127.0.0.1:0; has_http=1; fi
        args+=("$a"); prev=$a
    done
    [ $has_http = 1 ] || args+=(--http 127.0.0.1:0)
    command plinth serve "${{args[@]}}" >/dev/null 2>"$ROOT/serve-check.log" &
    pid=$!
    echo $pid >> "$ROOT/serve-check.pids"
    for _ in $(seq 1 300); do
        if grep -q 'serving HTTP on' "$ROOT/serve-check.log"; then
            kill $pid; wait $pid 2>/dev/null; return 0
        fi
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    cat "$ROOT/serve-check.log" >&2
    echo "plinth serve $* did not start" >&2
    return 1
}}
plinth() {{
    if [ "${{1:-}}" = serve ]; then shift; readme_serve_check "$@"; else command plinth "$@"; fi
}}
curl() {{ command curl --fail-with-body --show-error "$@"; }}
: > "$ROOT/env.sh"
"#,
        root = root.display(),
        bin = bin_dir.display(),
        work = work.display(),
    );
    for (line, file) in blocks {
        s.push_str(&format!(
            r#"echo "@@begin {line}"
( source "$ROOT/env.sh"; set -euo pipefail; source {file}; export -p > "$ROOT/env.next" ) 2>&1
rc=$?
[ $rc = 0 ] && mv "$ROOT/env.next" "$ROOT/env.sh"
printf '\n@@end {line} %s\n' $rc
[ $rc = 0 ] || exit 1
"#,
            file = file.display()
        ));
    }
    s
}

/// Kills what the runner started (its shell, the fresh server, any `plinth serve` check) by PID.
struct Runner {
    child: std::process::Child,
    root: PathBuf,
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for f in ["server.pid", "serve-check.pids"] {
            let pids = std::fs::read_to_string(self.root.join(f)).unwrap_or_default();
            for pid in pids.split_whitespace() {
                let _ = Command::new("kill")
                    .args(["-9", pid])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

#[test]
fn readme_runnable_blocks_work_against_a_fresh_server() {
    let (all, problems) = blocks(&readme());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().to_path_buf();
    let work = root.join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let etc = root.join("etc/plinth");
    let var = root.join("var/lib/plinth");
    let rewrite = |t: &str| {
        t.replace("/etc/plinth", &etc.display().to_string())
            .replace("/var/lib/plinth", &var.display().to_string())
    };
    copy_tree(&repo().join("inventory"), &work.join("inventory"), &rewrite);
    std::fs::copy(
        shared().join("talos/schemas/config.schema.v1.11.6.json"),
        work.join("config.schema.json"),
    )
    .expect("Talos schema v1.11.6 from ../shared");

    let mut files = Vec::new();
    let mut texts = std::collections::HashMap::new();
    for b in all.iter().filter(|b| b.marker == Some(Marker::Run)) {
        let file = root.join(format!("block-{}.sh", b.line));
        std::fs::write(&file, rewrite(&b.text)).expect("block");
        files.push((b.line, file));
        texts.insert(b.line, b.text.clone());
    }
    let script = root.join("runner.sh");
    std::fs::write(&script, runner_script(&root, &work, &files)).expect("script");

    let mut child = Command::new("unshare")
        .args(["--net", "bash"])
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare --net bash (util-linux, as root)");
    let (mut out, mut err) = (
        child.stdout.take().expect("stdout"),
        child.stderr.take().expect("stderr"),
    );
    let runner = Runner {
        child,
        root: root.clone(),
    };
    // Both pipes are read on threads so a chatty block cannot stall on a full pipe.
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut runner = runner;
    let start = Instant::now();
    let status = loop {
        if let Some(st) = runner.child.try_wait().expect("wait") {
            break Some(st);
        }
        if start.elapsed() > RUN_LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(runner);
    let out = t_out.join().expect("stdout thread");
    let err = t_err.join().expect("stderr thread");
    let server_log = std::fs::read_to_string(root.join("server.log")).unwrap_or_default();
    let ended: Vec<(usize, i32)> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("@@end ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    let failed = ended.iter().find(|(_, rc)| *rc != 0);
    if let Some((line, rc)) = failed {
        // The failed block's own output (stdout and stderr, in order).
        let begin = format!("@@begin {line}\n");
        let output = out.split(&begin).nth(1).unwrap_or(&out);
        panic!(
            "README.md:{line}: block failed (exit {rc}):\n{}\n--- its output\n{output}\n--- server log\n{server_log}",
            texts[line]
        );
    }
    assert!(
        status.is_some(),
        "the README blocks did not finish within {RUN_LIMIT:?}:\n{out}\n{err}"
    );
    assert_eq!(
        ended.len(),
        files.len(),
        "every runnable block ran:\n--- stdout\n{out}\n--- stderr\n{err}\n--- server log\n{server_log}"
    );
    assert!(status.is_some_and(|s| s.success()), "{out}\n{err}");
}
