//! The container works (issue 16, item 2), tested without Docker: the test reads `Dockerfile`
//! (its last stage's `ENV`, `USER`, `WORKDIR`, `ENTRYPOINT`, `CMD`, the `useradd` uid and the
//! `setcap` line) and `docker-compose.yml` (the plinth service's `environment`, `command`,
//! `configs` and `secrets`), and runs the built binary with exactly that environment and those
//! arguments, as the image's user, with the image's file capabilities, in a network namespace of
//! its own (so port 8080 and TFTP's 69 are the binary's alone, and 69 must be won by the
//! capability: a new namespace starts with `ip_unprivileged_port_start` 1024).
//!
//! Container paths are moved under a temporary directory (`/etc/plinth`, `/var/lib/plinth`,
//! `/usr/share/plinth/ipxe`, `/run/secrets`, `/usr/local/bin/plinth`); the iPXE directory is
//! filled by `ipxe/fetch.sh` as the image's build stage does (from the installed Debian package
//! here, no network); the compose secrets are made by `docker/secrets.sh`, the script the compose
//! file tells the operator to run, and mounted as compose mounts file secrets: with their host
//! owner and mode. The compose database URL names the compose file's own PostgreSQL; it is
//! replaced by a fresh database of the tests' PostgreSQL, reached through its Unix socket (the
//! namespace has no route to 127.0.0.1:5432 of the host).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{pg_admin_url, Backend, TestDb};

const BIN: &str = env!("CARGO_BIN_EXE_plinth");
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The last stage of a Dockerfile, as the test needs it.
#[derive(Debug, Default)]
struct Image {
    env: Vec<(String, String)>,
    user: String,
    workdir: String,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    /// Every `RUN` of every stage, continuation lines joined.
    runs: Vec<String>,
    /// The last stage's `COPY` lines.
    copies: Vec<String>,
}

fn json_array(what: &str, s: &str) -> Vec<String> {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{what} must be a JSON array: {s}: {e}"))
}

fn parse_dockerfile(text: &str) -> Image {
    let mut joined = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(t);
            joined.push(std::mem::take(&mut cur));
        }
    }
    let mut img = Image::default();
    for ins in joined {
        let (word, rest) = ins.split_once(' ').unwrap_or((&ins, ""));
        let rest = rest.trim();
        match word.to_ascii_uppercase().as_str() {
            "FROM" => {
                img = Image {
                    runs: std::mem::take(&mut img.runs),
                    ..Image::default()
                }
            }
            "ENV" => {
                if rest.contains('=') {
                    for kv in rest.split_whitespace() {
                        let (k, v) = kv.split_once('=').expect("ENV K=V");
                        img.env
                            .push((k.to_string(), v.trim_matches('"').to_string()));
                    }
                } else {
                    let (k, v) = rest.split_once(' ').expect("ENV K V");
                    img.env.push((k.to_string(), v.trim().to_string()));
                }
            }
            "USER" => img.user = rest.to_string(),
            "WORKDIR" => img.workdir = rest.to_string(),
            "ENTRYPOINT" => img.entrypoint = json_array("ENTRYPOINT", rest),
            "CMD" => img.cmd = json_array("CMD", rest),
            "RUN" => img.runs.push(rest.to_string()),
            "COPY" => img.copies.push(rest.to_string()),
            _ => {}
        }
    }
    img
}

fn image() -> Image {
    parse_dockerfile(&std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile"))
}

/// The uid `useradd --uid N ... USER` gives the image's user.
fn image_uid(img: &Image) -> u32 {
    let run = img
        .runs
        .iter()
        .find(|r| r.contains("useradd") && r.contains(&img.user))
        .expect("the image creates its USER with useradd");
    let words: Vec<&str> = run.split_whitespace().collect();
    let i = words
        .iter()
        .position(|w| *w == "--uid")
        .expect("useradd --uid: a fixed uid the host can give the secrets to");
    words[i + 1].parse().expect("numeric uid")
}

/// The capabilities of `setcap CAPS /usr/local/bin/plinth` in the image.
fn image_caps(img: &Image) -> String {
    let run = img
        .runs
        .iter()
        .find(|r| r.contains("setcap"))
        .expect("the image gives the binary its capabilities (setcap)");
    let words: Vec<&str> = run.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "setcap").expect("setcap");
    assert_eq!(words[i + 2], img.entrypoint[0], "setcap on the entrypoint");
    words[i + 1].to_string()
}

/// Where the container's paths live in this test.
struct Sandbox {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    map: Vec<(String, PathBuf)>,
}

impl Sandbox {
    fn new(img: &Image, uid: u32) -> Sandbox {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().to_path_buf();
        let map: Vec<(String, PathBuf)> = [
            ("/usr/local/bin/plinth", "bin/plinth"),
            ("/usr/share/plinth/ipxe", "ipxe"),
            ("/etc/plinth", "etc/plinth"),
            ("/var/lib/plinth", "var/lib/plinth"),
            ("/run/secrets", "run/secrets"),
        ]
        .iter()
        .map(|(c, h)| (c.to_string(), root.join(h)))
        .collect();
        for (_, p) in &map[1..] {
            std::fs::create_dir_all(p).expect("mkdir");
        }
        std::fs::create_dir_all(root.join("bin")).expect("mkdir");
        // The image's binary, with the image's file capabilities.
        let bin = root.join("bin/plinth");
        std::fs::copy(BIN, &bin).expect("copy binary");
        let out = Command::new("setcap")
            .arg(image_caps(img))
            .arg(&bin)
            .output()
            .expect("setcap (libcap2-bin)");
        assert!(out.status.success(), "setcap: {out:?}");
        // The iPXE binaries, as the image's ipxe stage fetches them.
        let out = Command::new("sh")
            .arg(repo().join("ipxe/fetch.sh"))
            .arg(root.join("ipxe"))
            .output()
            .expect("ipxe/fetch.sh");
        assert!(out.status.success(), "ipxe/fetch.sh: {out:?}");
        // Directories the image's user can traverse; its home (the data volume) is its own.
        for d in [
            "",
            "bin",
            "ipxe",
            "etc",
            "etc/plinth",
            "var",
            "var/lib",
            "run",
        ] {
            chmod(&root.join(d), 0o755);
        }
        chown(&root.join("var/lib/plinth"), uid);
        Sandbox {
            _tmp: tmp,
            root,
            map,
        }
    }

    /// A container path (or a text holding some) as it is here.
    fn host(&self, s: &str) -> String {
        let mut s = s.to_string();
        for (c, h) in &self.map {
            s = s.replace(c.as_str(), &h.display().to_string());
        }
        s
    }
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).expect("chown");
}

/// Runs `script` (sh) in a new network namespace with loopback up; `$RUN_AS` prefixes every
/// command that must run as the image's user. Returns (success, stdout+stderr). Killed by PID
/// when over time.
fn in_namespace(script: &str, uid: u32, pidfile: &Path) -> (bool, String) {
    let full = format!(
        "set -u\nip link set lo up\nRUN_AS='setpriv --reuid={uid} --regid={uid} --clear-groups --'\n{script}"
    );
    let mut child = Command::new("unshare")
        .args(["--net", "sh", "-c", &full])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare --net (util-linux, as root)");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut s = String::new();
    let _ = out.read_to_string(&mut s);
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if start.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The server the script started, if it is still there.
    if let Ok(pid) = std::fs::read_to_string(pidfile) {
        let _ = Command::new("kill")
            .args(["-9", pid.trim()])
            .stderr(Stdio::null())
            .status();
    }
    s.push_str(&t.join().expect("stderr thread"));
    (status.is_some_and(|st| st.success()), s)
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The shell that starts the server with `env` and `argv` as the image's user in `cwd`, waits
/// for it, runs `checks`, and stops it.
fn serve_script(
    env: &[(String, String)],
    argv: &[String],
    cwd: &str,
    root: &Path,
    checks: &str,
) -> String {
    // Expanded unquoted from $IMAGE_ENV, so a value must be one shell word as it stands.
    let env_args: Vec<String> = env
        .iter()
        .map(|(k, v)| {
            assert!(
                !v.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)),
                "{k}={v}: the test passes values without quoting"
            );
            format!("{k}={v}")
        })
        .collect();
    let argv: Vec<String> = argv.iter().map(|a| sh_quote(a)).collect();
    let log = root.join("server.log").display().to_string();
    let pidfile = root.join("server.pid").display().to_string();
    format!(
        r#"cd {cwd}
IMAGE_ENV="env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin {env}"
$RUN_AS $IMAGE_ENV {argv} 2>{log} &
pid=$!
echo $pid > {pidfile}
i=0
while [ $i -lt 300 ] && ! grep -q 'serving HTTP on' {log}; do
    kill -0 $pid 2>/dev/null || break
    sleep 0.1; i=$((i+1))
done
cat {log}
grep -q 'serving HTTP on' {log} || {{ echo '@@server did not start'; exit 1; }}
ok=0
( set -e
{checks}
) || ok=1
kill $pid; wait $pid 2>/dev/null
echo '--- server log after the checks'
cat {log}
exit $ok
"#,
        cwd = sh_quote(cwd),
        env = env_args.join(" "),
        argv = argv.join(" "),
        log = sh_quote(&log),
        pidfile = sh_quote(&pidfile),
    )
}

#[test]
fn container_files_hold_what_the_image_needs() {
    let img = image();
    assert!(
        !img.user.is_empty() && img.user != "root",
        "a non-root USER"
    );
    for (k, v) in &img.env {
        assert!(
            !v.is_empty(),
            "ENV {k}=\"\": an empty value is no setting; leave it out"
        );
    }
    assert!(
        img.runs
            .iter()
            .any(|r| r.contains("ipxe/fetch.sh") || r.contains("/fetch.sh --debian")),
        "the image build fetches the iPXE binaries with ipxe/fetch.sh"
    );
    assert!(
        img.copies
            .iter()
            .any(|c| c.starts_with("--from=ipxe") && c.ends_with("/usr/share/plinth/ipxe")),
        "the iPXE binaries are in the image: {:?}",
        img.copies
    );
    let caps = image_caps(&img);
    assert!(caps.contains("cap_net_bind_service"), "{caps}");
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    assert!(
        ignore
            .lines()
            .any(|l| l.trim().trim_end_matches('/') == "target"),
        ".dockerignore keeps target/ out of the build context"
    );
    let compose: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo().join("docker-compose.yml")).expect("compose"),
    )
    .expect("compose YAML");
    let caps: Vec<&str> = compose["services"]["plinth"]["cap_add"]
        .as_sequence()
        .expect("plinth keeps its capabilities: cap_add")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(caps.contains(&"NET_BIND_SERVICE"), "{caps:?}");
}

#[test]
fn container_image_serves_and_boots_as_its_user() {
    let img = image();
    let uid = image_uid(&img);
    let sb = Sandbox::new(&img, uid);
    // The image's own settings file, where the image puts it.
    let copy = img
        .copies
        .iter()
        .find(|c| c.ends_with(" /etc/plinth/plinth.toml"))
        .expect("the image carries /etc/plinth/plinth.toml");
    let src = copy.split_whitespace().next().expect("COPY SRC DEST");
    let toml = std::fs::read_to_string(repo().join(src)).expect("image settings");
    std::fs::write(sb.host("/etc/plinth/plinth.toml"), sb.host(&toml)).expect("toml");

    let env: Vec<(String, String)> = img
        .env
        .iter()
        .map(|(k, v)| (k.clone(), sb.host(v)))
        .collect();
    let argv: Vec<String> = img
        .entrypoint
        .iter()
        .chain(&img.cmd)
        .map(|a| sb.host(a))
        .collect();
    let bin = sh_quote(&argv[0]);
    let checks = format!(
        "curl -sf http://127.0.0.1:8080/healthz\n\
         echo\n\
         $RUN_AS $IMAGE_ENV {bin} token create --role admin --name ops | grep -q '^plinth_'\n\
         echo token-ok"
    );
    let script = serve_script(&env, &argv, &sb.host(&img.workdir), &sb.root, &checks);
    let (ok, out) = in_namespace(&script, uid, &sb.root.join("server.pid"));
    assert!(ok, "{out}");
    assert!(out.contains("token-ok"), "{out}");
    // The image's iPXE binaries are found: it can network-boot BIOS and UEFI machines.
    assert!(
        !out.contains("network-boots none") && out.contains("bios"),
        "{out}"
    );
    // Nothing written outside the data volume.
    assert!(
        Path::new(&sb.host("/var/lib/plinth/plinth.db")).exists(),
        "SQLite in the data volume"
    );
}

#[test]
fn compose_service_starts_with_its_secrets_and_binds_port_69() {
    let img = image();
    let uid = image_uid(&img);
    let sb = Sandbox::new(&img, uid);
    let compose: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo().join("docker-compose.yml")).expect("compose"),
    )
    .expect("compose YAML");
    let svc = &compose["services"]["plinth"];

    // The secrets, made by the script the compose file names, in a compose directory of the test.
    let compose_dir = sb.root.join("compose");
    std::fs::create_dir_all(&compose_dir).expect("mkdir");
    let out = Command::new("sh")
        .arg(repo().join("docker/secrets.sh"))
        .arg(&compose_dir)
        .output()
        .expect("docker/secrets.sh");
    assert!(out.status.success(), "docker/secrets.sh: {out:?}");
    // Mounted as compose mounts a file secret: /run/secrets/<target or name>, host owner and
    // mode kept (a symlink keeps both: they are the file's own).
    for s in svc["secrets"].as_sequence().expect("secrets") {
        let (name, target) = match s.as_str() {
            Some(n) => (n.to_string(), n.to_string()),
            None => (
                s["source"].as_str().expect("source").to_string(),
                s["target"]
                    .as_str()
                    .or(s["source"].as_str())
                    .expect("target")
                    .to_string(),
            ),
        };
        let file = compose["secrets"][name.as_str()]["file"]
            .as_str()
            .expect("a file secret");
        std::os::unix::fs::symlink(
            compose_dir.join(file),
            sb.host(&format!("/run/secrets/{target}")),
        )
        .expect("mount secret");
    }
    chmod(&sb.root.join("run/secrets"), 0o755);
    // The compose configs at their targets.
    for c in svc["configs"].as_sequence().expect("configs") {
        let name = c["source"].as_str().expect("source");
        let target = c["target"].as_str().expect("target");
        let content = compose["configs"][name]["content"]
            .as_str()
            .expect("config content");
        std::fs::write(sb.host(target), sb.host(content)).expect("config");
    }

    // The environment: the image's, then the service's; the database URL of the compose file's
    // PostgreSQL becomes a fresh database of the tests' one (socket, see the module docs).
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let db = rt.block_on(TestDb::new(Backend::Postgres));
    let db_name = db.url.rsplit('/').next().expect("db name").to_string();
    let admin = url::Url::parse(&pg_admin_url()).expect("DATABASE_URL");
    let socket_url = format!(
        "postgres://{}@localhost/{db_name}?host=/var/run/postgresql",
        admin.username()
    );
    let mut env: BTreeMap<String, String> = img
        .env
        .iter()
        .map(|(k, v)| (k.clone(), sb.host(v)))
        .collect();
    for (k, v) in svc["environment"].as_mapping().expect("environment") {
        let (k, v) = (k.as_str().expect("key"), v.as_str().expect("value"));
        let v = if k == "PLINTH_DATABASE_URL" {
            assert!(v.starts_with("postgres://"), "{v}");
            socket_url.clone()
        } else {
            sb.host(v)
        };
        env.insert(k.to_string(), v);
    }
    let env: Vec<(String, String)> = env.into_iter().collect();
    let argv: Vec<String> = img
        .entrypoint
        .iter()
        .map(|a| sb.host(a))
        .chain(
            svc["command"]
                .as_sequence()
                .expect("command")
                .iter()
                .map(|a| sb.host(a.as_str().expect("string"))),
        )
        .collect();

    let ipxe = sb.host("/usr/share/plinth/ipxe/undionly.kpxe");
    let got = sb.root.join("got.kpxe").display().to_string();
    let checks = format!(
        "curl -sf http://127.0.0.1:8080/healthz\n\
         curl -s tftp://127.0.0.1/undionly.kpxe -o {got}\n\
         cmp {ipxe} {got}\n\
         echo tftp-ok",
        got = sh_quote(&got),
        ipxe = sh_quote(&ipxe),
    );
    let script = serve_script(&env, &argv, &sb.host(&img.workdir), &sb.root, &checks);
    let (ok, out) = in_namespace(&script, uid, &sb.root.join("server.pid"));
    rt.block_on(db.drop_db());
    assert!(ok, "{out}");
    assert!(
        out.contains("tftp-ok"),
        "TFTP on port 69 as uid {uid}: {out}"
    );
    assert!(
        out.contains(&format!(
            "database postgres://{}@localhost/{db_name}",
            admin.username()
        )),
        "the compose file's database: {out}"
    );
    // The pgpass file was readable and strict enough for the client (it says so otherwise).
    assert!(
        !out.contains("pgpass") && !out.contains("Permission denied"),
        "{out}"
    );
}
