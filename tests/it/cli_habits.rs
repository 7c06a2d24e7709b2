//! The command line's habits, through the real binary against a running server: `--json` errors,
//! tables that fit the terminal (`--wide` for every column), `--server HOST:PORT`, look-up by
//! IPv4, `machine timeline` and `machine status`, shell completion, help that documents only
//! what exists, and `cluster init` into a directory that does not exist yet.

use serde_json::Value;

use crate::cli::{plinth, serve};

/// Display width of a line (the table borders are one column each).
fn width(line: &str) -> usize {
    line.chars().count()
}

#[test]
fn machine_commands_habits() {
    let dir = tempfile::tempdir().expect("tmp");
    let server = serve(dir.path(), &[], &[]);
    let (code, token, err) = plinth(dir.path(), &["token", "create", "--role", "operator"], &[]);
    assert_eq!(code, 0, "{err}");
    // HOST:PORT without a scheme.
    let host_port = server
        .base
        .strip_prefix("http://")
        .expect("http base")
        .to_string();
    let env = [
        ("PLINTH_SERVER", host_port.clone()),
        ("PLINTH_TOKEN", token.trim().to_string()),
    ];
    let long_name = "a-rather-long-host-name-for-a-worker-in-rack-twelve";
    let (code, out, err) = plinth(
        dir.path(),
        &[
            "machine",
            "add",
            "--hostname",
            long_name,
            "--mac",
            "52:54:00:41:00:01",
            "--ip",
            "10.20.2.15",
            "--serial",
            "SERIAL-0123456789",
            "--asset-tag",
            "ASSET-0123456789",
            "--uuid",
            "4c4c4544-0042-3510-8052-b3c04f4e3132",
            "--role",
            "worker",
            "--rack",
            "r12",
            "--unit",
            "9",
            "--json",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let m: Value = serde_json::from_str(&out).expect("json");
    let id = m["id"].as_str().expect("id").to_string();
    let (code, _, err) = plinth(
        dir.path(),
        &["machine", "list", "--server", &host_port],
        &env,
    );
    assert_eq!(code, 0, "--server HOST:PORT works: {err}");
    assert!(!err.contains("relative URL"), "{err}");

    // Look-up by IPv4.
    let (code, out, err) = plinth(dir.path(), &["machine", "show", "10.20.2.15"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(long_name), "{out}");

    // Tables fit COLUMNS when stdout is not a terminal; host name first, no UUID.
    for columns in ["80", "60"] {
        let mut env_c = env.to_vec();
        env_c.push(("COLUMNS", columns.to_string()));
        let (code, out, err) = plinth(dir.path(), &["machine", "list"], &env_c);
        assert_eq!(code, 0, "{err}");
        let limit: usize = columns.parse().expect("n");
        for line in out.lines() {
            assert!(width(line) <= limit, "wider than {limit}: {line:?}\n{out}");
        }
        let header = out.lines().nth(1).expect("header");
        assert!(
            header
                .trim_start_matches(['│', ' '])
                .starts_with("HOSTNAME"),
            "{header:?}"
        );
        assert!(!out.contains(&id[..8]), "no id without --wide: {out}");
        let (_, show, _) = plinth(dir.path(), &["machine", "show", long_name], &env_c);
        for line in show.lines() {
            assert!(width(line) <= limit, "show wider than {limit}: {line:?}");
        }
    }
    // Without COLUMNS, the default is 100.
    let (_, out, _) = plinth(dir.path(), &["machine", "list"], &env);
    assert!(out.lines().all(|l| width(l) <= 100), "{out}");
    // --wide: every column, the id and SMBIOS UUID too, one row per machine.
    let mut env_c = env.to_vec();
    env_c.push(("COLUMNS", "60".into()));
    let (code, out, _) = plinth(dir.path(), &["machine", "list", "--wide"], &env_c);
    assert_eq!(code, 0);
    for want in [
        id.as_str(),
        "4c4c4544-0042-3510-8052-b3c04f4e3132",
        "SERIAL-0123456789",
        "ASSET-0123456789",
        long_name,
    ] {
        assert!(out.contains(want), "--wide shows {want}: {out}");
    }

    // --json errors: one object on stderr with the API's error and its status, exit 1.
    let (code, out, err) = plinth(dir.path(), &["machine", "show", "nosuch", "--json"], &env);
    assert_eq!(code, 1);
    assert!(out.is_empty(), "{out}");
    let e: Value = serde_json::from_str(err.trim()).expect("stderr is one JSON object");
    assert_eq!(e["error"]["status"], 404, "{e}");
    assert!(e["error"]["message"].is_string(), "{e}");
    // A usage error under --json too.
    let (code, _, err) = plinth(dir.path(), &["machine", "list", "--bogus", "--json"], &env);
    assert_eq!(code, 2);
    let e: Value = serde_json::from_str(err.trim()).expect("usage error is JSON");
    assert_eq!(e["error"]["code"], "usage", "{e}");
    // A client-side error under --json.
    let (code, _, err) = plinth(
        dir.path(),
        &["machine", "list", "--server", "http://", "--json"],
        &env,
    );
    assert_eq!(code, 1);
    let e: Value = serde_json::from_str(err.trim()).expect("client error is JSON");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--server")),
        "{e}"
    );

    // A boot step, then the timeline and the status.
    let r = reqwest::blocking::get(format!(
        "{}/boot/machine.ipxe?mac=52:54:00:41:00:01",
        server.base
    ))
    .expect("boot script");
    assert!(r.status().is_success());
    let (code, _, err) = plinth(
        dir.path(),
        &["machine", "state", long_name, "maintenance"],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = plinth(dir.path(), &["machine", "timeline", long_name], &env);
    assert_eq!(code, 0, "{err}");
    let script = out.find("boot.script").expect("boot step on the timeline");
    let state = out
        .find("machine.state")
        .expect("state change on the timeline");
    assert!(script < state, "oldest first: {out}");
    let (code, out, _) = plinth(
        dir.path(),
        &["machine", "timeline", "10.20.2.15", "--json"],
        &env,
    );
    assert_eq!(code, 0);
    let steps: Value = serde_json::from_str(&out).expect("json");
    assert!(steps.as_array().is_some_and(|s| s.len() >= 2), "{steps}");

    let (code, out, err) = plinth(
        dir.path(),
        &["machine", "status", long_name, "--json"],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let st: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(st["state"], "maintenance", "{st}");
    assert_eq!(st["last_boot_step"]["kind"], "boot.script", "{st}");
    assert!(st["last_dhcp"].is_null(), "{st}");
    assert!(st["reinstall"].is_null(), "{st}");
    let (code, out, _) = plinth(dir.path(), &["machine", "status", long_name], &env);
    assert_eq!(code, 0);
    for want in [
        "state",
        "maintenance",
        "last boot step",
        "boot.script",
        "last DHCP",
        "none seen",
        "window",
    ] {
        assert!(out.contains(want), "status shows {want}: {out}");
    }
}

#[test]
fn completion_help_and_cluster_init() {
    let dir = tempfile::tempdir().expect("tmp");
    // bash: the script loads and registers the completion.
    let (code, script, err) = plinth(dir.path(), &["completion", "bash"], &[]);
    assert_eq!(code, 0, "{err}");
    let file = dir.path().join("plinth.bash");
    std::fs::write(&file, &script).expect("write");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p plinth", file.display()))
        .output()
        .expect("bash");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("plinth"),
        "{out:?}"
    );
    let (code, script, _) = plinth(dir.path(), &["completion", "zsh"], &[]);
    assert_eq!(code, 0);
    assert!(
        script.starts_with("#compdef plinth"),
        "{}",
        &script[..60.min(script.len())]
    );
    let (code, script, _) = plinth(dir.path(), &["completion", "fish"], &[]);
    assert_eq!(code, 0);
    assert!(script.contains("complete -c plinth"), "fish script");
    assert!(script.contains("timeline"), "every command is completed");

    // `config` says what it does in a whole sentence.
    let (_, help, _) = plinth(dir.path(), &["--help"], &[]);
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with("config "))
        .expect("config in help");
    assert!(line.trim_end().ends_with("in the database"), "{line}");
    // `machine events --help` documents exactly the options it has.
    let (_, help, _) = plinth(dir.path(), &["machine", "events", "--help"], &[]);
    let mut options: Vec<&str> = help
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("--")))
        .collect();
    options.sort_unstable();
    assert_eq!(
        options,
        ["--follow", "--help", "--json", "--kind", "--server", "--token"],
        "{help}"
    );
    assert!(!help.contains("--all"), "{help}");

    // `cluster init` into a directory that does not exist: created, owner only.
    let out = dir.path().join("secrets/prod/bundle.yaml");
    let args = [
        "cluster",
        "init",
        "prod",
        "--endpoint",
        "https://10.0.0.10:6443",
        "--out",
        out.to_str().expect("p"),
    ];
    let (code, _, err) = plinth(dir.path(), &args, &[]);
    assert_eq!(code, 0, "{err}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&out), 0o600);
        assert_eq!(mode(&dir.path().join("secrets")), 0o700);
        assert_eq!(mode(&dir.path().join("secrets/prod")), 0o700);
    }
    let (code, _, err) = plinth(dir.path(), &args, &[]);
    assert_eq!(code, 1);
    assert!(err.contains("exists already"), "{err}");
}
