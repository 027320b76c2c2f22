//! Every C object made through the bindings is freed: the live-handle count returns to zero.
//! (One test in its own binary, so that no other test moves the count meanwhile.)

mod common;

use common::{generate, kgram, Lookup};
use specinfer::plugin::Drafter;
use specinfer::{live_handles, Coupler, ModelInfo, Registry, Session, SessionParams, Sketcher};

#[test]
fn no_handle_leaks() {
    assert_eq!(live_handles(), 0);
    {
        let reg = Registry::with_threads(1).unwrap();
        reg.register_drafter("lookup-rs", "", |_: &str, _: &ModelInfo| {
            Ok(Box::new(Lookup { n_max: 2, begins: Default::default() }) as Box<dyn Drafter>)
        })
        .unwrap();
        let mut target = kgram(&reg, 4);
        let coupler = Coupler::new("greedy").unwrap();
        let _sk = Sketcher::new("qjl", 8, 16, 1, "").unwrap();
        let mut d = reg.open_drafter("lookup-rs", "", &target).unwrap();
        let mut n = reg.open_drafter("ngram", "", &target).unwrap();
        assert_eq!(live_handles(), 7); // registry, target, coupler, sketcher, 2 drafters, 1 Rust instance
        generate(&mut target, Some(&mut d), Some(&coupler), 40);
        {
            let mut s = Session::new(&mut target, Some(&mut n), None, &SessionParams::default()).unwrap();
            assert_eq!(live_handles(), 8);
            s.feed_text("x").unwrap();
            let _ = s.stream(10).count();
        }
        // A constraint and its fork (when the plugin is there), used by a session and then not.
        if let Ok(mut c) = reg.open_constraint("llguidance", "", &target, "regex", "[a-e]+") {
            let f = c.fork().unwrap();
            assert_eq!(live_handles(), 9);
            {
                let mut s = Session::new(&mut target, None, None, &SessionParams::default()).unwrap();
                s.set_constraint(Some(&mut c)).unwrap();
                s.feed_text("x").unwrap();
                s.generate(4).unwrap();
            }
            drop(c);
            drop(f);
            assert!(reg.open_constraint("llguidance", "", &target, "regex", "(").is_err());
        }
        // Failed creations leave nothing behind.
        assert!(reg.open_target("kgram", "bogus=1").is_err());
        assert!(reg.open_drafter("lookup-rs", "", &target).is_ok());
        assert!(Coupler::new("nope").is_err());
        assert_eq!(live_handles(), 7);
        // Dropping the target before its drafters is fine: they keep it alive.
        drop(target);
        assert_eq!(live_handles(), 7);
        drop(d);
        assert_eq!(live_handles(), 5);
        drop(n); // the last holder of the target: both go
        assert_eq!(live_handles(), 3);
        drop(reg); // still held by nothing else: destroyed now
        assert_eq!(live_handles(), 2);
    }
    assert_eq!(live_handles(), 0);
    // Slots are given back: registering again in a new registry works many times over.
    for i in 0..40 {
        let reg = Registry::with_threads(1).unwrap();
        reg.register_drafter(&format!("lookup{i}"), "", |_: &str, _: &ModelInfo| {
            Ok(Box::new(Lookup { n_max: 1, begins: Default::default() }) as Box<dyn Drafter>)
        })
        .unwrap();
        if i % 2 == 0 {
            reg.unload_plugin(&format!("lookup{i}")).unwrap();
        }
    }
    assert_eq!(live_handles(), 0);
}
