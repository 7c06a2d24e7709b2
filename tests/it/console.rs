//! The web console in a real browser: headless Chromium driven through WebDriver (`chromedriver`,
//! started here on a free loopback port and killed by its PID) against a running Plinth. Signing
//! in, finding a machine in the rack view, a boot step appearing on the machine page without a
//! reload (triggered by a real request to the boot route), accepting a discovered machine (one
//! that really asked the boot route), starting a reinstall (the wipe needs the typed name), a
//! viewer who sees no action and whose POSTs are refused, a missing or forged CSRF token refused,
//! and sign-out ending the session on the server. Each test saves a screenshot under the cargo
//! target directory (`console-screenshots/`) so a failure can be looked at.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support;
use crate::support::bmc_peers::free_port;
use crate::support::{Backend, TestServer};

/// The browsers' binaries (Debian's `chromium` and `chromium-driver`).
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long a page may take to show what a test waits for.
const WAIT: Duration = Duration::from_secs(30);

/// chromedriver on a loopback port, and one browser session; the driver is killed by PID on drop.
struct Browser {
    driver: Child,
    client: Option<Client>,
}

impl Browser {
    async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{CHROMEDRIVER} is needed for this test: {e}"));
        let mut b = Browser {
            driver,
            client: None,
        };
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let mut ready = false;
        for _ in 0..100 {
            if let Ok(r) = http.get(format!("{url}/status")).send().await {
                if r.status().is_success() {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ready, "chromedriver did not come up on {url}");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1000"]
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .expect("a browser session");
        b.client = Some(client);
        b
    }

    fn c(&self) -> &Client {
        self.client.as_ref().expect("session")
    }

    /// Save a screenshot as `target/console-screenshots/NAME.png`.
    async fn shot(&self, name: &str) -> PathBuf {
        let dir = target_dir().join("console-screenshots");
        std::fs::create_dir_all(&dir).expect("mkdir screenshots");
        let png = self.c().screenshot().await.expect("screenshot");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    async fn finish(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.close().await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The cargo target directory (`CARGO_TARGET_DIR`, else `target/` of the crate).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Sign in through the form.
async fn sign_in(b: &Browser, srv: &TestServer, token: &str) {
    let c = b.c();
    c.goto(&srv.url("/")).await.expect("open /");
    // `/` sends the browser to the console, which sends it to sign in.
    let url = c.current_url().await.expect("url");
    assert_eq!(url.path(), "/console/sign-in", "{url}");
    c.find(Locator::Css("#token"))
        .await
        .expect("token field")
        .send_keys(token)
        .await
        .expect("type");
    c.find(Locator::Css("form button[type=submit]"))
        .await
        .expect("sign-in button")
        .click()
        .await
        .expect("click");
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#signed-in-as"))
        .await
        .expect("signed in");
}

/// The session cookie the browser holds.
async fn session_cookie(b: &Browser) -> String {
    let cookies = b.c().get_all_cookies().await.expect("cookies");
    let c = cookies
        .iter()
        .find(|c| c.name() == "plinth_session")
        .expect("a session cookie");
    assert_eq!(c.http_only(), Some(true), "HttpOnly");
    assert_eq!(
        format!("{:?}", c.same_site()),
        "Some(Strict)",
        "SameSite=Strict"
    );
    assert_eq!(c.path(), Some("/"));
    c.value().to_string()
}

/// A machine registered through the API.
async fn register(srv: &TestServer, body: Value) -> Value {
    let r = srv
        .req(Method::POST, "/api/v1/machines", &srv.operator)
        .json(&body)
        .send()
        .await
        .expect("register");
    assert_eq!(r.status(), StatusCode::CREATED);
    r.json().await.expect("json")
}

async fn api_get(srv: &TestServer, path: &str) -> Value {
    srv.req(Method::GET, path, &srv.admin)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

/// A POST as a browser form, with the session cookie.
async fn form_post(srv: &TestServer, cookie: &str, path: &str, body: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .post(srv.url(path))
        .header("Cookie", format!("plinth_session={cookie}"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(body.to_string())
        .send()
        .await
        .expect("post")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tech_finds_a_machine_in_its_rack_and_watches_it_boot_live() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let m = register(
        &srv,
        json!({"hostname": "rk-web-1", "site": "ams1", "rack": "r12", "rack_unit": 7,
               "serial": "SN-RK-1",
               "interfaces": [{"mac": "52:54:00:c0:00:07", "boot": true}]}),
    )
    .await;
    register(
        &srv,
        json!({"hostname": "rk-web-2", "site": "ams1", "rack": "r12", "rack_unit": 9}),
    )
    .await;
    let id = m["id"].as_str().expect("id").to_string();
    let b = Browser::start().await;
    sign_in(&b, &srv, &srv.operator).await;
    let c = b.c();

    // The rack view: the machine over its unit, its state in words, empty units drawn.
    c.goto(&srv.url("/console/racks?site=ams1"))
        .await
        .expect("racks");
    let unit = c
        .find(Locator::Css(
            "section.rack[data-rack='r12'] li[data-unit='7']",
        ))
        .await
        .expect("unit 7 of rack r12");
    let text = unit.text().await.expect("text");
    assert!(
        text.contains("rk-web-1") && text.contains("registered"),
        "{text}"
    );
    let empty = c
        .find(Locator::Css(
            "section.rack[data-rack='r12'] li[data-unit='8']",
        ))
        .await
        .expect("unit 8");
    assert!(empty.text().await.expect("t").contains("empty"));
    b.shot("rack-view").await;
    unit.find(Locator::Css("a"))
        .await
        .expect("link")
        .click()
        .await
        .expect("click");
    c.wait()
        .at_most(WAIT)
        .for_url(&url::Url::parse(&srv.url(&format!("/console/machines/{id}"))).expect("url"))
        .await
        .expect("machine page");
    // The live stream is connected before the machine boots.
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::XPath(
            "//span[@data-status-for='timeline'][starts-with(., 'Live')]",
        ))
        .await
        .expect("live stream connected");
    assert!(c
        .find_all(Locator::Css("#timeline li[data-kind^='boot.']"))
        .await
        .expect("find")
        .is_empty());

    // The machine asks for its boot script (a real request to the boot route): the step
    // appears on the page without a reload.
    let r = srv
        .client
        .get(srv.url("/boot/machine.ipxe?mac=52-54-00-c0-00-07&buildarch=x86_64&platform=efi"))
        .send()
        .await
        .expect("boot script");
    assert_eq!(r.status(), StatusCode::OK);
    let step = c
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#timeline li.new[data-kind^='boot.']"))
        .await
        .expect("the boot step appears live");
    assert!(step.text().await.expect("t").contains("boot."));
    b.shot("machine-live-boot").await;

    // Readable on a 390 px phone without horizontal scrolling.
    c.set_window_size(390, 844).await.expect("resize");
    c.refresh().await.expect("reload");
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#h-identity"))
        .await
        .expect("page");
    let fits = c
        .execute(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth;",
            vec![],
        )
        .await
        .expect("measure");
    b.shot("machine-390px").await;
    assert_eq!(
        fits,
        json!(true),
        "the machine page scrolls sideways at 390 px"
    );

    // The machine table finds it (filtered, sorted by the database).
    c.set_window_size(1280, 1000).await.expect("resize");
    c.goto(&srv.url("/console/machines?q=rk-web&sort=hostname&desc=1"))
        .await
        .expect("table");
    let rows = c
        .find_all(Locator::Css("#machines tbody tr td:first-child"))
        .await
        .expect("rows");
    let mut names = Vec::new();
    for r in rows {
        names.push(r.text().await.expect("t"));
    }
    assert_eq!(names, ["rk-web-2", "rk-web-1"]);
    b.shot("machines-table").await;
    b.finish().await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_accepts_a_discovered_machine_and_starts_a_reinstall() {
    let talos = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = talos.local_addr().expect("addr").port();
    let extra = format!(
        "[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 3600\nnetboot_seconds = 900\ntalos_api_port = {port}\n",
        crate::talos_configs::schemas().display()
    );
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    // A declared cluster with one machine, node-1, whose config renders.
    let tmp = tempfile::tempdir().expect("tmp");
    let secrets = tmp.path().join("secrets.yaml");
    std::fs::write(
        &secrets,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("bundle")
            .to_yaml()
            .expect("yaml"),
    )
    .expect("write");
    crate::talos_configs::write_inventory(tmp.path(), &secrets, None);
    crate::talos_configs::apply_dir(&srv, &extra, &tmp.path().join("inv")).await;

    // An unknown machine network-boots: it is discovered.
    let r = srv
        .client
        .get(srv.url(
            "/boot/machine.ipxe?mac=52-54-00-d1-00-01&serial=SN-DISC-1&manufacturer=QEMU&product=Standard%20PC&buildarch=x86_64&platform=efi",
        ))
        .send()
        .await
        .expect("boot");
    assert_eq!(r.status(), StatusCode::OK);
    let found = api_get(&srv, "/api/v1/machines/lookup?mac=52:54:00:d1:00:01").await;
    assert_eq!(found["state"], "discovered");
    let disc = found["id"].as_str().expect("id").to_string();

    let b = Browser::start().await;
    sign_in(&b, &srv, &srv.operator).await;
    let c = b.c();
    c.goto(&srv.url("/console/discovered"))
        .await
        .expect("queue");
    let card = c
        .find(Locator::Css(&format!("article[data-machine='{disc}']")))
        .await
        .expect("the discovered machine is queued");
    let text = card.text().await.expect("t");
    assert!(
        text.contains("SN-DISC-1") && text.contains("52:54:00:d1:00:01"),
        "{text}"
    );
    for (field, value) in [
        ("hostname", "disc-1"),
        ("site", "ams1"),
        ("rack", "r3"),
        ("unit", "12"),
    ] {
        let input = card
            .find(Locator::Css(&format!("input[name='{field}']")))
            .await
            .expect("field");
        input.clear().await.expect("clear");
        input.send_keys(value).await.expect("type");
    }
    b.shot("discovered-accept").await;
    card.find(Locator::Css("form.accept button[type=submit]"))
        .await
        .expect("accept")
        .click()
        .await
        .expect("click");
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::XPath("//h1[contains(., 'disc-1')]"))
        .await
        .expect("the accepted machine's page");
    let m = api_get(&srv, &format!("/api/v1/machines/{disc}")).await;
    assert_eq!(m["state"], "registered");
    assert_eq!(m["hostname"], "disc-1");
    assert_eq!(m["rack"], "r3");
    assert_eq!(m["rack_unit"], 12);
    let ev = api_get(
        &srv,
        &format!("/api/v1/events?machine={disc}&kind=machine.state"),
    )
    .await;
    let last = ev.as_array().and_then(|a| a.last()).expect("a state event");
    assert_eq!(last["actor"], "token:test-operator", "{last}");

    // node-1 (declared, its config renders) is made ready, then reinstalled from its page.
    let node = api_get(&srv, "/api/v1/machines/node-1").await;
    let node_id = node["id"].as_str().expect("id").to_string();
    let r = srv
        .req(
            Method::POST,
            &format!("/api/v1/machines/{node_id}/state"),
            &srv.operator,
        )
        .json(&json!({"state": "ready"}))
        .send()
        .await
        .expect("ready");
    assert_eq!(r.status(), StatusCode::OK);
    c.goto(&srv.url(&format!("/console/machines/{node_id}")))
        .await
        .expect("node page");
    // Wiping without typing the name is refused and starts nothing.
    let form = c
        .find(Locator::Css("form#reinstall"))
        .await
        .expect("reinstall form");
    form.find(Locator::Css("input[name='wipe']"))
        .await
        .expect("wipe")
        .click()
        .await
        .expect("tick");
    form.find(Locator::Css("button[type=submit]"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    let refusal = c
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("p.error"))
        .await
        .expect("refusal");
    assert!(refusal.text().await.expect("t").contains("type `node-1`"));
    let none = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{node_id}/reinstall"),
            &srv.viewer,
        )
        .send()
        .await
        .expect("status");
    assert_eq!(none.status(), StatusCode::NOT_FOUND, "no reinstall started");
    // With the name typed, the reinstall starts.
    c.back().await.expect("back");
    let form = c
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("form#reinstall"))
        .await
        .expect("form again");
    let wipe = form
        .find(Locator::Css("input[name='wipe']"))
        .await
        .expect("wipe");
    if wipe.prop("checked").await.expect("checked").as_deref() != Some("true") {
        wipe.click().await.expect("tick");
    }
    let confirm = form
        .find(Locator::Css("input[name='confirm']"))
        .await
        .expect("confirm");
    confirm.clear().await.expect("clear");
    confirm.send_keys("node-1").await.expect("type");
    form.find(Locator::Css("button[type=submit]"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#h-reinstall"))
        .await
        .expect("the reinstall shows on the page");
    b.shot("reinstall-started").await;
    let r = api_get(&srv, &format!("/api/v1/machines/{node_id}/reinstall")).await;
    assert_eq!(r["stage"], "power", "{r}");
    assert_eq!(r["wipe"], true);
    assert_eq!(r["requested_by"], "token:test-operator");
    drop(talos);
    b.finish().await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_see_no_actions_forged_posts_are_refused_and_sign_out_ends_the_session() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let m = register(
        &srv,
        json!({"hostname": "guarded-1", "rack": "r1", "rack_unit": 1}),
    )
    .await;
    let id = m["id"].as_str().expect("id").to_string();
    let state_path = format!("/console/machines/{id}/state");

    // A viewer sees the machine but no action, and its POST is refused even with its own
    // CSRF token.
    let b = Browser::start().await;
    sign_in(&b, &srv, &srv.viewer).await;
    let c = b.c();
    c.goto(&srv.url(&format!("/console/machines/{id}")))
        .await
        .expect("page");
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#h-identity"))
        .await
        .expect("page");
    assert!(c
        .find_all(Locator::Css("#actions"))
        .await
        .expect("find")
        .is_empty());
    assert!(c
        .find_all(Locator::Css("main form"))
        .await
        .expect("find")
        .is_empty());
    b.shot("viewer-machine").await;
    let viewer_cookie = session_cookie(&b).await;
    let csrf = c
        .find(Locator::Css("header form input[name='csrf']"))
        .await
        .expect("csrf of the sign-out form")
        .attr("value")
        .await
        .expect("value")
        .expect("a token");
    let r = form_post(
        &srv,
        &viewer_cookie,
        &state_path,
        &format!("csrf={csrf}&state=maintenance&version=1"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    b.finish().await;

    // An operator's session: a POST without the CSRF token, or with another's, is refused.
    let b = Browser::start().await;
    sign_in(&b, &srv, &srv.operator).await;
    let c = b.c();
    let cookie = session_cookie(&b).await;
    let r = form_post(&srv, &cookie, &state_path, "state=maintenance&version=1").await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "missing CSRF token");
    let r = form_post(
        &srv,
        &cookie,
        &state_path,
        &format!("csrf={csrf}&state=maintenance&version=1"),
    )
    .await;
    assert_eq!(
        r.status(),
        StatusCode::FORBIDDEN,
        "another session's CSRF token"
    );
    // No session at all: refused too.
    let r = reqwest::Client::new()
        .post(srv.url(&state_path))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("state=maintenance&version=1")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "no session");
    // A forged POST from a page (the browser sends the cookie, but the page lacks the token).
    c.goto(&srv.url(&format!("/console/machines/{id}")))
        .await
        .expect("page");
    let status = c
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch(arguments[0], {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'},
                                  body: 'state=maintenance&version=1'})
               .then(r => done(r.status), () => done(0));",
            vec![json!(state_path)],
        )
        .await
        .expect("fetch");
    assert_eq!(status, json!(403));
    assert_eq!(
        api_get(&srv, &format!("/api/v1/machines/{id}")).await["state"],
        "registered",
        "nothing changed"
    );
    // The real form works, and the event names the signed-in token.
    c.find(Locator::Css("#actions form button"))
        .await
        .expect("an action");
    c.find(Locator::XPath(
        "//button[contains(., 'Put in maintenance')]",
    ))
    .await
    .expect("maintenance button")
    .click()
    .await
    .expect("click");
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::XPath("//h1/span[contains(., 'maintenance')]"))
        .await
        .expect("in maintenance");
    let ev = api_get(
        &srv,
        &format!("/api/v1/events?machine={id}&kind=machine.state"),
    )
    .await;
    assert_eq!(
        ev.as_array().and_then(|a| a.last()).expect("event")["actor"],
        "token:test-operator"
    );

    // Sign-out ends the session on the server: the old cookie is worth nothing.
    c.find(Locator::Css("#sign-out"))
        .await
        .expect("sign out")
        .click()
        .await
        .expect("click");
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#token"))
        .await
        .expect("back at sign-in");
    b.shot("signed-out").await;
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .get(srv.url("/console"))
        .header("Cookie", format!("plinth_session={cookie}"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(r
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .starts_with("/console/sign-in"));
    let r = form_post(&srv, &cookie, &state_path, "state=ready").await;
    assert_eq!(
        r.status(),
        StatusCode::FORBIDDEN,
        "a signed-out session acts no more"
    );
    let kinds: Vec<String> = api_get(&srv, "/api/v1/events?kind=console.")
        .await
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["kind"].as_str().unwrap_or(""),
                e["actor"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert!(
        kinds.contains(&"console.signed_out token:test-operator".to_string()),
        "{kinds:?}"
    );
    b.finish().await;
    srv.finish().await;
}

/// Sessions on both databases without a browser: a session lasts only while its token is live
/// and only its hash is stored.
async fn sessions_follow_their_token(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let r = client
        .post(srv.url("/console/sign-in"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("token={}&next=/console/racks", srv.operator))
        .send()
        .await
        .expect("sign in");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/console/racks");
    let set = r.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "plain http public URL: {set}");
    let id = set
        .split(';')
        .next()
        .and_then(|kv| kv.strip_prefix("plinth_session="))
        .expect("value")
        .to_string();
    let page = |c: &str| {
        client
            .get(srv.url("/console/machines"))
            .header("Cookie", format!("plinth_session={c}"))
            .send()
    };
    assert_eq!(page(&id).await.expect("get").status(), StatusCode::OK);
    assert_eq!(
        page("forged").await.expect("get").status(),
        StatusCode::SEE_OTHER
    );
    // The cookie's value is not in the database, only its SHA-256.
    let store = plinth::app::open_store(&crate::support::config(&srv.db, ""), false)
        .await
        .expect("store");
    let hash = plinth::service::auth::token_hash(&id);
    assert!(store
        .tokens
        .session_by_hash(&hash)
        .await
        .expect("q")
        .is_some());
    assert!(store
        .tokens
        .session_by_hash(id.as_bytes())
        .await
        .expect("q")
        .is_none());
    // A wrong token does not sign in.
    let r = client
        .post(srv.url("/console/sign-in"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("token=plinth_nope")
        .send()
        .await
        .expect("sign in");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.headers().get("set-cookie").is_none());
    // Revoking the token ends its sessions.
    let tokens = api_get(&srv, "/api/v1/tokens").await;
    let op = tokens
        .as_array()
        .expect("tokens")
        .iter()
        .find(|t| t["name"] == "test-operator")
        .expect("operator token")["id"]
        .as_str()
        .expect("id")
        .to_string();
    let r = srv
        .req(Method::DELETE, &format!("/api/v1/tokens/{op}"), &srv.admin)
        .send()
        .await
        .expect("revoke");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        page(&id).await.expect("get").status(),
        StatusCode::SEE_OTHER
    );
    assert!(
        store
            .tokens
            .session_by_hash(&hash)
            .await
            .expect("q")
            .is_none(),
        "token revoked"
    );
    srv.finish().await;
}

both_backends!(sessions_follow_their_token);
