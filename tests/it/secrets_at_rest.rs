//! Secrets at rest (issue 15, item 4): the secret key is named by a fingerprint in the database,
//! so a missing, wrong or different key is refused at start and never silently replaced; the key
//! and the SQLite files are private (0600); `/healthz` reports a database that cannot write.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use plinth::config::{Overrides, RawConfig};

use crate::support::{self, config, write_key, Backend, TestDb, TestServer};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

/// A config with the key in the data directory (the embedded default) and SQLite there too.
fn data_dir_config(dir: &Path) -> plinth::config::Config {
    let toml = format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"127.0.0.1:0\"\n",
        dir.join("data").display()
    );
    RawConfig::parse(&toml)
        .expect("config")
        .validate(&Overrides::default())
        .expect("valid config")
}

async fn refused(cfg: &plinth::config::Config) -> String {
    match plinth::app::spawn(cfg).await {
        Ok(r) => {
            r.stop().await.expect("stop");
            panic!("the server started");
        }
        Err(e) => format!("{e:#}"),
    }
}

/// SQLite with the key in the data directory: created 0600 beside a 0600 database; once the
/// database records its fingerprint, a missing key is refused (and not made anew), a different
/// key is refused, and a key file others may read is refused with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_wrong_or_loose_key_is_refused_never_replaced() {
    if std::env::var_os(plinth::config::SECRET_KEY_ENV).is_some() {
        return; // the variable would win over the key file under test
    }
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = data_dir_config(dir.path());
    let data = dir.path().join("data");
    let key = data.join("secret.key");
    let running = plinth::app::spawn(&cfg).await.expect("first start");
    // The write-ahead log and shared memory exist while the server runs.
    reqwest::get(format!("http://{}/healthz", running.http_addr))
        .await
        .expect("healthz");
    for f in ["plinth.db", "plinth.db-wal", "plinth.db-shm", "secret.key"] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
    running.stop().await.expect("stop");
    let original = std::fs::read_to_string(&key).expect("key");

    std::fs::remove_file(&key).expect("rm key");
    let err = refused(&cfg).await;
    assert!(
        err.contains("no secret key at") && err.contains("restore that key file"),
        "{err}"
    );
    assert!(!key.exists(), "a new key was made over sealed data");

    write_key(&key);
    let err = refused(&cfg).await;
    assert!(
        err.contains("is not the key this database's secrets are sealed with"),
        "{err}"
    );

    std::fs::write(&key, &original).expect("restore");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = refused(&cfg).await;
    assert!(
        err.contains("mode 0644") && err.contains(&format!("chmod 600 {}", key.display())),
        "{err}"
    );

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let running = plinth::app::spawn(&cfg)
        .await
        .expect("the original key starts");
    running.stop().await.expect("stop");
}

/// A SQLite file made by hand (or an older Plinth) readable by others is made private on open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loose_database_file_is_made_private() {
    let db = TestDb::new(Backend::Sqlite).await;
    let file = db.dir.path().join("plinth.db");
    std::fs::write(&file, b"").expect("empty db");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let cfg = config(&db, "");
    let running = plinth::app::spawn(&cfg).await.expect("starts");
    assert_eq!(mode(&file), 0o600);
    running.stop().await.expect("stop");
}

/// Two instances on one PostgreSQL database with different keys: the second is refused, as is a
/// key given by file for a database whose fingerprint names another key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_sharing_postgres_must_share_the_key() {
    let db = TestDb::new(Backend::Postgres).await;
    let first = config(&db, "");
    let running = plinth::app::spawn(&first).await.expect("first instance");
    let other_dir = tempfile::tempdir().expect("tmp");
    let other_key = other_dir.path().join("other.key");
    write_key(&other_key);
    let toml = format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"127.0.0.1:0\"\n[secrets]\nkey_file = \"{}\"\n",
        other_dir.path().display(),
        other_key.display()
    );
    let second = RawConfig::parse(&toml)
        .expect("config")
        .validate(&Overrides {
            database_url: Some(db.url.clone()),
            ..Default::default()
        })
        .expect("valid");
    let err = refused(&second).await;
    assert!(
        err.contains("every instance sharing a database must use the same key")
            && err.contains(&other_key.display().to_string()),
        "{err}"
    );
    // The same key on a second instance is fine.
    let again = plinth::app::spawn(&first).await.expect("same key");
    again.stop().await.expect("stop");
    running.stop().await.expect("stop");
    db.drop_db().await;
}

/// Ask `/healthz` until it answers `want` (bounded).
async fn healthz_until(s: &TestServer, want: u16) -> String {
    let mut last = String::new();
    for _ in 0..60 {
        let r = s
            .client
            .get(s.url("/healthz"))
            .send()
            .await
            .expect("healthz");
        let status = r.status().as_u16();
        last = format!("{status} {}", r.text().await.unwrap_or_default());
        if status == want {
            return last;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    panic!("/healthz never answered {want}: last {last}");
}

/// `/healthz` is 503 "database cannot write" while another connection holds the database's write
/// lock (reads still work), and 200 again once it lets go.
async fn healthz_reports_a_database_that_cannot_write(b: Backend) {
    let s = TestServer::start(b).await;
    healthz_until(&s, 200).await;
    match b {
        Backend::Sqlite => {
            use sqlx::Connection as _;
            let mut c = sqlx::SqliteConnection::connect(&s.db.url)
                .await
                .expect("conn");
            sqlx::query("BEGIN EXCLUSIVE")
                .execute(&mut c)
                .await
                .expect("lock");
            let body = healthz_until(&s, 503).await;
            assert!(body.contains("database cannot write"), "{body}");
            sqlx::query("ROLLBACK")
                .execute(&mut c)
                .await
                .expect("unlock");
        }
        Backend::Postgres => {
            use sqlx::Connection as _;
            let mut c = sqlx::PgConnection::connect(&s.db.url).await.expect("conn");
            sqlx::query("BEGIN").execute(&mut c).await.expect("begin");
            sqlx::query("LOCK TABLE heartbeats IN ACCESS EXCLUSIVE MODE")
                .execute(&mut c)
                .await
                .expect("lock");
            let body = healthz_until(&s, 503).await;
            assert!(body.contains("database cannot write"), "{body}");
            sqlx::query("ROLLBACK")
                .execute(&mut c)
                .await
                .expect("unlock");
        }
    }
    healthz_until(&s, 200).await;
    s.finish().await;
}

both_backends!(healthz_reports_a_database_that_cannot_write);

/// `plinth` with `config`, stdout and stderr (and whether it succeeded).
fn plinth(config: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_plinth"))
        .env_remove("PLINTH_SECRET_KEY")
        .env_remove("PLINTH_DATABASE_URL")
        .env_remove("PLINTH_CONFIG")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("plinth runs");
    (
        out.status.success(),
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// An inventory whose machine patch carries a WireGuard private key and a registry password.
fn inventory_with_patch_secrets(dir: &Path, wg_key: &str, password: &str) {
    let inv = dir.join("inv");
    std::fs::create_dir_all(&inv).expect("mkdir");
    let secrets = dir.join("lab-secrets.yaml");
    if !secrets.exists() {
        std::fs::write(
            &secrets,
            plinth::talos::secrets::SecretsBundle::generate()
                .expect("bundle")
                .to_yaml()
                .expect("yaml"),
        )
        .expect("secrets");
    }
    std::fs::write(
        inv.join("all.yaml"),
        format!(
            r#"kind: Cluster
name: lab
endpoint: https://10.88.0.10:6443
talosVersion: v1.12.11
secrets: {secrets}
---
kind: Profile
name: vm
installDisk:
  type: ssd
---
kind: Machine
hostname: node-1
role: worker
cluster: lab
profile: vm
interfaces:
  - mac: "52:54:00:aa:cc:01"
    boot: true
disks:
  - serial: QM00001
    type: ssd
    size_bytes: 21474836480
patches:
  - machine:
      network:
        interfaces:
          - interface: wg0
            addresses:
              - 10.99.0.2/24
            wireguard:
              privateKey: {wg_key}
              listenPort: 51820
      registries:
        config:
          registry.example.com:
            auth:
              username: puller
              password: {password}
"#,
            secrets = secrets.display()
        ),
    )
    .expect("inventory");
}

/// Every file of the SQLite database (main file and write-ahead log), as bytes.
fn database_bytes(data: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for f in ["plinth.db", "plinth.db-wal"] {
        if let Ok(b) = std::fs::read(data.join(f)) {
            all.extend(b);
        }
    }
    all
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Secrets inside patches (a WireGuard `privateKey`, a registry `password`) never show in
/// `apply --dry-run` (the rendered diffs redact them) and are sealed in the database like the
/// cluster's secrets: neither the database file nor its log holds them in the clear.
#[test]
fn secrets_in_patches_are_sealed_and_redacted() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let key = dir.path().join("plinth.key");
    write_key(&key);
    let config = dir.path().join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[secrets]\nkey_file = \"{}\"\n[talos]\nschema_dir = \"{}\"\n",
            data.display(),
            key.display(),
            crate::talos_configs::schemas().display()
        ),
    )
    .expect("config");
    let wg = base64::engine::general_purpose::STANDARD.encode([0x5au8; 32]);
    let (pw1, pw2) = ("Reg1stryPassw0rdOne", "Reg1stryPassw0rdTwo");
    inventory_with_patch_secrets(dir.path(), &wg, pw1);
    let inv = dir.path().join("inv");
    let inv_s = inv.to_str().expect("utf-8");
    let (ok, out) = plinth(&config, &["migrate"]);
    assert!(ok, "{out}");

    let (ok, out) = plinth(&config, &["apply", inv_s, "--dry-run", "--diff"]);
    assert!(ok, "{out}");
    assert!(out.contains("create    Machine node-1"), "{out}");
    assert!(out.contains("privateKey: <redacted sha256:"), "{out}");
    assert!(out.contains("password: <redacted sha256:"), "{out}");
    for secret in [wg.as_str(), pw1] {
        assert!(!out.contains(secret), "dry run shows {secret}:\n{out}");
    }

    let (ok, out) = plinth(&config, &["apply", inv_s]);
    assert!(ok, "{out}");
    assert!(!out.contains(pw1) && !out.contains(&wg), "{out}");
    let db = database_bytes(&data);
    for secret in [wg.as_str(), pw1] {
        assert!(
            !contains(&db, secret),
            "the database holds {secret} in the clear"
        );
    }

    // A changed password: the plan shows the line changed, not the passwords.
    inventory_with_patch_secrets(dir.path(), &wg, pw2);
    let (ok, out) = plinth(&config, &["apply", inv_s, "--dry-run", "--diff"]);
    assert!(ok, "{out}");
    assert!(out.contains("update    Machine node-1"), "{out}");
    assert!(out.contains("password: <redacted sha256:"), "{out}");
    for secret in [wg.as_str(), pw1, pw2] {
        assert!(!out.contains(secret), "dry run shows {secret}:\n{out}");
    }
    // The stored (sealed) patch still renders: an unchanged apply is unchanged.
    inventory_with_patch_secrets(dir.path(), &wg, pw1);
    let (ok, out) = plinth(&config, &["apply", inv_s, "--dry-run", "--diff"]);
    assert!(ok, "{out}");
    assert!(out.contains("unchanged Machine node-1"), "{out}");
}
