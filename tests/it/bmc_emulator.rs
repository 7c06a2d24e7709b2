//! State changes against a live peer: `sushy-emulator --fake` (sushy-tools 2.2.0) with basic auth
//! from an htpasswd file, over HTTP and over HTTPS with a pinned self-signed certificate. Its power
//! transitions are asynchronous (1 to 11 s), so every power call here exercises the polling.

use crate::support::bmc_peers as peers;

use std::sync::atomic::Ordering;

use std::time::Duration;

use plinth::bmc::{
    AuthMode, Bmc, BmcEndpoint, BmcError, BmcOptions, BootMode, BootTarget, CertFingerprint,
    MediaLocation, Password, PowerAction, PowerState, RedfishBmc, TlsPolicy,
};
use plinth::domain::TlsMode;

const USER: &str = "admin";
const PASSWORD: &str = "s3cret-Pa55";

fn options() -> BmcOptions {
    BmcOptions {
        request_timeout: Duration::from_secs(15),
        poll_interval: Duration::from_millis(300),
        // The fake driver applies a transition 1..=11 s after the request.
        power_timeout: Duration::from_secs(40),
        retry_backoff: Duration::from_millis(100),
        ..BmcOptions::default()
    }
}

fn client(url: String, password: &str, tls: TlsPolicy) -> RedfishBmc {
    RedfishBmc::new(
        BmcEndpoint {
            url,
            username: USER.into(),
            password: Password::new(password),
            tls,
        },
        options(),
    )
    .expect("client")
}

fn emulator(tls: bool) -> peers::Emulator {
    peers::sushy_emulator(peers::EmulatorSetup {
        auth: Some((USER.into(), PASSWORD.into())),
        tls,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cycle_with_async_transitions() {
    let emu = emulator(false);
    let bmc = client(emu.peer.url(), PASSWORD, TlsPolicy::PlainHttp);

    assert_eq!(bmc.power_state().await.expect("state"), PowerState::Off);
    // The emulator links no session service: basic auth on every request.
    assert_eq!(bmc.auth_mode(), AuthMode::Basic);

    assert_eq!(
        bmc.power(PowerAction::On).await.expect("on"),
        PowerState::On
    );
    assert_eq!(bmc.power_state().await.expect("state"), PowerState::On);
    assert_eq!(
        bmc.power(PowerAction::Off).await.expect("off"),
        PowerState::Off
    );
    // PowerCycle is not among the emulator's reset types: off, wait for Off, on.
    assert_eq!(
        bmc.power(PowerAction::Cycle).await.expect("cycle from off"),
        PowerState::On
    );
    assert_eq!(
        bmc.power(PowerAction::Cycle).await.expect("cycle from on"),
        PowerState::On
    );
    assert_eq!(
        bmc.power(PowerAction::GracefulRestart)
            .await
            .expect("graceful restart"),
        PowerState::On
    );
    let caps = bmc.capabilities().await.expect("caps");
    assert!(!caps.reset_types.iter().any(|r| r == "PowerCycle"));
    assert_eq!(caps.auth, "basic");
    assert!(!caps.sessions);
    bmc.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_refused() {
    let emu = emulator(false);
    let bmc = client(emu.peer.url(), "wrong", TlsPolicy::PlainHttp);
    match bmc.power_state().await {
        Err(BmcError::Unauthorized(msg)) => assert!(!msg.contains("wrong"), "{msg}"),
        other => panic!("expected Unauthorized, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_override_is_read_back() {
    let emu = emulator(false);
    let bmc = client(emu.peer.url(), PASSWORD, TlsPolicy::PlainHttp);
    assert_eq!(
        bmc.quirks().await.expect("quirks").name,
        "sushy-emulator",
        "the emulator keeps overrides Continuous; its row says so"
    );

    let ov = bmc
        .boot_once(BootTarget::Pxe, Some(BootMode::Uefi))
        .await
        .expect("pxe");
    assert_eq!(ov.target.as_deref(), Some("Pxe"));
    assert_eq!(ov.mode.as_deref(), Some("UEFI"));
    assert_eq!(ov.enabled.as_deref(), Some("Continuous"));

    // UefiHttp without an HttpBootUri: the emulator quietly stores Pxe instead. The read-back
    // catches it and says what the BMC holds.
    match bmc.boot_once(BootTarget::Http, None).await {
        Err(e @ BmcError::BootNotApplied { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("target UefiHttp"), "{msg}");
            assert!(msg.contains("the BMC holds target Pxe"), "{msg}");
        }
        other => panic!("expected BootNotApplied, got {other:?}"),
    }

    let ov = bmc
        .boot_once(BootTarget::Cd, Some(BootMode::Legacy))
        .await
        .expect("cd legacy");
    assert_eq!(ov.target.as_deref(), Some("Cd"));
    assert_eq!(ov.mode.as_deref(), Some("Legacy"));

    match bmc
        .boot_once(BootTarget::Http, Some(BootMode::Legacy))
        .await
    {
        Err(BmcError::NotSupported(msg)) => assert!(msg.contains("UEFI"), "{msg}"),
        other => panic!("expected NotSupported, got {other:?}"),
    }
    bmc.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_media_insert_and_eject() {
    let emu = emulator(false);
    let (base, hits, server) = peers::image_server().await;
    let bmc = client(emu.peer.url(), PASSWORD, TlsPolicy::PlainHttp);

    let st = bmc.media_status().await.expect("status");
    assert_eq!(st.location, MediaLocation::System);
    assert!(st.slot.ends_with("/VirtualMedia/Cd"), "{}", st.slot);
    assert!(!st.inserted);

    let first = format!("{base}/talos-a.iso");
    let st = bmc.media_insert(&first).await.expect("insert");
    assert!(st.inserted);
    assert_eq!(st.image.as_deref(), Some(first.as_str()));
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "the emulator downloaded the image"
    );

    // A second insert ejects the first image before inserting.
    let second = format!("{base}/talos-b.iso");
    let st = bmc.media_insert(&second).await.expect("re-insert");
    assert_eq!(st.image.as_deref(), Some(second.as_str()));
    assert_eq!(hits.load(Ordering::SeqCst), 2);

    let st = bmc.media_eject().await.expect("eject");
    assert!(!st.inserted);
    assert_eq!(st.image, None);
    // Ejecting an empty slot is a no-op.
    assert!(!bmc.media_eject().await.expect("eject again").inserted);
    assert!(!bmc.media_status().await.expect("status").inserted);

    bmc.close().await.expect("close");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_pinned_fingerprint() {
    let emu = emulator(true);
    let fp = emu.fingerprint.clone().expect("fingerprint");
    let pinned = TlsPolicy::from_inventory(TlsMode::Pinned, Some(&fp)).expect("pin");

    let bmc = client(emu.peer.url(), PASSWORD, pinned);
    assert_eq!(bmc.power_state().await.expect("state"), PowerState::Off);
    assert_eq!(
        bmc.power(PowerAction::On).await.expect("on"),
        PowerState::On
    );
    let ov = bmc
        .boot_once(BootTarget::Pxe, None)
        .await
        .expect("boot over TLS");
    assert_eq!(ov.target.as_deref(), Some("Pxe"));
    assert_eq!(bmc.capabilities().await.expect("caps").tls, TlsMode::Pinned);
    bmc.close().await.expect("close");

    // Another certificate's pin: the handshake is refused, and the error says why.
    let wrong = TlsPolicy::Pinned(CertFingerprint([7u8; 32]));
    let err = client(emu.peer.url(), PASSWORD, wrong)
        .power_state()
        .await
        .expect_err("wrong pin must fail");
    let msg = err.to_string();
    assert!(matches!(err, BmcError::Transport { .. }), "{msg}");
    assert!(msg.contains("pinned"), "{msg}");

    // System roots do not know a self-signed BMC certificate.
    let err = client(emu.peer.url(), PASSWORD, TlsPolicy::Verify)
        .power_state()
        .await
        .expect_err("self-signed must fail verification");
    assert!(matches!(err, BmcError::Transport { .. }), "{err}");

    // Explicitly insecure works, and says so.
    let bmc = client(emu.peer.url(), PASSWORD, TlsPolicy::Insecure);
    assert_eq!(bmc.power_state().await.expect("state"), PowerState::On);
    assert_eq!(
        bmc.capabilities().await.expect("caps").tls,
        TlsMode::Insecure
    );
}
