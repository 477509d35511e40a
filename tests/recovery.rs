//! Control-plane crashes and process restarts, on paused tokio time.

mod support;

use std::{sync::Arc, sync::atomic::Ordering, time::Duration};

use flotilla::{ApplicationStatus as A, Serve, ServeOptions};
use support::{ProbeArgs, Switches, app, registry, start};

fn tag(t: &str) -> ProbeArgs {
    ProbeArgs {
        tag: t.into(),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn controller_crash_keeps_apps_running_replicas_alive_and_handles_serving() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let serve = start(&dir, &sw).await;
    let handles = serve
        .run_many(
            (0..3).map(|i| app(&format!("a{i}"), 2, tag("v"))).collect(),
            Default::default(),
        )
        .await
        .unwrap();
    let built = sw.constructed.load(Ordering::SeqCst);
    let ids: Vec<_> = handles.iter().map(|h| h.replicas()[0].id()).collect();

    serve.crash_controller();
    // Requests keep being served while the Controller restarts.
    for h in &handles {
        assert_eq!(h.call::<_, String>("x").await.unwrap(), "v:x");
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let m = serve.metrics().await.unwrap();
    assert_eq!(m.controller_restarts, 1);
    assert_eq!(
        m.controller.app_actors, 3,
        "living application actors were re-adopted"
    );
    assert_eq!(
        sw.constructed.load(Ordering::SeqCst),
        built,
        "no replica restarted"
    );
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.replicas()[0].id(), ids[i]);
        assert_eq!(serve.app_status(&format!("a{i}")).status, A::Running);
    }
    // The restarted Controller takes new work.
    serve.run(app("b", 1, tag("w"))).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn whole_process_restart_brings_every_acknowledged_app_back() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    {
        let serve = start(&dir, &sw).await;
        serve
            .run_many(
                (0..50)
                    .map(|i| app(&format!("a{i}"), 1, tag("v")))
                    .collect(),
                Default::default(),
            )
            .await
            .unwrap();
        serve.delete_apps(&["a7"], true).await.unwrap();
        serve.shutdown().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let serve =
        Serve::start(ServeOptions::new(registry(&sw)).store_path(dir.path().join("f.redb")))
            .await
            .unwrap();
    for i in 0..50 {
        let name = format!("a{i}");
        if i == 7 {
            assert_eq!(
                serve.app_status(&name).status,
                A::NotStarted,
                "no resurrection"
            );
            continue;
        }
        let s = support::wait_status(&serve, &name, A::Running).await;
        assert_eq!(s.observed_generation, 1);
        let h = serve.app_handle(&name).unwrap();
        assert_eq!(h.call::<_, String>("y").await.unwrap(), "v:y");
    }
}
