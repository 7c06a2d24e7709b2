//! The `plinth` binary as a user runs it: the embedded default, config refusals, `token create`,
//! the `machine` CLI against a running server, and kill -9 in the middle of a bulk import.

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Backend, TestDb};

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

/// A server process, killed (by PID) when dropped.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) base: String,
    /// Everything the server wrote to stderr so far.
    pub(crate) log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn serve(cwd: &Path, args: &[&str], env: &[(&str, String)]) -> Server {
    serve_bin(Path::new(BIN), cwd, args, env)
}

/// `serve` with the Plinth binary at `bin` (a benchmark's release build).
pub(crate) fn serve_bin(bin: &Path, cwd: &Path, args: &[&str], env: &[(&str, String)]) -> Server {
    let mut cmd = Command::new(bin);
    cmd.current_dir(cwd)
        .args(["serve", "--http", "127.0.0.1:0"])
        .args(args)
        .env_remove("PLINTH_SECRET_KEY")
        .env_remove("PLINTH_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn plinth");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(mut l) = sink.lock() {
                l.push_str(&line);
                l.push('\n');
            }
            if let Some(rest) = line.split("serving HTTP on ").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server announces its address");
    Server { child, base, log }
}

pub(crate) fn plinth(cwd: &Path, args: &[&str], env: &[(&str, String)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(cwd)
        .args(args)
        .env_remove("PLINTH_SECRET_KEY")
        .env_remove("PLINTH_DATABASE_URL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run plinth");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn default_server_token_and_machine_cli() {
    let dir = tempfile::tempdir().expect("tmp");
    let server = serve(dir.path(), &[], &[]);
    assert!(
        dir.path().join("plinth-data/plinth.db").exists(),
        "SQLite in ./plinth-data"
    );
    let key = std::fs::metadata(dir.path().join("plinth-data/secret.key")).expect("key created");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
    }
    let (code, token, _) = plinth(
        dir.path(),
        &["token", "create", "--role", "operator", "--name", "tech"],
        &[],
    );
    assert_eq!(code, 0);
    let token = token.trim_end_matches('\n').to_string();
    assert!(
        !token.contains('\n') && token.starts_with("plinth_") && token.len() == 50,
        "only the token: {token:?}"
    );
    let env = [
        ("PLINTH_SERVER", server.base.clone()),
        ("PLINTH_TOKEN", token),
    ];

    let (code, out, err) = plinth(
        dir.path(),
        &[
            "machine",
            "add",
            "--hostname",
            "w1",
            "--mac",
            "52:54:00:40:00:01",
            "--ip",
            "10.4.0.1",
            "--role",
            "worker",
            "--rack",
            "r7",
            "--json",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let m: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(m["interfaces"][0]["ipv4"], "10.4.0.1");
    let (code, _, err) = plinth(
        dir.path(),
        &[
            "machine",
            "add",
            "--hostname",
            "w2",
            "--mac",
            "52:54:00:40:00:01",
        ],
        &env,
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("HTTP 409") && err.contains("belongs to w1"),
        "{err}"
    );

    let csv = dir.path().join("rack.csv");
    std::fs::write(
        &csv,
        "hostname,mac,rack,rack_unit\nw3,52:54:00:40:00:03,r7,3\nw4,52:54:00:40:00:04,r7,4\n",
    )
    .expect("csv");
    let (code, out, err) = plinth(
        dir.path(),
        &["machine", "import", csv.to_str().expect("path")],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("imported 2"), "{out}");

    let (code, out, _) = plinth(dir.path(), &["machine", "list", "--rack", "r7"], &env);
    assert_eq!(code, 0);
    for h in ["w1", "w3", "w4", "3 of 3 machine(s)"] {
        assert!(out.contains(h), "{h} in {out}");
    }
    let (code, out, err) = plinth(
        dir.path(),
        &[
            "machine",
            "edit",
            "52:54:00:40:00:03",
            "--set",
            "rack_unit=9",
            "--set",
            "cluster=prod",
            "--json",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let m: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (
            m["rack_unit"].as_i64(),
            m["cluster"].as_str(),
            m["version"].as_i64()
        ),
        (Some(9), Some("prod"), Some(2))
    );
    let (code, _, err) = plinth(
        dir.path(),
        &["machine", "edit", "w3", "--set", "rack_unit=99"],
        &env,
    );
    assert_eq!(code, 1);
    assert!(err.contains("rack_unit"), "{err}");
    let (code, out, _) = plinth(dir.path(), &["machine", "show", "w3"], &env);
    assert_eq!(code, 0);
    assert!(out.contains("prod"), "{out}");
    let (code, _, err) = plinth(dir.path(), &["machine", "rm", "w3"], &env);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = plinth(
        dir.path(),
        &["machine", "list", "--json", "--all", "--limit", "1"],
        &env,
    );
    assert_eq!(code, 0);
    let all: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        all.as_array().expect("arr").len(),
        2,
        "pages followed with --all"
    );
    // A viewer token cannot write.
    let (_, viewer, _) = plinth(dir.path(), &["token", "create", "--role", "viewer"], &[]);
    let env_v = [
        ("PLINTH_SERVER", server.base.clone()),
        ("PLINTH_TOKEN", viewer.trim().to_string()),
    ];
    let (code, _, err) = plinth(dir.path(), &["machine", "rm", "w4"], &env_v);
    assert_eq!(code, 1);
    assert!(err.contains("HTTP 403"), "{err}");
}

#[test]
fn bad_config_is_refused_before_binding() {
    let dir = tempfile::tempdir().expect("tmp");
    let cases = [
        ("[http]\nlistne = \"0.0.0.0:8080\"\n", "http.listne"),
        ("[http]\nlisten = \"0.0.0.0:99999\"\n", "http.listen"),
        ("[http]\nlisten = \"example.com:80\"\n", "http.listen"),
        ("[database]\nurl = \"mysql://db/plinth\"\n", "database.url"),
        ("[log]\nformat = \"xml\"\n", "log.format"),
        ("data_dir = 5\n", "data_dir"),
    ];
    for (toml, key) in cases {
        let file = dir.path().join("plinth.toml");
        std::fs::write(&file, toml).expect("write");
        let (code, _, err) = plinth(
            dir.path(),
            &["serve", "--config", file.to_str().expect("p")],
            &[],
        );
        assert_eq!(code, 1, "{toml}");
        assert!(err.contains(&format!("`{key}`")), "{toml}: {err}");
        assert!(
            !dir.path().join("plinth-data").exists(),
            "nothing created before validation: {toml}"
        );
    }
    let (code, _, err) = plinth(dir.path(), &["serve", "--http", "1.2.3.4"], &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--http") && err.contains("port is missing"),
        "{err}"
    );
}

/// Import a large CSV, kill -9 the server at several moments, restart it: every time the inventory
/// holds all of the rows or none, and the database is intact.
fn kill_during_import(backend: Backend) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let db = rt.block_on(TestDb::new(backend));
    let key = plinth::service::SecretBox::generate_key_text();
    let env = [("PLINTH_SECRET_KEY", key)];
    let data = db.dir.path().join("data");
    let data_s = data.to_str().expect("p").to_string();
    let args = [
        "--data-dir",
        data_s.as_str(),
        "--database-url",
        db.url.as_str(),
    ];
    let (code, token, err) = plinth(
        db.dir.path(),
        &[&["token", "create", "--role", "operator"][..], &args[..]].concat(),
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let token = token.trim().to_string();
    const ROWS: usize = 6000;
    let mut csv = String::from("hostname,mac,serial,rack,rack_unit,role\n");
    for i in 0..ROWS {
        csv.push_str(&format!(
            "k{i:05},52:54:01:{:02x}:{:02x}:{:02x},S{i},r{},{},worker\n",
            i >> 16,
            (i >> 8) & 255,
            i & 255,
            i % 40,
            i % 40 + 1
        ));
    }
    let count = |base: &str| -> i64 {
        let r = reqwest::blocking::Client::new()
            .get(format!("{base}/api/v1/machines?limit=1"))
            .bearer_auth(&token)
            .send()
            .expect("list");
        r.json::<Value>().expect("json")["total"]
            .as_i64()
            .expect("total")
    };
    let clear = || {
        rt.block_on(async {
            match backend {
                Backend::Sqlite => {
                    let mut c = <sqlx::SqliteConnection as sqlx::Connection>::connect(&db.url)
                        .await
                        .expect("c");
                    sqlx::query("DELETE FROM machines")
                        .execute(&mut c)
                        .await
                        .expect("clear");
                    let ok: String = sqlx::query_scalar("PRAGMA integrity_check")
                        .fetch_one(&mut c)
                        .await
                        .expect("check");
                    assert_eq!(ok, "ok");
                }
                Backend::Postgres => {
                    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
                        .await
                        .expect("c");
                    sqlx::query("DELETE FROM machines")
                        .execute(&mut c)
                        .await
                        .expect("clear");
                }
            }
        })
    };
    let send = |base: &str| {
        let body = csv.clone();
        let tok = token.clone();
        let url = format!("{base}/api/v1/machines/import");
        std::thread::spawn(move || {
            reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("client")
                .post(url)
                .bearer_auth(tok)
                .header("content-type", "text/csv")
                .body(body)
                .send()
                .map(|r| r.status().as_u16())
        })
    };
    // An uninterrupted import tells how long one takes here.
    let server = serve(db.dir.path(), &args, &env);
    let started = Instant::now();
    let status = send(&server.base)
        .join()
        .expect("join")
        .expect("import answered");
    let full = started.elapsed();
    assert_eq!(status, 200);
    assert_eq!(count(&server.base), ROWS as i64);
    drop(server);
    clear();

    let mut outcomes = Vec::new();
    for fraction in [0.2_f64, 0.5, 0.8, 0.9, 0.97, 1.05] {
        let server = serve(db.dir.path(), &args, &env);
        assert_eq!(count(&server.base), 0, "start from empty");
        let sender = send(&server.base);
        std::thread::sleep(full.mul_f64(fraction));
        let mut server = server;
        let pid = server.child.id();
        // SIGKILL by PID: no graceful shutdown, no chance to finish the transaction.
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        let _ = server.child.wait();
        let sent = sender.join().expect("join");
        drop(server);
        let server = serve(db.dir.path(), &args, &env);
        let after = count(&server.base);
        assert!(
            after == 0 || after == ROWS as i64,
            "kill at {fraction} of the import left {after} of {ROWS} rows"
        );
        outcomes.push((fraction, after, sent.ok()));
        drop(server);
        clear();
    }
    eprintln!(
        "kill -9 during import ({backend:?}, full import {full:?}): (fraction of it, rows after restart, client status) = {outcomes:?}"
    );
    assert!(
        outcomes.iter().any(|(_, n, _)| *n == 0),
        "at least one kill landed before the commit"
    );
    rt.block_on(db.drop_db());
}

#[test]
fn kill_9_during_import_sqlite() {
    kill_during_import(Backend::Sqlite);
}

#[test]
fn kill_9_during_import_postgres() {
    kill_during_import(Backend::Postgres);
}

/// `plinth machine edit --rack R --set ...` (issue 16): prints how many machines match, asks,
/// and changes nothing unless the answer is yes; `--yes` skips the question; the count is said.
#[test]
fn bulk_edit_counts_and_asks() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tmp");
    let server = serve(dir.path(), &[], &[("RUST_LOG", "info".to_string())]);
    let (_, token, _) = plinth(
        dir.path(),
        &["token", "create", "--role", "operator", "--name", "tech"],
        &[],
    );
    let env = [
        ("PLINTH_SERVER", server.base.clone()),
        ("PLINTH_TOKEN", token.trim().to_string()),
    ];
    for (host, mac, rack) in [
        ("b1", "52:54:00:50:00:01", "r21"),
        ("b2", "52:54:00:50:00:02", "r21"),
        ("b3", "52:54:00:50:00:03", "r22"),
    ] {
        let (code, _, err) = plinth(
            dir.path(),
            &[
                "machine",
                "add",
                "--hostname",
                host,
                "--mac",
                mac,
                "--rack",
                rack,
            ],
            &env,
        );
        assert_eq!(code, 0, "{err}");
    }
    let edit = |answer: &str, extra: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(dir.path())
            .args(["machine", "edit", "--rack", "r21", "--set", "rack_unit=4"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(answer.as_bytes())
            .expect("answer");
        let out = child.wait_with_output().expect("run");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let unit = |host: &str| {
        let (_, out, _) = plinth(dir.path(), &["machine", "show", host, "--json"], &env);
        serde_json::from_str::<Value>(&out).expect("json")["rack_unit"].clone()
    };
    // No: nothing changed, non-zero exit, the count was said.
    let (code, _, err) = edit("n\n", &[]);
    assert_ne!(code, 0);
    assert!(err.contains("2 machine(s) match rack=r21: b1, b2"), "{err}");
    assert!(err.contains("nothing changed"), "{err}");
    assert_eq!(unit("b1"), Value::Null);
    // Yes: both changed, the other rack's not.
    let (code, out, err) = edit("y\n", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("changed 2 of 2 machine(s) matching rack=r21"),
        "{out}"
    );
    assert_eq!(unit("b1"), 4);
    assert_eq!(unit("b2"), 4);
    assert_eq!(unit("b3"), Value::Null);
    // --yes: no question; --json says what changed.
    let (code, out, err) = edit("", &["--yes", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["matched"], 2);
    assert_eq!(v["changed"], serde_json::json!(["b1", "b2"]));
    // The server's log names the machines by host name, not only by id.
    let log = server.log.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("machine updated") && l.contains("name=b2")),
        "{log}"
    );
}
