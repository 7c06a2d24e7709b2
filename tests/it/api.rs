//! The inventory API over real HTTP, against SQLite and against PostgreSQL.

use crate::support;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::{Ask as _, Backend, TestServer};

fn machine(host: &str, mac: &str) -> Value {
    json!({"hostname": host, "interfaces": [{"mac": mac}]})
}

async fn create(s: &TestServer, body: &Value) -> Value {
    let r = s
        .req(Method::POST, "/api/v1/machines", &s.operator)
        .json(body)
        .answer()
        .await
        .expect_status(StatusCode::CREATED);
    r.json()
}

/// `PATCH /api/v1/machines/{id}` as the operator, with `If-Match: version` when given.
async fn edit(s: &TestServer, id: &str, version: Option<&str>, body: &Value) -> support::Answer {
    let mut r = s.req(
        Method::PATCH,
        &format!("/api/v1/machines/{id}"),
        &s.operator,
    );
    if let Some(v) = version {
        r = r.header("If-Match", v);
    }
    r.json(body).answer().await
}

async fn crud_with_versions_and_events(b: Backend) {
    let s = TestServer::start(b).await;
    let body = json!({
        "hostname": "Node-1", "serial": "SN1", "asset_tag": "A-1", "smbios_uuid": "4c4c4544-0031-3510-8052-b4c04f4e3132",
        "rack": "r1", "rack_unit": 12, "role": "control-plane", "cluster": "prod",
        "interfaces": [{"mac": "52-54-00-AA-00-01", "ipv4": "10.0.0.11"}, {"mac": "52:54:00:aa:00:02"}],
        "disks": [{"serial": "D1", "wwid": "eui.1", "model": "Samsung PM9A3", "size_bytes": 960197124096_u64, "type": "nvme", "bus_path": "/pci0000:00/0000:00:01.1"}],
        "bmc": {"url": "https://10.1.0.11", "username": "root", "password": "calvin-secret", "tls": "insecure"}
    });
    let r = s
        .req(Method::POST, "/api/v1/machines", &s.operator)
        .json(&body)
        .answer()
        .await
        .expect_status(StatusCode::CREATED);
    assert_eq!(r.headers["etag"], "\"1\"");
    let loc = r.headers["location"].to_str().expect("loc").to_string();
    let m: Value = r.json();
    assert_eq!(m["hostname"], "node-1");
    assert_eq!(m["interfaces"][0]["mac"], "52:54:00:aa:00:01");
    assert_eq!(
        m["interfaces"][0]["boot"], false,
        "two NICs: no boot NIC is guessed"
    );
    assert_eq!(m["disks"][0]["size_bytes"], 960197124096_u64);
    assert_eq!(m["bmc"]["has_password"], true);
    assert!(
        !m.to_string().contains("calvin-secret"),
        "password never returned"
    );
    assert_eq!(m["state"], "registered");
    let id = m["id"].as_str().expect("id").to_string();
    assert_eq!(loc, format!("/api/v1/machines/{id}"));

    // Read by id and by host name.
    for path in [
        format!("/api/v1/machines/{id}"),
        "/api/v1/machines/NODE-1".to_string(),
    ] {
        let r = s.req(Method::GET, &path, &s.viewer).answer().await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.headers["etag"], "\"1\"");
    }

    // Edit without a version: 428. With a stale one: 412. With the right one: 200, version 2.
    let patch = json!({"rack": "r2", "bmc": {"username": "admin"}});
    edit(&s, &id, None, &patch)
        .await
        .expect_status(StatusCode::PRECONDITION_REQUIRED);
    let r = edit(&s, &id, Some("\"7\""), &patch)
        .await
        .expect_status(StatusCode::PRECONDITION_FAILED);
    let e: Value = r.json();
    assert_eq!(e["error"]["current_version"], 1);
    let r = edit(&s, &id, Some("\"1\""), &patch)
        .await
        .expect_status(StatusCode::OK);
    assert_eq!(r.headers["etag"], "\"2\"");
    let m2: Value = r.json();
    assert_eq!(m2["rack"], "r2");
    assert_eq!(m2["bmc"]["username"], "admin");
    assert_eq!(
        m2["bmc"]["has_password"], true,
        "password kept when not resent"
    );
    assert_eq!(m2["interfaces"], m["interfaces"], "untouched fields stay");
    // The same stale edit again (a second tech with the old version) loses nothing.
    edit(&s, &id, Some("\"1\""), &json!({"rack": "r9"}))
        .await
        .expect_status(StatusCode::PRECONDITION_FAILED);
    // Version in the body works too; read-only fields may come back unchanged but not changed.
    let mut doc = m2.clone();
    doc["rack_unit"] = json!(13);
    edit(&s, &id, None, &doc)
        .await
        .expect_status(StatusCode::OK);
    let r = edit(&s, &id, None, &json!({"version": 3, "state": "installed"}))
        .await
        .expect_status(StatusCode::UNPROCESSABLE_ENTITY);
    let e: Value = r.json();
    assert_eq!(e["error"]["fields"][0]["field"], "state");

    // Events: who, what, before/after; never the password.
    let ev: Value = s
        .get_json(
            &format!("/api/v1/events?machine={id}&kind=machine."),
            &s.viewer,
        )
        .await;
    let ev = ev.as_array().expect("array");
    assert_eq!(ev.len(), 3);
    assert_eq!(ev[0]["kind"], "machine.created");
    assert_eq!(ev[0]["actor"], "token:test-operator");
    assert_eq!(
        ev[1]["detail"]["changes"]["rack"],
        json!({"before": "r1", "after": "r2"})
    );
    assert_eq!(
        ev[2]["detail"]["changes"]["rack_unit"],
        json!({"before": 12, "after": 13})
    );
    assert!(!Value::Array(ev.clone())
        .to_string()
        .contains("calvin-secret"));

    // Delete needs the version, then the machine is gone but its history stays.
    s.req(
        Method::DELETE,
        &format!("/api/v1/machines/{id}"),
        &s.operator,
    )
    .answer()
    .await
    .expect_status(StatusCode::PRECONDITION_REQUIRED);
    s.req(
        Method::DELETE,
        &format!("/api/v1/machines/{id}"),
        &s.operator,
    )
    .header("If-Match", "\"3\"")
    .answer()
    .await
    .expect_status(StatusCode::NO_CONTENT);
    s.req(Method::GET, &format!("/api/v1/machines/{id}"), &s.viewer)
        .answer()
        .await
        .expect_status(StatusCode::NOT_FOUND);
    let ev: Value = s
        .get_json("/api/v1/events?kind=machine.deleted", &s.viewer)
        .await;
    assert_eq!(ev.as_array().expect("array").len(), 1);
    // The MAC is free again.
    create(&s, &machine("node-2", "52:54:00:aa:00:01")).await;
    s.finish().await;
}

async fn conflicts_name_the_owner(b: Backend) {
    let s = TestServer::start(b).await;
    let first = create(&s, &json!({"hostname": "a", "serial": "S-A", "interfaces": [{"mac": "52:54:00:00:00:0a", "ipv4": "10.0.0.10"}]})).await;
    for (body, field) in [
        (machine("b", "52:54:00:00:00:0a"), "interfaces[0].mac"),
        (json!({"hostname": "A"}), "hostname"),
        (json!({"hostname": "c", "serial": "S-A"}), "serial"),
        (
            json!({"hostname": "d", "interfaces": [{"mac": "52:54:00:00:00:0d", "ipv4": "10.0.0.10"}]}),
            "interfaces[0].ipv4",
        ),
    ] {
        let r = s
            .req(Method::POST, "/api/v1/machines", &s.operator)
            .json(&body)
            .answer()
            .await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{body}");
        let e: Value = r.json();
        let c = &e["error"]["conflicts"][0];
        assert_eq!(c["field"], field);
        assert_eq!(c["owner"]["name"], "a");
        assert_eq!(c["owner"]["id"], first["id"]);
        assert!(e["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("already belongs to machine a"));
    }
    // Editing another machine onto a taken MAC conflicts too.
    let b2 = create(&s, &machine("b", "52:54:00:00:00:0b")).await;
    let b2 = b2["id"].as_str().expect("id");
    edit(
        &s,
        b2,
        Some("1"),
        &json!({"interfaces": [{"mac": "52:54:00:00:00:0a"}]}),
    )
    .await
    .expect_status(StatusCode::CONFLICT);
    s.finish().await;
}

async fn bad_input_names_the_field(b: Backend) {
    let s = TestServer::start_with(b, "max_body_bytes = 4096").await;
    let post = |body: String| {
        s.req(Method::POST, "/api/v1/machines", &s.operator)
            .header("content-type", "application/json")
            .body(body)
            .answer()
    };
    let r = post("{\"hostname\": \"x\",".into()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let e: Value = r.json();
    assert_eq!(e["error"]["code"], "malformed_json");
    for (body, field) in [
        (json!({"hostname": "x", "rack_unit": "twelve"}), "rack_unit"),
        (
            json!({"hostname": "x", "interfaces": [{"mac": "52:54:00:00:00:01"}, {"mac": "nope"}]}),
            "interfaces[1].mac",
        ),
        (json!({"hostname": "x", "rakc": "r1"}), "rakc"),
        (json!({"hostname": "x", "role": "master"}), "role"),
        (
            json!({"hostname": "x", "disks": [{"type": "tape"}]}),
            "disks[0].type",
        ),
    ] {
        let r = post(body.to_string()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
        let e: Value = r.json();
        assert_eq!(e["error"]["fields"][0]["field"], field, "{e}");
    }
    for (body, field) in [
        (json!({"hostname": "bad_host"}), "hostname"),
        (json!({"rack_unit": 99}), "rack_unit"),
        (
            json!({"bmc": {"url": "https://x", "username": "u", "tls": "pinned"}}),
            "bmc.fingerprint",
        ),
        (
            json!({"interfaces": [{"mac": "52:54:00:00:00:01", "ipv4": "255.255.255.255"}]}),
            "interfaces[0].ipv4",
        ),
    ] {
        let r = post(body.to_string()).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let e: Value = r.json();
        assert_eq!(e["error"]["fields"][0]["field"], field, "{e}");
    }
    // A machine nothing could ever name or match (issue 16): refused, naming the fields.
    for body in [json!({}), json!({"rack": "r21", "role": "worker"})] {
        let r = post(body.to_string()).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let e: Value = r.json();
        let msg = e["error"]["fields"][0]["message"].as_str().unwrap_or("");
        assert!(
            [
                "hostname",
                "interfaces[].mac",
                "serial",
                "asset_tag",
                "smbios_uuid"
            ]
            .iter()
            .all(|f| msg.contains(f)),
            "{e}"
        );
    }
    s.req(Method::POST, "/api/v1/machines", &s.operator)
        .header("content-type", "text/plain")
        .body("{}")
        .answer()
        .await
        .expect_status(StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let big = json!({"hostname": "x", "model": "m".repeat(10_000)}).to_string();
    let r = post(big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    s.req(Method::GET, "/api/v1/machines?limit=5000", &s.viewer)
        .answer()
        .await
        .expect_status(StatusCode::BAD_REQUEST);
    let r = s
        .req(Method::GET, "/api/v1/machines?state=asleep", &s.viewer)
        .answer()
        .await;
    let e: Value = r.json();
    assert_eq!(e["error"]["fields"][0]["field"], "state");
    edit(&s, "nothere", Some("1"), &json!({}))
        .await
        .expect_status(StatusCode::NOT_FOUND);
    // Nothing of the above was stored.
    let page: Value = s.get_json("/api/v1/machines", &s.viewer).await;
    assert_eq!(page["total"], 0);
    s.finish().await;
}

async fn tokens_and_roles(b: Backend) {
    let s = TestServer::start(b).await;
    s.client
        .get(s.url("/api/v1/machines"))
        .answer()
        .await
        .expect_status(StatusCode::UNAUTHORIZED);
    s.req(Method::GET, "/api/v1/machines", "plinth_notatoken")
        .answer()
        .await
        .expect_status(StatusCode::UNAUTHORIZED);
    s.req(Method::POST, "/api/v1/machines", &s.viewer)
        .json(&machine("v", "52:54:00:00:01:01"))
        .answer()
        .await
        .expect_status(StatusCode::FORBIDDEN);
    s.req(Method::GET, "/api/v1/tokens", &s.operator)
        .answer()
        .await
        .expect_status(StatusCode::FORBIDDEN);
    let r = s
        .req(Method::POST, "/api/v1/tokens", &s.admin)
        .json(&json!({"name": "ci-bot", "role": "viewer"}))
        .answer()
        .await
        .expect_status(StatusCode::CREATED);
    let minted: Value = r.json();
    let secret = minted["token"].as_str().expect("token").to_string();
    s.req(Method::GET, "/api/v1/machines", &secret)
        .answer()
        .await
        .expect_status(StatusCode::OK);
    let list: Value = s.get_json("/api/v1/tokens", &s.admin).await;
    assert!(
        !list.to_string().contains(&secret),
        "secrets are never listed"
    );
    assert_eq!(list.as_array().expect("arr").len(), 4);
    let id = minted["info"]["id"].as_str().expect("id");
    s.req(Method::DELETE, &format!("/api/v1/tokens/{id}"), &s.admin)
        .answer()
        .await
        .expect_status(StatusCode::NO_CONTENT);
    let r = s
        .req(Method::GET, "/api/v1/machines", &secret)
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "revoked");
    let r = s
        .req(Method::POST, "/api/v1/tokens", &s.admin)
        .json(&json!({"name": "x", "role": "root"}))
        .answer()
        .await;
    let e: Value = r.json();
    assert_eq!(e["error"]["fields"][0]["field"], "role");
    s.finish().await;
}

async fn list_filters_and_pages(b: Backend) {
    let s = TestServer::start(b).await;
    let mut spec = Vec::new();
    for i in 0..25 {
        spec.push(json!({
            "hostname": format!("n{i:02}"),
            "rack": if i % 2 == 0 { "r-even" } else { "r-odd" },
            "role": if i < 3 { "control-plane" } else { "worker" },
            "cluster": "prod",
            "serial": format!("SER{i:04}"),
            "asset_tag": format!("AT{i}"),
            "smbios_uuid": format!("00000000-0000-4000-8000-{i:012}"),
            "interfaces": [{"mac": format!("52:54:00:10:00:{i:02x}")}],
        }));
    }
    s.req(Method::POST, "/api/v1/machines/import", &s.operator)
        .header("content-type", "application/json")
        .body(Value::Array(spec).to_string())
        .answer()
        .await
        .expect_status(StatusCode::OK);

    let mut seen = Vec::new();
    let mut cursor = String::new();
    for _ in 0..10 {
        let page: Value = s
            .get_json(
                &format!("/api/v1/machines?limit=10&cursor={cursor}"),
                &s.viewer,
            )
            .await;
        assert_eq!(page["total"], 25);
        for m in page["items"].as_array().expect("items") {
            seen.push(m["hostname"].as_str().expect("host").to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    assert_eq!(seen.len(), 25);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 25, "no machine twice across pages");

    for (q, n) in [
        ("rack=r-even", 13),
        ("role=control-plane", 3),
        ("rack=r-odd&role=control-plane", 1),
        ("q=SER001", 10),
        ("q=52:54:00:10:00:1", 9),
        ("q=n2", 5),
        ("q=100%25", 0),
        ("state=registered&cluster=prod", 25),
        ("state=installed", 0),
    ] {
        let page: Value = s
            .get_json(&format!("/api/v1/machines?{q}"), &s.viewer)
            .await;
        assert_eq!(page["total"], n, "{q}");
    }
    for q in [
        "mac=52-54-00-10-00-05",
        "serial=SER0005",
        "asset_tag=AT5",
        "uuid=00000000-0000-4000-8000-000000000005",
        "hostname=N05",
    ] {
        let m: Value = s
            .get_json(&format!("/api/v1/machines/lookup?{q}"), &s.viewer)
            .await;
        assert_eq!(m["hostname"], "n05", "{q}");
    }
    s.req(
        Method::GET,
        "/api/v1/machines/lookup?serial=nope",
        &s.viewer,
    )
    .answer()
    .await
    .expect_status(StatusCode::NOT_FOUND);
    s.req(
        Method::GET,
        "/api/v1/machines/lookup?serial=a&mac=52:54:00:00:00:01",
        &s.viewer,
    )
    .answer()
    .await
    .expect_status(StatusCode::BAD_REQUEST);
    s.finish().await;
}

async fn csv_import_is_all_or_nothing(b: Backend) {
    let s = TestServer::start(b).await;
    create(
        &s,
        &json!({"hostname": "existing", "interfaces": [{"mac": "52:54:00:20:00:99"}]}),
    )
    .await;
    let bad = "hostname,mac,ipv4,role,rack,rack_unit,bmc_url,bmc_username,bmc_password\n\
               w1,52:54:00:20:00:01,10.1.0.1,worker,r1,1,https://10.2.0.1,root,pw1\n\
               w2,52:54:00:20:00:02,10.1.0.2,worker,r1,2,,,\n\
               w3,52:54:00:20:00:99,10.1.0.3,worker,r1,3,,,\n\
               w4,52:54:00:20:00:04,10.1.0.2,worker,r1,4,,,\n\
               w5,52:54:00:20:00:05,10.1.0.5,chief,r1,5,,,\n\
               w_6,52:54:00:20:00:06,10.1.0.6,worker,r1,77,,,\n";
    let r = s
        .req(Method::POST, "/api/v1/machines/import", &s.operator)
        .header("content-type", "text/csv")
        .body(bad)
        .answer()
        .await
        .expect_status(StatusCode::UNPROCESSABLE_ENTITY);
    let e: Value = r.json();
    let rows: Vec<(u64, String)> = e["error"]["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["line"].as_u64().expect("line"),
                r["field"].as_str().expect("field").to_string(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (4, "mac".to_string()),
            (5, "ipv4".to_string()),
            (6, "role".to_string()),
            (7, "hostname".to_string()),
            (7, "rack_unit".to_string()),
        ],
        "{e}"
    );
    let page: Value = s.get_json("/api/v1/machines", &s.viewer).await;
    assert_eq!(page["total"], 1, "nothing imported");

    let good = "hostname,mac,ipv4,role,rack,rack_unit,bmc_url,bmc_username,bmc_password\n\
                w1,52:54:00:20:00:01,10.1.0.1,worker,r1,1,https://10.2.0.1,root,pw1\n\
                w2,52:54:00:20:00:02,10.1.0.2,worker,r1,2,,,\n";
    let r = s
        .req(Method::POST, "/api/v1/machines/import", &s.operator)
        .header("content-type", "text/csv")
        .body(good)
        .answer()
        .await
        .expect_status(StatusCode::OK);
    let res: Value = r.json();
    assert_eq!(res["imported"], 2);
    let w1: Value = s.get_json("/api/v1/machines/w1", &s.viewer).await;
    assert_eq!(w1["bmc"]["has_password"], true);
    assert_eq!(w1["interfaces"][0]["boot"], true);
    let r = s
        .req(Method::POST, "/api/v1/machines/import", &s.operator)
        .header("content-type", "text/csv")
        .body("hostname,colour\nx,blue\n")
        .answer()
        .await;
    let e: Value = r.json();
    assert_eq!(e["error"]["rows"][0]["field"], "colour");
    s.finish().await;
}

/// `import?update=KEY` (issue 16): rows matching a machine by the key replace it in place (id,
/// state, BMC password kept), the others are created, unchanged rows touch nothing; one
/// transaction, so a bad row leaves everything as it was.
async fn import_update_replaces_matching_rows(b: Backend) {
    let s = TestServer::start(b).await;
    let import = |body: &'static str, update: Option<&'static str>| {
        let mut r = s
            .req(Method::POST, "/api/v1/machines/import", &s.operator)
            .header("content-type", "text/csv")
            .body(body);
        if let Some(k) = update {
            r = r.query(&[("update", k)]);
        }
        r.send()
    };
    let first = "hostname,serial,mac,rack,rack_unit,bmc_url,bmc_username,bmc_password\n\
                 u1,S-1,52:54:00:30:00:01,r21,1,https://10.2.0.1,root,pw1\n\
                 u2,S-2,52:54:00:30:00:02,r21,2,,,\n";
    let r = import(first, None).await.expect("import");
    assert_eq!(r.status(), StatusCode::OK);
    let get = |name: &'static str| {
        let req = s.req(Method::GET, &format!("/api/v1/machines/{name}"), &s.viewer);
        async move {
            req.send()
                .await
                .expect("get")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let u1 = get("u1").await;
    // The same sheet again without update: conflicts, as before.
    let r = import(first, None).await.expect("import");
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // Edited: u1 moves to unit 5 (no password column: the stored one stays), u2 unchanged, u3 new.
    let edited = "hostname,serial,mac,rack,rack_unit,bmc_url,bmc_username\n\
                  u1,S-1,52:54:00:30:00:01,r21,5,https://10.2.0.1,root\n\
                  u2,S-2,52:54:00:30:00:02,r21,2,,\n\
                  u3,S-3,52:54:00:30:00:03,r21,3,,\n";
    let r = import(edited, Some("mac")).await.expect("import");
    assert_eq!(r.status(), StatusCode::OK);
    let res: Value = r.json().await.expect("json");
    assert_eq!(res["imported"], 1, "{res}");
    assert_eq!(res["updated"], json!([u1["id"]]), "{res}");
    assert_eq!(res["unchanged"], 1, "{res}");
    let after = get("u1").await;
    assert_eq!(after["id"], u1["id"]);
    assert_eq!(after["rack_unit"], 5);
    assert_eq!(after["version"], u1["version"].as_i64().expect("v") + 1);
    assert_eq!(after["bmc"]["has_password"], true, "password kept");
    assert_eq!(get("u2").await["version"], 1, "unchanged row untouched");
    // A row whose serial belongs to another machine: refused, and nothing of the file applied.
    let bad = "hostname,serial,mac,rack,rack_unit\n\
               u1,S-1,52:54:00:30:00:01,r21,9\n\
               u4,S-2,52:54:00:30:00:04,r21,4\n";
    let r = import(bad, Some("mac")).await.expect("import");
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["rows"][0]["line"], 3, "{e}");
    assert_eq!(e["error"]["rows"][0]["field"], "serial", "{e}");
    assert_eq!(get("u1").await["rack_unit"], 5, "nothing applied");
    // By serial: a row without one is named; an unknown key is a 400 naming `update`.
    let r = import("hostname,mac\nu9,52:54:00:30:00:09\n", Some("serial"))
        .await
        .expect("import");
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["rows"][0]["field"], "serial", "{e}");
    let r = import(first, Some("colour")).await.expect("import");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    s.finish().await;
}

async fn secrets_are_encrypted_at_rest(b: Backend) {
    let s = TestServer::start(b).await;
    let m = create(
        &s,
        &json!({"hostname": "s1", "bmc": {"url": "https://10.9.0.1", "username": "root", "password": "Sup3r-S3cret-BMC"}}),
    )
    .await;
    // Raw column bytes hold no plaintext.
    let raw: Vec<u8> = support::with_conn!(&s.db.url, |c| {
        sqlx::query_scalar("SELECT password_ciphertext FROM bmcs")
            .fetch_one(&mut c)
            .await
            .expect("row")
    });
    assert!(raw.len() > 16);
    assert!(!raw.windows(6).any(|w| w == b"Sup3r-"), "ciphertext only");
    // The service decrypts it for the Redfish client.
    let cfg = support::config(&s.db, "");
    let _ = cfg;
    let all = format!("{}", m);
    assert!(!all.contains("Sup3r"));
    let ev: Value = s.get_json("/api/v1/events", &s.admin).await;
    assert!(!ev.to_string().contains("Sup3r"));
    // The events table is append-only.
    let denied = support::with_conn!(&s.db.url, |c| {
        sqlx::query("UPDATE events SET actor = 'mallory'")
            .execute(&mut c)
            .await
            .is_err()
            && sqlx::query("DELETE FROM events")
                .execute(&mut c)
                .await
                .is_err()
    });
    assert!(denied, "events cannot be rewritten");
    s.finish().await;
}

async fn concurrent_edits_one_wins(b: Backend) {
    let s = TestServer::start(b).await;
    let m = create(&s, &machine("race", "52:54:00:30:00:01")).await;
    let id = m["id"].as_str().expect("id").to_string();
    let mut handles = Vec::new();
    for i in 0..8 {
        let req = s
            .req(
                Method::PATCH,
                &format!("/api/v1/machines/{id}"),
                &s.operator,
            )
            .header("If-Match", "\"1\"")
            .json(&json!({"rack": format!("r{i}")}));
        handles.push(tokio::spawn(async move { req.answer().await.status }));
    }
    let mut ok = 0;
    for h in handles {
        match h.await.expect("join") {
            StatusCode::OK => ok += 1,
            StatusCode::PRECONDITION_FAILED => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(ok, 1, "exactly one edit of version 1 wins");
    let m: Value = s
        .get_json(&format!("/api/v1/machines/{id}"), &s.viewer)
        .await;
    assert_eq!(m["version"], 2);
    s.finish().await;
}

async fn health_metrics_openapi(b: Backend) {
    let s = TestServer::start(b).await;
    s.client
        .get(s.url("/healthz"))
        .answer()
        .await
        .expect_status(StatusCode::OK);
    let _ = s
        .req(Method::GET, "/api/v1/machines", &s.viewer)
        .answer()
        .await;
    let text = s.client.get(s.url("/metrics")).answer().await.text;
    assert!(text.contains("plinth_http_requests_total{method=\"GET\",route=\"/api/v1/machines\",status=\"200\"} 1"), "{text}");
    let doc: Value = s
        .client
        .get(s.url("/api/v1/openapi.json"))
        .answer()
        .await
        .json();
    assert!(doc["openapi"].as_str().expect("version").starts_with("3."));
    for p in [
        "/api/v1/machines",
        "/api/v1/machines/{id}",
        "/api/v1/machines/import",
        "/api/v1/machines/lookup",
        "/api/v1/events",
        "/api/v1/tokens",
    ] {
        assert!(doc["paths"].get(p).is_some(), "{p} documented");
    }
    assert!(doc["components"]["schemas"]["MachineSpec"]["properties"]["interfaces"].is_object());
    s.client
        .get(s.url("/nope"))
        .answer()
        .await
        .expect_status(StatusCode::NOT_FOUND);
    s.finish().await;
}

async fn lifecycle_transitions(b: Backend) {
    let s = TestServer::start(b).await;
    let m = create(&s, &machine("life", "52:54:00:50:00:01")).await;
    let id = m["id"].as_str().expect("id").to_string();
    let post = |body: Value| {
        s.req(
            Method::POST,
            &format!("/api/v1/machines/{id}/state"),
            &s.operator,
        )
        .json(&body)
        .answer()
    };
    // Not allowed: registered -> installed. The answer names the current state and the way on.
    let r = post(json!({"state": "installed"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let e: Value = r.json();
    let msg = e["error"]["message"].as_str().expect("msg");
    assert!(
        msg.contains("a registered machine cannot become installed") && msg.contains("ready"),
        "{msg}"
    );
    // The same state again changes nothing.
    let r = post(json!({"state": "registered"})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["version"], 1);
    for (to, version) in [("ready", 2), ("provisioning", 3), ("installed", 4)] {
        let r = post(json!({"state": to})).await;
        assert_eq!(r.status, StatusCode::OK, "{to}");
        let m: Value = r.json();
        assert_eq!(
            (m["state"].as_str(), m["version"].as_i64()),
            (Some(to), Some(version))
        );
    }
    // failed needs a reason; with one it is kept.
    let r = post(json!({"state": "failed"})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = post(json!({"state": "failed", "reason": "disk /dev/nvme0n1 gone"})).await;
    let m: Value = r.json();
    assert_eq!(m["state_reason"], "disk /dev/nvme0n1 gone");
    // A stale If-Match is refused.
    s.req(
        Method::POST,
        &format!("/api/v1/machines/{id}/state"),
        &s.operator,
    )
    .header("If-Match", "\"2\"")
    .json(&json!({"state": "maintenance"}))
    .answer()
    .await
    .expect_status(StatusCode::PRECONDITION_FAILED);
    // Viewers cannot; unknown states name the field.
    s.req(
        Method::POST,
        &format!("/api/v1/machines/{id}/state"),
        &s.viewer,
    )
    .json(&json!({"state": "ready"}))
    .answer()
    .await
    .expect_status(StatusCode::FORBIDDEN);
    let r = post(json!({"state": "asleep"})).await;
    let e: Value = r.json();
    assert_eq!(e["error"]["fields"][0]["field"], "state");
    // Every change is an event.
    let ev: Value = s
        .get_json(
            &format!("/api/v1/events?machine={id}&kind=machine.state"),
            &s.viewer,
        )
        .await;
    let tos: Vec<&str> = ev
        .as_array()
        .expect("arr")
        .iter()
        .map(|e| e["detail"]["to"].as_str().expect("to"))
        .collect();
    assert_eq!(tos, ["ready", "provisioning", "installed", "failed"]);
    s.finish().await;
}

/// An event stream ends when the token it was opened with is revoked: a revoked credential stops
/// receiving the fleet's events (before, the stream kept flowing for as long as it stayed open).
async fn an_event_stream_ends_when_its_token_is_revoked(b: Backend) {
    use futures::StreamExt;
    let s = TestServer::start(b).await;
    let minted = s
        .req(Method::POST, "/api/v1/tokens", &s.admin)
        .json(&json!({"name": "dashboard", "role": "viewer"}))
        .answer()
        .await
        .expect_status(StatusCode::CREATED)
        .json();
    let (secret, id) = (
        minted["token"].as_str().expect("token").to_string(),
        minted["info"]["id"].as_str().expect("id").to_string(),
    );
    let stream = s
        .req(Method::GET, "/api/v1/events/stream", &secret)
        .send()
        .await
        .expect("the stream opens");
    assert_eq!(stream.status(), StatusCode::OK);
    let mut body = stream.bytes_stream();
    // The stream carries events while the token is live.
    create(&s, &machine("feed-1", "52:54:00:fe:ed:01")).await;
    let mut seen = String::new();
    while !seen.contains("machine.created") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(20), body.next())
            .await
            .expect("an event within 20 s")
            .expect("the stream is open")
            .expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let revoked = s
        .req(Method::DELETE, &format!("/api/v1/tokens/{id}"), &s.admin)
        .answer()
        .await;
    assert!(revoked.status.is_success(), "{}", revoked.status);
    // Then it ends (the feed checks its token every few seconds).
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(Ok(_)) = body.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stream of a revoked token ended");
    s.finish().await;
}

both_backends!(
    an_event_stream_ends_when_its_token_is_revoked,
    lifecycle_transitions,
    crud_with_versions_and_events,
    conflicts_name_the_owner,
    bad_input_names_the_field,
    tokens_and_roles,
    list_filters_and_pages,
    csv_import_is_all_or_nothing,
    import_update_replaces_matching_rows,
    secrets_are_encrypted_at_rest,
    concurrent_edits_one_wins,
    health_metrics_openapi,
);
