//! How the `plinth` binary finds its database, run as an operator runs it: from another
//! directory than the server's, through `PLINTH_CONFIG` (empty counting as unset) and the flags;
//! a command that only reads creates nothing and says where it looked; `migrate` on PostgreSQL
//! needs no secret key.

use std::path::Path;

use serde_json::Value;

use crate::cli::{plinth, serve};
use crate::support::{Backend, TestDb};

/// Every file and directory under `dir`, for "nothing was created" checks.
fn entries(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

#[test]
fn commands_from_another_directory_use_the_servers_database() {
    let server_dir = tempfile::tempdir().expect("tmp");
    let elsewhere = tempfile::tempdir().expect("tmp");
    // The server on its embedded default: ./plinth-data in its own directory.
    let server = serve(server_dir.path(), &[], &[]);
    let data = server_dir.path().join("plinth-data");
    let db_file = std::path::absolute(data.join("plinth.db")).expect("abs");
    let settings = server_dir.path().join("plinth.toml");
    std::fs::write(&settings, format!("data_dir = \"{}\"\n", data.display())).expect("toml");
    let settings_s = settings.to_str().expect("utf-8").to_string();

    // A read-only command from another directory with nothing to point it: refused, naming the
    // path it looked at and how to point elsewhere; nothing created there.
    for args in [
        &["token", "list"][..],
        &["config", "render", "w1"],
        &["config", "diff", "w1"],
        &["image", "list"],
    ] {
        let (code, out, err) = plinth(elsewhere.path(), args, &[]);
        assert_ne!(code, 0, "{args:?}: {out}");
        let looked = std::path::absolute(elsewhere.path().join("plinth-data")).expect("abs");
        assert!(
            err.contains(&looked.display().to_string())
                && err.contains("created nothing")
                && err.contains("--config")
                && err.contains("PLINTH_CONFIG"),
            "{args:?}: {err}"
        );
        assert!(
            entries(elsewhere.path()).is_empty(),
            "{args:?} created {:?}",
            entries(elsewhere.path())
        );
    }
    // Under --json the refusal is one JSON object on stderr.
    let (code, _, err) = plinth(elsewhere.path(), &["token", "list", "--json"], &[]);
    assert_eq!(code, 1);
    let e: Value = serde_json::from_str(err.trim()).expect("stderr is JSON");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no database at")),
        "{e}"
    );

    // PLINTH_CONFIG from another directory: the server's database, named on stderr.
    let env = [("PLINTH_CONFIG", settings_s.clone())];
    let (code, token, err) = plinth(
        elsewhere.path(),
        &["token", "create", "--role", "viewer", "--name", "remote"],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("database SQLite {}", db_file.display()))
            && err.contains(&format!("PLINTH_CONFIG={settings_s}")),
        "{err}"
    );
    assert!(entries(elsewhere.path()).is_empty(), "nothing created here");
    // The token is the server's: it is accepted.
    let status = reqwest::blocking::Client::new()
        .get(format!("{}/api/v1/machines", server.base))
        .bearer_auth(token.trim())
        .send()
        .expect("request")
        .status();
    assert_eq!(status, 200, "the token was minted in the server's database");

    // An empty PLINTH_CONFIG counts as unset: with --config it is that file, without it the
    // embedded default of the current directory (the server's).
    let empty = [("PLINTH_CONFIG", String::new())];
    let (code, out, err) = plinth(
        elsewhere.path(),
        &["token", "list", "--config", &settings_s],
        &empty,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("remote"), "{out}");
    let (code, out, err) = plinth(server_dir.path(), &["token", "list", "--json"], &empty);
    assert_eq!(code, 0, "{err}");
    let list: Value = serde_json::from_str(&out).expect("json");
    assert!(
        list.as_array()
            .is_some_and(|l| l.iter().any(|t| t["name"] == "remote")),
        "{list}"
    );
    let (code, _, err) = plinth(
        server_dir.path(),
        &["--config", &settings_s, "migrate"],
        &[
            ("PLINTH_CONFIG", String::new()),
            ("PLINTH_DATABASE_URL", String::new()),
        ],
    );
    assert_eq!(
        code, 0,
        "an empty PLINTH_DATABASE_URL counts as unset too: {err}"
    );

    // A settings file that does not exist is said so, not silently replaced by the defaults.
    let (code, _, err) = plinth(
        elsewhere.path(),
        &["token", "list"],
        &[("PLINTH_CONFIG", "/nonexistent/plinth.toml".into())],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("/nonexistent/plinth.toml") && err.contains("does not exist"),
        "{err}"
    );
    assert!(entries(elsewhere.path()).is_empty());

    // A command that writes, pointed nowhere, creates its database where it says it does.
    let (code, _, err) = plinth(
        elsewhere.path(),
        &["token", "create", "--role", "admin"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("did not exist and was created now") && err.contains("--config"),
        "{err}"
    );
}

#[test]
fn empty_plinth_config_is_unset_for_every_command() {
    // The container image sets `ENV PLINTH_CONFIG=""`: clap used to refuse every command with
    // "a value is required for '--config'".
    let dir = tempfile::tempdir().expect("tmp");
    let empty = [("PLINTH_CONFIG", String::new())];
    for args in [&["secret-key"][..], &["--help"], &["migrate"]] {
        let (code, _, err) = plinth(dir.path(), args, &empty);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(!err.contains("a value is required"), "{err}");
    }
    let file = dir.path().join("plinth.toml");
    std::fs::write(&file, "data_dir = \"d\"\n").expect("toml");
    let (code, _, err) = plinth(
        dir.path(),
        &["migrate", "--config", file.to_str().expect("p")],
        &empty,
    );
    assert_eq!(code, 0, "{err}");
    assert!(dir.path().join("d/plinth.db").exists(), "{err}");
}

#[test]
fn migrate_on_postgres_needs_no_secret_key() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let db = rt.block_on(TestDb::new(Backend::Postgres));
    let dir = tempfile::tempdir().expect("tmp");
    let (code, _, err) = plinth(dir.path(), &["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("migrations applied to"), "{err}");
    // Tokens need no key either.
    let (code, token, err) = plinth(
        dir.path(),
        &[
            "token",
            "create",
            "--role",
            "admin",
            "--database-url",
            &db.url,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(token.trim().starts_with("plinth_"));
    // The server does: refused before anything is opened, naming the key to set.
    let (code, _, err) = plinth(
        dir.path(),
        &["serve", "--http", "127.0.0.1:0", "--database-url", &db.url],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("`secrets.key_file`"), "{err}");
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
    rt.block_on(db.drop_db());
}
