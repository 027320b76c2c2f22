//! Training drafters through `Registry::train_drafter`: refusals of drafters with nothing to
//! train and of bad arguments, and, with the train-probe plugin (bindings/testdata), the
//! parameters and progress reports that cross the C ABI and cancelling from the callback.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::{corpus, kgram, train_probe_plugin, Lookup};
use specinfer::plugin::Drafter;
use specinfer::{Code, ModelInfo, Registry, TrainParams};

fn out_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn params(out: &std::path::Path) -> TrainParams<'static> {
    TrainParams { corpus: vec![corpus().into()], out_path: out.into(), ..Default::default() }
}

#[test]
fn drafters_with_nothing_to_train_are_unsupported() {
    let reg = Registry::with_threads(2).unwrap();
    reg.register_drafter("lookup-rs", "", |_: &str, _: &ModelInfo| {
        Ok(Box::new(Lookup { n_max: 2, begins: Default::default() }) as Box<dyn Drafter>)
    })
    .unwrap();
    let mut target = kgram(&reg, 4);
    let out = out_dir("nothing-to-train").join("heads.gguf");
    for plugin in ["ngram", "kgram", "lookup-rs"] {
        let mut called = false;
        let e = reg
            .train_drafter(
                plugin,
                &mut target,
                TrainParams {
                    progress: Some(Box::new(|_| {
                        called = true;
                        true
                    })),
                    ..params(&out)
                },
            )
            .unwrap_err();
        assert_eq!(e.code(), Code::Unsupported, "{plugin}: {e}");
        assert!(e.message().contains(&format!("'{plugin}' has nothing to train")), "{e}");
        assert!(!called, "{plugin}: progress called");
    }
    assert!(!out.exists());
    // The target is still usable afterwards.
    let (text, _) = common::generate(&mut target, None, None, 20);
    assert!(!text.is_empty());
}

#[test]
fn bad_training_arguments_are_errors() {
    let reg = Registry::with_threads(2).unwrap();
    let mut target = kgram(&reg, 4);
    let out = out_dir("bad-arguments").join("heads.gguf");
    let check = |r: specinfer::Result<()>, code: Code, part: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        assert!(e.message().contains(part), "{e}");
    };
    check(
        reg.train_drafter("ngram", &mut target, TrainParams { out_path: PathBuf::new(), ..params(&out) }),
        Code::InvalidArgument,
        "out_path",
    );
    check(reg.train_drafter("no-such-plugin", &mut target, params(&out)), Code::NotFound, "no-such-plugin");
    check(reg.train_drafter("gguf", &mut target, params(&out)), Code::NotFound, "no drafter");
    check(reg.train_drafter("ng\0ram", &mut target, params(&out)), Code::InvalidArgument, "NUL");
    check(
        reg.train_drafter("ngram", &mut target, TrainParams { config: "a\0b".into(), ..params(&out) }),
        Code::InvalidArgument,
        "NUL",
    );
    check(
        reg.train_drafter("ngram", &mut target, TrainParams { corpus: vec!["a\0b".into()], ..params(&out) }),
        Code::InvalidArgument,
        "NUL",
    );
}

#[test]
fn progress_reports_and_parameters_cross_the_abi() {
    let Some(plugin) = train_probe_plugin() else { return };
    let reg = Registry::with_threads(2).unwrap();
    reg.load_plugin(plugin.to_str().unwrap()).unwrap();
    let mut target = kgram(&reg, 4);
    let dir = out_dir("probe");
    let out = dir.join("heads.gguf");
    let _ = std::fs::remove_file(&out);

    // Every report arrives, in order, with its fields; then the parameters are written down.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    reg.train_drafter(
        "train-probe",
        &mut target,
        TrainParams {
            config: "heads=2,epochs=1".into(),
            corpus: vec!["/data/a.txt".into(), "/data/b b.txt".into()],
            out_path: out.clone(),
            progress: Some(Box::new(move |p| {
                s.lock().unwrap().push((p.stage.to_string(), p.done, p.total, p.loss, p.accuracy.map(|a| a.to_vec())));
                true
            })),
        },
    )
    .unwrap();
    let want = vec![
        ("collect".to_string(), 0, 2, None, None),
        ("collect".to_string(), 1, 2, None, None),
        ("collect".to_string(), 2, 2, None, None),
        ("train".to_string(), 1, 2, Some(2.5), None),
        ("train".to_string(), 2, 2, Some(1.5), None),
        ("evaluate".to_string(), 1, 1, Some(1.5), Some(vec![0.5f32, 0.25])),
    ];
    assert_eq!(*seen.lock().unwrap(), want);
    let written = std::fs::read_to_string(&out).unwrap();
    assert_eq!(written, "config=heads=2,epochs=1\ncorpus=2\n/data/a.txt\n/data/b b.txt\n");

    // No callback, no config, no corpus: the plugin gets NULLs and zero.
    reg.train_drafter("train-probe", &mut target, TrainParams { out_path: out.clone(), ..Default::default() }).unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "config=(null)\ncorpus=0\n");

    // Returning false cancels at once.
    std::fs::remove_file(&out).unwrap();
    let mut calls = 0;
    let e = reg
        .train_drafter(
            "train-probe",
            &mut target,
            TrainParams {
                progress: Some(Box::new(|p| {
                    calls += 1;
                    p.stage != "train"
                })),
                ..params(&out)
            },
        )
        .unwrap_err();
    assert_eq!(e.code(), Code::Cancelled, "{e}");
    assert!(e.message().contains("train-probe: cancelled during train 1"), "{e}");
    assert_eq!(calls, 4);
    assert!(!out.exists());

    // The plugin's own refusal comes back with its code and message.
    let e = reg
        .train_drafter("train-probe", &mut target, TrainParams { config: "fail=1".into(), ..params(&out) })
        .unwrap_err();
    assert_eq!(e.code(), Code::Config);
    assert!(e.message().contains("train-probe: asked to fail"), "{e}");

    // A panic in the callback stops the training and resumes in the caller.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reg.train_drafter(
            "train-probe",
            &mut target,
            TrainParams { progress: Some(Box::new(|_| panic!("progress bug 9"))), ..params(&out) },
        )
    }));
    let p = r.unwrap_err();
    assert_eq!(p.downcast_ref::<&str>(), Some(&"progress bug 9"));
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
