//! The web console in a real browser: headless Chromium driven through WebDriver (`chromedriver`,
//! started here on a free loopback port and killed by its PID) against a running Plinth.
//! Signing in (from the form only: a sign-in posted from another site is refused), finding a
//! machine in the rack view, a boot step appearing on the machine page without a reload
//! (triggered by a real request to the boot route), accepting a discovered machine (one that
//! really asked the boot route) and the switch port its relayed DHCP came from (real DHCP through
//! a relay agent in network namespaces), starting a reinstall (the wipe needs the typed name) and
//! cancelling it, why machines wait and the image cache on the overview, a viewer who sees no
//! action and whose POSTs are refused, a missing or forged CSRF token refused, sign-out ending
//! the session (and its live stream) on the server, a rolling Talos upgrade of the upgrade tests'
//! lab followed live on its cluster's page and paused, resumed and aborted by role, and every
//! page on a 390-pixel-wide phone, from the keyboard, with states written out. Each test saves screenshots under the cargo
//! target directory (`console-screenshots/`) so a failure can be looked at.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::elements::Element;
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::bmc_peers::free_port;
use crate::support::{self, no_redirects, Answer, Ask as _, Backend, TestDb, TestServer};

/// The browsers' binaries (Debian's `chromium` and `chromium-driver`).
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long a page may take to show what a test waits for.
const WAIT: Duration = Duration::from_secs(30);
/// The phone's width.
const PHONE: u32 = 390;

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
        let mut ready = false;
        for _ in 0..100 {
            if let Ok(r) = reqwest::get(format!("{url}/status")).await {
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

    /// A browser signed in to `srv` with `token` through the sign-in form.
    async fn signed_in(srv: &TestServer, token: &str) -> Browser {
        let b = Browser::start().await;
        b.sign_in(srv, token).await;
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

    /// Sign in through the form: `/` sends the browser to the console, which sends it to sign in.
    async fn sign_in(&self, srv: &TestServer, token: &str) {
        self.c().goto(&srv.url("/")).await.expect("open /");
        let url = self.c().current_url().await.expect("url");
        assert_eq!(url.path(), "/console/sign-in", "{url}");
        self.el("#token")
            .await
            .send_keys(token)
            .await
            .expect("type");
        self.click("form button[type=submit]").await;
        self.el("#signed-in-as").await;
    }

    /// Open a page of `srv` and wait for its main part.
    async fn open(&self, srv: &TestServer, path: &str) {
        self.c().goto(&srv.url(path)).await.expect("goto");
        self.el("main#main").await;
    }

    /// The element `css` selects, once it is there.
    async fn el(&self, css: &str) -> Element {
        self.c()
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no `{css}` on the page: {e}"))
    }

    /// The element `xpath` selects, once it is there.
    async fn xpath(&self, xpath: &str) -> Element {
        self.c()
            .wait()
            .at_most(WAIT)
            .for_element(Locator::XPath(xpath))
            .await
            .unwrap_or_else(|e| panic!("no `{xpath}` on the page: {e}"))
    }

    /// Click the element `css` selects.
    async fn click(&self, css: &str) {
        self.el(css).await.click().await.expect("click");
    }

    /// Click the button that says `label`.
    async fn press(&self, label: &str) {
        self.xpath(&format!("//button[contains(., '{label}')]"))
            .await
            .click()
            .await
            .expect("click");
    }

    /// Is there no element `css` selects?
    async fn absent(&self, css: &str) -> bool {
        self.c()
            .find_all(Locator::Css(css))
            .await
            .expect("find")
            .is_empty()
    }

    /// The texts of the elements `css` selects.
    async fn texts(&self, css: &str) -> Vec<String> {
        let mut out = Vec::new();
        for e in self.c().find_all(Locator::Css(css)).await.expect("find") {
            out.push(e.text().await.expect("text"));
        }
        out
    }

    /// The text of the element `css` selects, once it is there.
    async fn text(&self, css: &str) -> String {
        self.el(css).await.text().await.expect("text")
    }

    /// The text of the element `xpath` selects, once it is there.
    async fn xtext(&self, xpath: &str) -> String {
        self.xpath(xpath).await.text().await.expect("text")
    }

    /// Wait until the page's heading names the machine's state.
    async fn state_is(&self, state: &str) {
        self.xpath(&format!("//h1/span[contains(., '{state}')]"))
            .await;
    }

    /// Run `script` in the page.
    async fn js(&self, script: &str) -> Value {
        self.c().execute(script, vec![]).await.expect("script")
    }

    /// The session cookie the browser holds (as `plinth_session=VALUE`), with its attributes
    /// checked.
    async fn session_cookie(&self) -> String {
        let cookies = self.c().get_all_cookies().await.expect("cookies");
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
        format!("plinth_session={}", c.value())
    }

    /// The CSRF token of this page's session (from the sign-out form every page has).
    async fn csrf(&self) -> String {
        self.el("header form input[name='csrf']")
            .await
            .attr("value")
            .await
            .expect("value")
            .expect("a token")
    }

    /// Press keys on whatever has the focus, as a person at the keyboard does.
    async fn keys(&self, keys: &[Key]) {
        let mut seq = KeyActions::new("keyboard".into());
        for k in keys {
            seq = seq
                .then(KeyAction::Down { value: (*k).into() })
                .then(KeyAction::Up { value: (*k).into() });
        }
        self.c().perform_actions(seq).await.expect("keys");
    }

    /// What has the focus: tag, text and whether its focus outline shows.
    async fn focused(&self) -> (String, String, bool) {
        let v = self
            .js("const e = document.activeElement;
                 return [e.tagName, (e.textContent || '').trim(),
                         getComputedStyle(e).outlineStyle !== 'none'];")
            .await;
        (
            v[0].as_str().unwrap_or("").to_string(),
            v[1].as_str().unwrap_or("").to_string(),
            v[2].as_bool().unwrap_or(false),
        )
    }

    /// Tab through the page until the button that says `label` has the focus (at most 100
    /// presses).
    async fn tab_to(&self, label: &str) -> bool {
        for _ in 0..100 {
            self.keys(&[Key::Tab]).await;
            let (tag, text, _) = self.focused().await;
            if tag == "BUTTON" && text.contains(label) {
                return true;
            }
        }
        false
    }

    /// The page is no wider than the window (nothing scrolls sideways).
    async fn fits(&self) -> bool {
        self.js(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth;",
        )
        .await
            == json!(true)
    }

    /// Every element coloured by a state (`st-NAME`) that does not say NAME in words.
    async fn states_only_in_colour(&self) -> (usize, Vec<String>) {
        let v = self
            .js(
                "const all = Array.from(document.querySelectorAll('[class*=\"st-\"]'));
                 const bad = all.filter(e => { const m = e.className.match(/\\bst-([a-z]+)/);
                                               return m && !e.textContent.includes(m[1]); });
                 return [all.length, bad.map(e => e.outerHTML)];",
            )
            .await;
        let n = v[0].as_u64().unwrap_or(0) as usize;
        let bad = v[1]
            .as_array()
            .into_iter()
            .flatten()
            .map(|x| x.as_str().unwrap_or("").to_string())
            .collect();
        (n, bad)
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

/// Type `fields` into the inputs of `scope` (cleared first).
async fn fill(scope: &Element, fields: &[(&str, &str)]) {
    for (name, value) in fields {
        let input = scope
            .find(Locator::Css(&format!("input[name='{name}']")))
            .await
            .unwrap_or_else(|e| panic!("field {name}: {e}"));
        input.clear().await.expect("clear");
        input.send_keys(value).await.expect("type");
    }
}

/// A machine registered through the API: its id.
async fn register(srv: &TestServer, body: Value) -> String {
    srv.req(Method::POST, "/api/v1/machines", &srv.operator)
        .json(&body)
        .answer()
        .await
        .expect_status(StatusCode::CREATED)
        .json()["id"]
        .as_str()
        .expect("id")
        .to_string()
}

async fn api_get(srv: &TestServer, path: &str) -> Value {
    srv.get_json(path, &srv.admin).await
}

/// An operator's API POST that must succeed.
async fn api_post(srv: &TestServer, path: &str, body: Value) -> Value {
    let r = srv
        .req(Method::POST, path, &srv.operator)
        .json(&body)
        .answer()
        .await;
    assert!(
        r.status.is_success(),
        "{}: {} {}",
        r.request,
        r.status,
        r.text
    );
    r.json()
}

/// The newest event of `kind` of a machine.
async fn last_event(srv: &TestServer, id: &str, kind: &str) -> Value {
    api_get(srv, &format!("/api/v1/events?machine={id}&kind={kind}"))
        .await
        .as_array()
        .and_then(|a| a.last().cloned())
        .unwrap_or_else(|| panic!("no {kind} event of {id}"))
}

/// A POST as a browser form: the session cookie (`plinth_session=...`, or nothing) and exactly
/// `body`.
async fn form_post(srv: &TestServer, cookie: Option<&str>, path: &str, body: &str) -> Answer {
    let mut r = no_redirects()
        .post(srv.url(path))
        .header("content-type", "application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        r = r.header("cookie", c);
    }
    r.body(body.to_string()).answer().await
}

/// A GET with the session cookie, redirects not followed.
async fn page(srv: &TestServer, cookie: &str, path: &str) -> Answer {
    no_redirects()
        .get(srv.url(path))
        .header("cookie", cookie)
        .answer()
        .await
}

/// The answer sends the browser to sign in.
#[track_caller]
fn to_sign_in(r: &Answer) {
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.request);
    assert!(
        r.header("location").starts_with("/console/sign-in"),
        "{}",
        r.header("location")
    );
}

/// The boot route asked for `mac` (dashes) from loopback, as iPXE asks it.
async fn boot(srv: &TestServer, query: &str) {
    srv.client
        .get(srv.url(&format!(
            "/boot/machine.ipxe?{query}&buildarch=x86_64&platform=efi"
        )))
        .answer()
        .await
        .expect_status(StatusCode::OK);
}

/// A server with the Talos schemas and a frozen workflow engine, and the declared cluster `lab`
/// with its machine `node-1` (ready, its config renders): the server and node-1's id.
async fn lab(dir: &std::path::Path) -> (TestServer, String, String) {
    let talos = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = talos.local_addr().expect("addr").port();
    drop(talos);
    let extra = format!(
        "[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 3600\nnetboot_seconds = 900\ntalos_api_port = {port}\n",
        crate::talos_configs::schemas().display()
    );
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let secrets = crate::talos_configs::write_secrets(dir);
    crate::talos_configs::write_inventory(dir, &secrets, None);
    crate::talos_configs::apply_dir(&srv, &extra, &dir.join("inv")).await;
    let id = api_get(&srv, "/api/v1/machines/node-1").await["id"]
        .as_str()
        .expect("id")
        .to_string();
    api_post(
        &srv,
        &format!("/api/v1/machines/{id}/state"),
        json!({"state": "ready"}),
    )
    .await;
    (srv, id, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tech_finds_a_machine_in_its_rack_and_watches_it_boot_live() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let id = register(
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
    let b = Browser::signed_in(&srv, &srv.operator).await;

    // The rack view: the machine over its unit, its state in words, empty units drawn.
    b.open(&srv, "/console/racks?site=ams1").await;
    let unit = b
        .el("section.rack[data-rack='r12'] li[data-unit='7']")
        .await;
    let text = unit.text().await.expect("text");
    assert!(
        text.contains("rk-web-1") && text.contains("registered"),
        "{text}"
    );
    assert!(b
        .text("section.rack[data-rack='r12'] li[data-unit='8']")
        .await
        .contains("empty"));
    b.c()
        .execute(
            "arguments[0].scrollIntoView({block: 'center'});",
            vec![serde_json::to_value(&unit).expect("element")],
        )
        .await
        .expect("scroll");
    b.shot("rack-view").await;
    unit.find(Locator::Css("a"))
        .await
        .expect("link")
        .click()
        .await
        .expect("click");
    b.c()
        .wait()
        .at_most(WAIT)
        .for_url(&url::Url::parse(&srv.url(&format!("/console/machines/{id}"))).expect("url"))
        .await
        .expect("machine page");
    // The live stream is connected before the machine boots.
    b.xpath("//span[@data-status-for='timeline'][starts-with(., 'Live')]")
        .await;
    assert!(b.absent("#timeline li[data-kind^='boot.']").await);

    // The machine asks for its boot script (a real request to the boot route): the step
    // appears on the page without a reload.
    boot(&srv, "mac=52-54-00-c0-00-07").await;
    assert!(b
        .text("#timeline li.new[data-kind^='boot.']")
        .await
        .contains("boot."));
    b.shot("machine-live-boot").await;

    // The machine table finds it (filtered, sorted by the database).
    b.open(&srv, "/console/machines?q=rk-web&sort=hostname&desc=1")
        .await;
    assert_eq!(
        b.texts("#machines tbody tr td:first-child").await,
        ["rk-web-2", "rk-web-1"]
    );
    // By its MAC, its serial, its rack too (one search column).
    for q in ["52:54:00:c0:00:07", "sn-rk-1", "R12"] {
        b.open(&srv, &format!("/console/machines?q={q}")).await;
        let names = b.texts("#machines tbody tr td:first-child").await;
        assert!(names.contains(&"rk-web-1".to_string()), "{q}: {names:?}");
    }
    b.shot("machines-table").await;
    b.finish().await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_accepts_a_discovered_machine_and_starts_and_cancels_a_reinstall() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (srv, node_id, _) = lab(tmp.path()).await;

    // An unknown machine network-boots: it is discovered.
    boot(
        &srv,
        "mac=52-54-00-d1-00-01&serial=SN-DISC-1&manufacturer=QEMU&product=Standard%20PC",
    )
    .await;
    let found = api_get(&srv, "/api/v1/machines/lookup?mac=52:54:00:d1:00:01").await;
    assert_eq!(found["state"], "discovered");
    let disc = found["id"].as_str().expect("id").to_string();

    let b = Browser::signed_in(&srv, &srv.operator).await;
    b.open(&srv, "/console/discovered").await;
    let card = b.el(&format!("article[data-machine='{disc}']")).await;
    let text = card.text().await.expect("t");
    assert!(
        text.contains("SN-DISC-1") && text.contains("52:54:00:d1:00:01"),
        "{text}"
    );
    fill(
        &card,
        &[
            ("hostname", "disc-1"),
            ("site", "ams1"),
            ("rack", "r3"),
            ("unit", "12"),
        ],
    )
    .await;
    b.shot("discovered-accept").await;
    card.find(Locator::Css("form.accept button[type=submit]"))
        .await
        .expect("accept")
        .click()
        .await
        .expect("click");
    b.xpath("//h1[contains(., 'disc-1')]").await;
    let m = api_get(&srv, &format!("/api/v1/machines/{disc}")).await;
    assert_eq!(
        (&m["state"], &m["hostname"], &m["rack"], &m["rack_unit"]),
        (
            &json!("registered"),
            &json!("disc-1"),
            &json!("r3"),
            &json!(12)
        )
    );
    assert_eq!(
        last_event(&srv, &disc, "machine.state").await["actor"],
        "token:test-operator"
    );

    // node-1 (declared, its config renders, ready) is reinstalled from its page. Wiping without
    // typing the name is refused and starts nothing.
    b.open(&srv, &format!("/console/machines/{node_id}")).await;
    b.click("form#reinstall input[name='wipe']").await;
    b.click("form#reinstall button[type=submit]").await;
    assert!(b.text("p.error").await.contains("type `node-1`"));
    srv.req(
        Method::GET,
        &format!("/api/v1/machines/{node_id}/reinstall"),
        &srv.viewer,
    )
    .answer()
    .await
    .expect_status(StatusCode::NOT_FOUND);
    // With the name typed, the reinstall starts.
    b.open(&srv, &format!("/console/machines/{node_id}")).await;
    let form = b.el("form#reinstall").await;
    form.find(Locator::Css("input[name='wipe']"))
        .await
        .expect("wipe")
        .click()
        .await
        .expect("tick");
    fill(&form, &[("confirm", "node-1")]).await;
    b.click("form#reinstall button[type=submit]").await;
    b.el("#h-reinstall").await;
    b.shot("reinstall-started").await;
    let r = api_get(&srv, &format!("/api/v1/machines/{node_id}/reinstall")).await;
    assert_eq!(
        (&r["stage"], &r["wipe"], &r["requested_by"]),
        (&json!("power"), &json!(true), &json!("token:test-operator")),
        "{r}"
    );
    // And cancelled from the page: the machine goes to maintenance, the event names the token.
    b.click("#cancel-reinstall button").await;
    b.state_is("maintenance").await;
    b.shot("reinstall-cancelled").await;
    let r = api_get(&srv, &format!("/api/v1/machines/{node_id}/reinstall")).await;
    assert_eq!(
        (&r["stage"], &r["cancelled_by"]),
        (&json!("cancelled"), &json!("token:test-operator")),
        "{r}"
    );
    b.finish().await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_powers_a_machine_and_sets_a_one_time_boot_through_its_bmc() {
    // A real Redfish peer: sushy-emulator --fake, basic auth, plain HTTP on loopback.
    let emu = crate::support::bmc_peers::sushy_emulator(crate::support::bmc_peers::EmulatorSetup {
        auth: Some(("admin".into(), "emu-Console-Pa55".into())),
        tls: false,
    });
    let srv = TestServer::start(Backend::Sqlite).await;
    let id = register(
        &srv,
        json!({"hostname": "bmc-1", "bmc": {"url": emu.peer.url(), "username": "admin",
               "password": "emu-Console-Pa55", "tls": "insecure-http"}}),
    )
    .await;
    let b = Browser::signed_in(&srv, &srv.operator).await;
    let machine = format!("/console/machines/{id}");
    b.open(&srv, &machine).await;
    // The power state is asked after the page loads.
    b.xpath("//span[@id='power'][.='off']").await;
    // The capabilities the background probe found (reloaded until it has run, a bounded wait).
    let mut probed = false;
    for _ in 0..60 {
        if b.text("#h-bmc + dl").await.contains("ForceOff") {
            probed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.open(&srv, &machine).await;
    }
    assert!(probed, "the BMC's reset types are shown");

    // Power on from the page: back on the page, the BMC says on, the event names the token.
    b.press("On").await;
    b.xpath("//span[@id='power'][.='on']").await;
    let e = last_event(&srv, &id, "bmc.power").await;
    assert_eq!(e["actor"], "token:test-operator", "{e}");
    b.shot("bmc-power-on").await;
    // A one-time boot from the network.
    b.el("#boot-target").await;
    b.click("#boot-target option[value='pxe']").await;
    b.press("Set").await;
    b.el("#h-bmc").await;
    let e = last_event(&srv, &id, "bmc.boot_once").await;
    assert_eq!(e["actor"], "token:test-operator", "{e}");
    b.finish().await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_see_no_actions_forged_posts_are_refused_and_sign_out_ends_the_session() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let id = register(
        &srv,
        json!({"hostname": "guarded-1", "rack": "r1", "rack_unit": 1}),
    )
    .await;
    let machine = format!("/console/machines/{id}");
    let state_path = format!("{machine}/state");

    // A sign-in posted from another site (a page of an opaque origin that submits the form,
    // with a valid token and the CSRF token of a form the attacker fetched): refused, and the
    // browser holds no session.
    let b = Browser::start().await;
    let (_, attacker_csrf) = srv.console_sign_in_form().await;
    let forged = format!(
        "<form id=f method=post action='{}'><input name=token value='{}'><input name=csrf value='{attacker_csrf}'></form><script>document.getElementById('f').submit()</script>",
        srv.url("/console/sign-in"),
        srv.operator
    );
    b.c()
        .goto(&format!("data:text/html,{}", urlencoding(&forged)))
        .await
        .expect("the attacker's page");
    assert!(
        b.text("p.error")
            .await
            .contains("did not come from the console's sign-in form"),
        "login CSRF refused"
    );
    b.shot("sign-in-forged").await;
    b.c().goto(&srv.url("/console")).await.expect("console");
    b.el("#token").await;
    assert!(
        !b.c()
            .get_all_cookies()
            .await
            .expect("cookies")
            .iter()
            .any(|c| c.name() == "plinth_session"),
        "no session from a forged sign-in"
    );
    b.finish().await;

    // A viewer sees the machine but no action, and its POST is refused even with its own
    // CSRF token.
    let b = Browser::signed_in(&srv, &srv.viewer).await;
    b.open(&srv, &machine).await;
    assert!(b.absent("#actions").await && b.absent("main form").await);
    b.shot("viewer-machine").await;
    let viewer = b.session_cookie().await;
    let viewer_csrf = b.csrf().await;
    let r = form_post(
        &srv,
        Some(&viewer),
        &state_path,
        &format!("csrf={viewer_csrf}&state=maintenance&version=1"),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    b.finish().await;

    // An operator's session: a POST without the CSRF token, with another session's, or without
    // a session at all, is refused.
    let b = Browser::signed_in(&srv, &srv.operator).await;
    let cookie = b.session_cookie().await;
    for (what, c, body) in [
        (
            "missing CSRF token",
            Some(cookie.as_str()),
            "state=maintenance&version=1".to_string(),
        ),
        (
            "another session's CSRF token",
            Some(cookie.as_str()),
            format!("csrf={viewer_csrf}&state=maintenance&version=1"),
        ),
        ("no session", None, "state=maintenance&version=1".into()),
    ] {
        let r = form_post(&srv, c, &state_path, &body).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{what}");
    }
    // A forged POST from a page (the browser sends the cookie, but the page lacks the token).
    b.open(&srv, &machine).await;
    let status = b
        .c()
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
    b.press("Put in maintenance").await;
    b.state_is("maintenance").await;
    assert_eq!(
        last_event(&srv, &id, "machine.state").await["actor"],
        "token:test-operator"
    );

    // Sign-out ends the session on the server: the old cookie is worth nothing.
    b.click("#sign-out").await;
    b.el("#token").await;
    b.shot("signed-out").await;
    to_sign_in(&page(&srv, &cookie, "/console").await);
    let r = form_post(&srv, Some(&cookie), &state_path, "state=ready").await;
    assert_eq!(
        r.status,
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

/// Percent-encode everything but letters and digits (for a `data:` URL).
fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_says_why_machines_wait_and_what_the_image_cache_holds() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (srv, node_id, extra) = lab(tmp.path()).await;
    // An unknown machine waits for acceptance; node-1 is reinstalling and its cluster's image
    // is not cached, so its boot holds.
    boot(&srv, "mac=52-54-00-d2-00-01").await;
    api_post(
        &srv,
        &format!("/api/v1/machines/{node_id}/reinstall"),
        json!({}),
    )
    .await;
    let schematic = api_get(&srv, &format!("/api/v1/machines/{node_id}/config")).await
        ["schematic_id"]
        .as_str()
        .expect("schematic")
        .to_string();
    let pull = |arch: &str| {
        format!("plinth image pull --version v1.12.11 --arch {arch} --schematic {schematic}")
    };
    crate::talos_configs::boot_script(&srv).await;
    let held = last_event(&srv, &node_id, "boot.script").await;
    assert_eq!(held["detail"]["plan"], "hold", "{held}");
    // And a machine failed, with its reason.
    let broken = register(&srv, json!({"hostname": "broken-1"})).await;
    for (state, reason) in [
        ("inspecting", None),
        ("failed", Some("disk 2 died in inspection")),
    ] {
        api_post(
            &srv,
            &format!("/api/v1/machines/{broken}/state"),
            json!({"state": state, "reason": reason}),
        )
        .await;
    }

    let b = Browser::signed_in(&srv, &srv.viewer).await;
    b.open(&srv, "/console").await;
    let failed = b
        .xtext("//section[@aria-labelledby='h-failed']//tr[td/a[.='broken-1']]")
        .await;
    assert!(failed.contains("disk 2 died in inspection"), "{failed}");
    let running = b
        .xtext("//section[@aria-labelledby='h-reinstalls']//tr[td/a[.='node-1']]")
        .await;
    assert!(
        running.contains("power") && running.contains("left"),
        "stage and time to its deadline: {running}"
    );
    let text = b.text("section[aria-labelledby='h-holds']").await;
    assert!(
        text.contains("Waiting for acceptance: 1 discovered machine(s)"),
        "{text}"
    );
    let reason = b.xtext("//table[@id='holds']//tr[td/a[.='node-1']]").await;
    assert!(
        reason.contains("image not cached") && reason.contains(&pull("amd64")),
        "{reason}"
    );
    let cache = |arch: &str| format!("#images tr[data-cluster='lab'][data-arch='{arch}']");
    for arch in ["amd64", "arm64"] {
        let t = b.text(&cache(arch)).await;
        assert!(t.contains("not cached") && t.contains(&pull(arch)), "{t}");
    }
    b.shot("overview-held").await;

    // The image is imported: amd64 is cached (arm64 still not). The window is then closed under
    // the machine: its next boot holds for that, and the overview says so.
    let k = tmp.path().join("kernel");
    std::fs::write(&k, b"kernel").expect("k");
    let images = plinth::images::ImageCache::new(srv.data_dir.join("images"));
    for name in ["kernel-amd64", "initramfs-amd64.xz"] {
        images
            .import(&schematic, "v1.12.11", name, &k)
            .expect("import");
    }
    let cfg = support::config(&srv.db, &extra);
    let store = plinth::app::open_store(&cfg, false).await.expect("store");
    let configs =
        plinth::app::config_service(&store, plinth::app::secret_box(&cfg).expect("key"), None);
    let node = plinth::domain::MachineId(node_id.parse().expect("uuid"));
    assert!(configs
        .close_window(node, "closed by the test", "test")
        .await
        .expect("close"));
    crate::talos_configs::boot_script(&srv).await;
    b.open(&srv, "/console").await;
    let t = b.text(&cache("amd64")).await;
    assert!(t.contains("cached") && !t.contains("not cached"), "{t}");
    let t = b.text(&cache("arm64")).await;
    assert!(t.contains("not cached"), "{t}");
    let reason = b.xtext("//table[@id='holds']//tr[td/a[.='node-1']]").await;
    assert!(reason.contains("window closed"), "{reason}");
    b.shot("overview-window-closed").await;
    b.finish().await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_machines_show_the_switch_port_their_relayed_dhcp_came_from() {
    // Plinth serves DHCP in a namespace; a relay agent relays a machine's DISCOVER and REQUEST
    // from switch port Gi1/0/12 of leaf-1. Plinth is stopped, and a server on the same database
    // (the same key) shows the machine once it has network-booted.
    let db = TestDb::new(Backend::Sqlite).await;
    let key = db.dir.path().join("test.key");
    support::write_key(&key);
    let dhcp_dir = db.dir.path().join("dhcp");
    std::fs::create_dir_all(&dhcp_dir).expect("mkdir");
    std::fs::copy(&key, dhcp_dir.join("secret.key")).expect("same key");
    let mac = [0x52, 0x54, 0, 0x87, 0, 1];
    {
        let mut lab = crate::relay_pinning::relay_lab("cs", &dhcp_dir, &db.url);
        crate::relay_pinning::relayed_lease(&mut lab.agent, &mac, 0x0870_0001, b"Gi1/0/12");
    }
    // This server serves DHCP for the same subnet (on loopback, a port of its own, where nobody
    // asks): its overview counts the lease.
    let srv = TestServer::start_on(
        db,
        &format!(
            "[dhcp]\nenabled = true\ninterfaces = [\"lo\"]\nport = 0\nproxy_port = 0\n\
             boot_url = \"http://127.0.0.1:8080\"\n{}",
            crate::relay_pinning::RELAYED_SUBNET
        ),
    )
    .await;
    boot(&srv, "mac=52-54-00-87-00-01&serial=SN-RELAYED").await;
    let id = api_get(&srv, "/api/v1/machines/lookup?mac=52:54:00:87:00:01").await["id"]
        .as_str()
        .expect("discovered")
        .to_string();

    let b = Browser::signed_in(&srv, &srv.operator).await;
    b.open(&srv, "/console/discovered").await;
    let port = b
        .text(&format!("article[data-machine='{id}'] dd.switch-port"))
        .await;
    for want in [
        "Gi1/0/12",
        &hex::encode(b"Gi1/0/12"),
        "leaf-1",
        "10.86.0.1",
        "lease of 52:54:00:87:00:01",
    ] {
        assert!(port.contains(want), "{want} in {port}");
    }
    b.shot("discovered-switch-port").await;
    // The machine's page says it too.
    b.open(&srv, &format!("/console/machines/{id}")).await;
    let t = b.text("p.switch-port").await;
    assert!(t.contains("Gi1/0/12") && t.contains("leaf-1"), "{t}");
    // The overview: the subnet's pool has one address in use.
    b.open(&srv, "/console").await;
    let pool = b
        .xtext("//section[@aria-labelledby='h-pools']//tr[td[.='10.86.0.0/24']]")
        .await;
    assert!(pool.contains("1 (0 %)") && pool.contains("101"), "{pool}");
    b.finish().await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_fits_a_phone_works_from_the_keyboard_and_says_states_in_words() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (srv, node_id, _) = lab(tmp.path()).await;
    let long = register(
        &srv,
        json!({"hostname": "a-machine-with-a-rather-long-host-name-for-a-phone-screen",
               "site": "ams1", "rack": "r7", "rack_unit": 3,
               "serial": "SERIAL-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789",
               "model": "PowerEdge-R650-with-an-extremely-long-unbroken-model-name-xxxxxxxxxxxxxxxx",
               "bmc": {"url": "https://127.0.0.1:1/redfish/v1/Systems/System.Embedded.1-with-a-long-path",
                       "username": "root", "password": "calvin"},
               "interfaces": [{"mac": "52:54:00:d3:00:01", "boot": true, "ipv4": "10.9.8.7"},
                              {"mac": "52:54:00:d3:00:02"}]}),
    )
    .await;
    boot(&srv, "mac=52-54-00-d3-00-01").await;
    boot(&srv, "mac=52-54-00-d3-00-09&serial=SN-PHONE-DISCOVERED").await;

    // From the keyboard alone: the token field has the focus; type the token, press Enter.
    let b = Browser::start().await;
    b.c().set_window_size(PHONE, 844).await.expect("resize");
    b.open(&srv, "/console").await;
    assert_eq!(
        b.focused().await.0,
        "INPUT",
        "the token field has the focus"
    );
    assert!(b.fits().await, "the sign-in page scrolls sideways");
    b.shot("phone-sign-in").await;
    b.c()
        .active_element()
        .await
        .expect("focus")
        .send_keys(&format!("{}{}", srv.operator, Key::Enter))
        .await
        .expect("type");
    b.el("#signed-in-as").await;

    // Every page fits 390 px, and every state colour comes with the state's name.
    let pages = [
        ("overview", "/console".to_string()),
        ("racks", "/console/racks".into()),
        ("machines", "/console/machines".into()),
        ("machine", format!("/console/machines/{long}")),
        ("node", format!("/console/machines/{node_id}")),
        ("discovered", "/console/discovered".into()),
        ("events", "/console/events".into()),
    ];
    for (name, path) in &pages {
        b.open(&srv, path).await;
        b.shot(&format!("phone-{name}")).await;
        assert!(b.fits().await, "{path} scrolls sideways at {PHONE} px");
        let (coloured, only_colour) = b.states_only_in_colour().await;
        assert!(only_colour.is_empty(), "{path}: {only_colour:?}");
        if *name != "events" {
            assert!(coloured > 0, "{path} shows states");
        }
    }

    // Tab: first the skip link, which leads into the page.
    b.open(&srv, &format!("/console/machines/{long}")).await;
    b.keys(&[Key::Tab]).await;
    let (tag, text, outlined) = b.focused().await;
    assert_eq!((tag.as_str(), text.as_str()), ("A", "Skip to content"));
    assert!(outlined, "the focus is visible");
    b.keys(&[Key::Enter]).await;
    let url = b.c().current_url().await.expect("url");
    assert_eq!(url.fragment(), Some("main"), "{url}");
    // An action by keyboard: tab to it, press Enter.
    assert!(b.tab_to("Put in maintenance").await, "reachable by Tab");
    let (_, _, outlined) = b.focused().await;
    assert!(outlined, "the focused button shows its focus");
    b.shot("phone-keyboard-focus").await;
    b.keys(&[Key::Enter]).await;
    b.state_is("maintenance").await;
    assert!(b.fits().await, "after the action too");
    b.finish().await;
    srv.finish().await;
}

/// Sessions on both databases without a browser: signing in needs the form's cookie and token
/// (login CSRF); a session lasts only while its token is live, only its hash is stored; its
/// live event stream ends when it signs out or expires.
async fn sessions_follow_their_token(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let client = no_redirects();
    let sign_in = |cookie: Option<String>, body: String, cross_site: bool| {
        let mut r = client
            .post(srv.url("/console/sign-in"))
            .header("content-type", "application/x-www-form-urlencoded");
        if let Some(c) = cookie {
            r = r.header("cookie", c);
        }
        if cross_site {
            r = r.header("sec-fetch-site", "cross-site");
        }
        r.body(body).answer()
    };
    // Login CSRF: without the form's cookie and token, with another form's token, or marked
    // cross-site by the browser, a valid token signs nobody in.
    let (form, csrf) = srv.console_sign_in_form().await;
    let (_, other_csrf) = srv.console_sign_in_form().await;
    let token = &srv.operator;
    for (what, cookie, body, cross) in [
        ("no cookie, no token", None, format!("token={token}"), false),
        (
            "token without its cookie",
            None,
            format!("token={token}&csrf={csrf}"),
            false,
        ),
        (
            "cookie without the token",
            Some(form.clone()),
            format!("token={token}"),
            false,
        ),
        (
            "another form's token",
            Some(form.clone()),
            format!("token={token}&csrf={other_csrf}"),
            false,
        ),
        (
            "cross-site",
            Some(form.clone()),
            format!("token={token}&csrf={csrf}"),
            true,
        ),
    ] {
        let r = sign_in(cookie, body, cross).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{what}");
        assert!(
            support::set_cookie(&r, "plinth_session").is_none(),
            "{what}"
        );
    }
    // From the form: a session, and back where the browser wanted to go.
    let r = sign_in(
        Some(form.clone()),
        format!("token={token}&csrf={csrf}&next=/console/racks"),
        false,
    )
    .await
    .expect_status(StatusCode::SEE_OTHER);
    assert_eq!(r.header("location"), "/console/racks");
    let sets: Vec<&str> = r
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let session = sets
        .iter()
        .find(|c| c.starts_with("plinth_session="))
        .expect("session cookie");
    assert!(
        session.contains("HttpOnly")
            && session.contains("SameSite=Strict")
            && session.contains("Path=/"),
        "{session}"
    );
    assert!(
        !session.contains("Secure"),
        "plain http public URL: {session}"
    );
    assert!(
        sets.iter()
            .any(|c| c.starts_with("plinth_sign_in=;") && c.contains("Max-Age=0")),
        "the form's cookie is cleared: {sets:?}"
    );
    let cookie = support::set_cookie(&r, "plinth_session").expect("session");
    let id = cookie.trim_start_matches("plinth_session=").to_string();
    page(&srv, &cookie, "/console/machines")
        .await
        .expect_status(StatusCode::OK);
    to_sign_in(&page(&srv, "plinth_session=forged", "/console/machines").await);
    // A wrong token does not sign in.
    let r = sign_in(
        Some(form.clone()),
        format!("token=plinth_nope&csrf={csrf}"),
        false,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(support::set_cookie(&r, "plinth_session").is_none());

    // The cookie's value is not in the database, only its SHA-256.
    let store = plinth::app::open_store(&support::config(&srv.db, ""), false)
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

    // The live stream ends when its session signs out...
    let stream = open_stream(&srv, &cookie).await;
    let csrf = support::form_field(&page(&srv, &cookie, "/console").await.text, "csrf");
    let r = form_post(
        &srv,
        Some(&cookie),
        "/console/sign-out",
        &format!("csrf={csrf}"),
    )
    .await;
    to_sign_in(&r);
    assert_ends(stream, "signed out").await;
    to_sign_in(&page(&srv, &cookie, "/console").await);
    // ...and when it expires.
    let cookie = srv.console_session(&srv.operator).await;
    let stream = open_stream(&srv, &cookie).await;
    expire_sessions(&srv.db).await;
    assert_ends(stream, "expired").await;
    to_sign_in(&page(&srv, &cookie, "/console").await);

    // Revoking the token ends its sessions.
    let cookie = srv.console_session(&srv.operator).await;
    let op = api_get(&srv, "/api/v1/tokens")
        .await
        .as_array()
        .expect("tokens")
        .iter()
        .find(|t| t["name"] == "test-operator")
        .expect("operator token")["id"]
        .as_str()
        .expect("id")
        .to_string();
    srv.req(Method::DELETE, &format!("/api/v1/tokens/{op}"), &srv.admin)
        .answer()
        .await
        .expect_status(StatusCode::NO_CONTENT);
    to_sign_in(&page(&srv, &cookie, "/console/machines").await);
    let hash = plinth::service::auth::token_hash(cookie.trim_start_matches("plinth_session="));
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

/// Behind an https public URL, the session cookie, the sign-in form's cookie and the cookie that
/// clears it at sign-out are all `Secure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_are_secure_behind_an_https_public_url() {
    let srv = TestServer::start_with(
        Backend::Sqlite,
        "[boot]\npublic_url = \"https://plinth.example.test\"\n",
    )
    .await;
    let secure = |r: &Answer, name: &str| {
        let all: Vec<&str> = r
            .headers
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter(|c| c.starts_with(&format!("{name}=")))
            .collect();
        assert!(
            !all.is_empty() && all.iter().all(|c| c.contains("; Secure")),
            "{name}: {all:?}"
        );
    };
    let form = no_redirects()
        .get(srv.url("/console/sign-in"))
        .answer()
        .await
        .expect_status(StatusCode::OK);
    secure(&form, "plinth_sign_in");
    let signed = no_redirects()
        .post(srv.url("/console/sign-in"))
        .header(
            "cookie",
            support::set_cookie(&form, "plinth_sign_in").expect("cookie"),
        )
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "token={}&csrf={}",
            srv.viewer,
            support::form_field(&form.text, "csrf")
        ))
        .answer()
        .await
        .expect_status(StatusCode::SEE_OTHER);
    secure(&signed, "plinth_session");
    secure(&signed, "plinth_sign_in");
    let cookie = support::set_cookie(&signed, "plinth_session").expect("session");
    let csrf = support::form_field(&page(&srv, &cookie, "/console").await.text, "csrf");
    let out = form_post(
        &srv,
        Some(&cookie),
        "/console/sign-out",
        &format!("csrf={csrf}"),
    )
    .await;
    secure(&out, "plinth_session");
    srv.finish().await;
}

/// The console's live event stream, opened with the session cookie.
async fn open_stream(srv: &TestServer, cookie: &str) -> reqwest::Response {
    let r = no_redirects()
        .get(srv.url("/console/stream"))
        .header("cookie", cookie)
        .send()
        .await
        .expect("stream");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream")));
    r
}

/// The stream's body ends (within a minute: the session is checked every few seconds).
async fn assert_ends(mut stream: reqwest::Response, why: &str) {
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(_chunk) = stream.chunk().await.expect("chunk") {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream did not end when the session {why}"
    );
}

/// Move every console session's expiry into the past, as time would.
async fn expire_sessions(db: &TestDb) {
    let past = chrono::Utc::now() - chrono::Duration::minutes(1);
    support::with_conn!(&db.url, |c| {
        sqlx::query("UPDATE console_sessions SET expires_at = $1")
            .bind(past)
            .execute(&mut c)
            .await
            .expect("expire");
    });
}

/// The texts of the steps each rollout row showed, recorded in the page as its rollout part
/// changes (without a reload the record stays).
const RECORD_STEPS: &str = "window.plinthPage = 'not reloaded';
     window.plinthSteps = [];
     const look = () => document.querySelectorAll('#rollout-nodes tr[data-node]').forEach(tr => {
       const s = tr.dataset.node + ' ' + tr.dataset.step;
       const mine = window.plinthSteps.filter(x => x.startsWith(tr.dataset.node + ' '));
       if (mine[mine.length - 1] !== s) { window.plinthSteps.push(s); }
     });
     new MutationObserver(look).observe(document.getElementById('rollout'), {childList: true, subtree: true});
     return true;";

/// The newest event of `kind` (any machine).
async fn newest(srv: &TestServer, kind: &str) -> Value {
    api_get(srv, &format!("/api/v1/events?kind={kind}"))
        .await
        .as_array()
        .and_then(|a| a.last().cloned())
        .unwrap_or_else(|| panic!("no {kind} event"))
}

/// A rolling upgrade of the upgrade tests' lab (three control planes and four workers of Talos
/// API stand-ins; w-3, in the last batch, never comes back from its reboot, so the rollout stays
/// active until it is aborted) watched from the cluster's page: the rollout and its nodes'
/// steps appear without a reload, an operator pauses it (and may not resume it), a viewer sees
/// no action and its forged POSTs are refused, an admin resumes it from the keyboard on a phone
/// and aborts it with the cluster's name typed; each action is an event naming the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_is_watched_live_and_paused_resumed_and_aborted_by_role() {
    use crate::upgrades;
    let port = free_port();
    let extra = upgrades::extra(port);
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let inv = upgrades::write_inventory(
        tmp.path(),
        31,
        "  maxWorkersPerRack: 2\n  nodeTimeoutSeconds: 600\n",
    );
    crate::talos_configs::apply_dir(&srv, &extra, &inv).await;
    let lib = upgrades::library(&srv.db, &extra, "test-library").await;
    let lab = upgrades::bring_up(&srv.base, &srv.admin, &lib, port, 31, 2000).await;
    lab.get("w-3")
        .set_upgrade_fault(Some(crate::support::talos_node::UpgradeFault::NeverBack));

    // The list: the declared cluster, its version and nodes, no rollout yet.
    let b = Browser::signed_in(&srv, &srv.operator).await;
    b.open(&srv, "/console/clusters").await;
    b.shot("upgrade-clusters").await;
    let row = b.text("#clusters tr[data-cluster='lab']").await;
    assert!(
        row.contains("v1.12.11") && row.contains('7') && row.contains("none yet"),
        "{row}"
    );
    // The cluster's page, open before the rollout starts: it appears, and its nodes' steps,
    // without a reload.
    b.open(&srv, "/console/clusters/lab").await;
    assert!(b.text("#rollout").await.contains("No rolling upgrade"));
    assert!(b.absent("#rollout-actions form").await);
    b.el("#cluster-events[data-live]").await;
    assert_eq!(b.js(RECORD_STEPS).await, json!(true));
    lib.upgrades
        .start("lab", "v1.13.9", None, "token:test-admin")
        .await
        .expect("start");
    b.el("#rollout-nodes tr[data-node='cp-2'][data-step='done']")
        .await;
    b.el("#cluster-events li[data-kind='upgrade.node_done']")
        .await;
    b.shot("upgrade-live").await;
    assert_eq!(b.js("return window.plinthPage;").await, "not reloaded");
    let steps: Vec<String> = b
        .js("return window.plinthSteps;")
        .await
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s.as_str())
        .filter(|s| s.starts_with("cp-2 "))
        .map(str::to_string)
        .collect();
    assert!(
        steps.contains(&"cp-2 rebooting".to_string())
            && steps.last().map(String::as_str) == Some("cp-2 done"),
        "cp-2's steps seen live: {steps:?}"
    );
    let order = b
        .texts("#rollout-nodes tr[data-node] td:nth-child(2) a")
        .await;
    assert_eq!(
        order,
        ["cp-2", "cp-3", "cp-1", "w-1", "w-2", "w-4", "w-3"],
        "rollout order"
    );
    assert!(b.text("#rollout-target").await.contains("v1.13.9"));

    // The operator pauses (the button came with the rollout, without a reload); resuming is
    // for admins: no button, and a POST with the operator's own CSRF token is refused.
    assert!(b.absent("#resume-upgrade").await && b.absent("#abort-upgrade").await);
    b.press("Pause the rollout").await;
    b.xpath("//dd[@id='rollout-state'][contains(., 'paused')]")
        .await;
    assert!(b.absent("#pause-upgrade").await && b.absent("#resume-upgrade").await);
    b.shot("upgrade-paused").await;
    let paused = newest(&srv, "upgrade.paused").await;
    assert_eq!(paused["actor"], "token:test-operator", "{paused}");
    let operator = b.session_cookie().await;
    let operator_csrf = b.csrf().await;
    let r = form_post(
        &srv,
        Some(&operator),
        "/console/clusters/lab/upgrade/resume",
        &format!("csrf={operator_csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "operators do not resume");
    b.finish().await;

    // A viewer sees the rollout's state in words and no action; its forged POSTs are refused.
    let b = Browser::signed_in(&srv, &srv.viewer).await;
    b.open(&srv, "/console/clusters/lab").await;
    assert!(b.text("#rollout-state").await.contains("paused"));
    assert!(b.absent("#rollout-actions form").await && b.absent("main form").await);
    b.shot("upgrade-viewer").await;
    let viewer = b.session_cookie().await;
    let viewer_csrf = b.csrf().await;
    for (action, body) in [
        ("resume", format!("csrf={viewer_csrf}")),
        ("abort", format!("csrf={viewer_csrf}&confirm=lab")),
        ("pause", format!("csrf={viewer_csrf}")),
    ] {
        let r = form_post(
            &srv,
            Some(&viewer),
            &format!("/console/clusters/lab/upgrade/{action}"),
            &body,
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "a viewer's {action}");
    }
    b.finish().await;
    assert_eq!(
        upgrades::status(&srv.base, &srv.viewer).await["rollout"]["state"],
        "paused"
    );

    // An admin on a phone, from the keyboard: the pages fit, states are words, Resume by Tab
    // and Enter.
    let b = Browser::signed_in(&srv, &srv.admin).await;
    b.c().set_window_size(PHONE, 844).await.expect("resize");
    for path in ["/console", "/console/clusters", "/console/clusters/lab"] {
        b.open(&srv, path).await;
        b.shot(&format!(
            "phone-upgrade-{}",
            path.trim_start_matches('/').replace('/', "-")
        ))
        .await;
        assert!(b.fits().await, "{path} scrolls sideways at {PHONE} px");
        let (coloured, only_colour) = b.states_only_in_colour().await;
        assert!(only_colour.is_empty(), "{path}: {only_colour:?}");
        assert!(coloured > 0, "{path} shows states");
        if path != "/console/clusters/lab" {
            let row = b.text("#clusters tr[data-cluster='lab']").await;
            assert!(
                row.contains("paused") && row.contains("of 7 nodes done"),
                "{row}"
            );
        }
    }
    // Without the CSRF token, even an admin's session is refused.
    let admin = b.session_cookie().await;
    let r = form_post(
        &srv,
        Some(&admin),
        "/console/clusters/lab/upgrade/abort",
        "confirm=lab",
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "no CSRF token");
    for path in ["/console/clusters/nope", "/console/clusters/nope/rollout"] {
        assert_eq!(
            page(&srv, &admin, path).await.status,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    assert!(b.tab_to("Resume the rollout").await, "reachable by Tab");
    b.keys(&[Key::Enter]).await;
    b.xpath("//dd[@id='rollout-state'][contains(., 'running')]")
        .await;
    assert_eq!(
        newest(&srv, "upgrade.resumed").await["actor"],
        "token:test-admin"
    );
    // w-3 goes down and never comes back: the page shows it rebooting, live.
    b.c()
        .wait()
        .at_most(Duration::from_secs(120))
        .for_element(Locator::Css(
            "#rollout-nodes tr[data-node='w-3'][data-step='rebooting']",
        ))
        .await
        .expect("w-3 rebooting on the page");
    // Aborting without the typed name is refused and changes nothing; with it, the rollout
    // ends, and the page says where it stopped and what was seen there.
    b.click("#abort-upgrade button").await;
    assert!(b.text("p.error").await.contains("type `lab`"));
    assert_eq!(
        upgrades::status(&srv.base, &srv.viewer).await["rollout"]["state"],
        "running"
    );
    b.open(&srv, "/console/clusters/lab").await;
    let form = b.el("#abort-upgrade").await;
    fill(&form, &[("confirm", "lab")]).await;
    b.click("#abort-upgrade button").await;
    b.xpath("//dd[@id='rollout-state'][contains(., 'aborted')]")
        .await;
    let stopped = b.text("#rollout-stopped").await;
    assert!(
        stopped.contains("w-3") && stopped.contains("aborted"),
        "{stopped}"
    );
    assert!(b.text("#rollout-error").await.contains("token:test-admin"));
    assert!(b.absent("#rollout-actions form").await);
    assert!(b.fits().await);
    b.shot("phone-upgrade-aborted").await;
    let s = upgrades::status(&srv.base, &srv.viewer).await;
    assert_eq!(s["rollout"]["state"], "aborted", "{s}");
    assert_eq!(
        newest(&srv, "upgrade.aborted").await["actor"],
        "token:test-admin"
    );
    b.finish().await;
    drop(lab);
    srv.finish().await;
}
