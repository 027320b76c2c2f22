//! Opens a target, picks a drafter and a coupler, streams text and prints the statistics.
//!   cargo run --example stream -- TRAINING_TEXT "PROMPT" [DRAFTER] [COUPLER]
//! e.g. cargo run --example stream -- ../../abi/specinfer.h "/* Creates a" ngram greedy
use std::io::Write;

use specinfer::{Coupler, Registry, Session, SessionParams};

fn main() -> Result<(), specinfer::Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: {} TRAINING_TEXT PROMPT [DRAFTER] [COUPLER]", args[0]);
        std::process::exit(2);
    }
    let drafter_name = args.get(3).map_or("ngram", |s| s.as_str());
    let coupler_spec = args.get(4).map_or("greedy", |s| s.as_str());

    let registry = Registry::new()?;
    let mut target = registry.open_target("kgram", &format!("path={},k=6", args[1]))?;
    let mut drafter = registry.open_drafter(drafter_name, "", &target)?;
    let coupler = Coupler::new(coupler_spec)?;
    let mut session = Session::new(&mut target, Some(&mut drafter), Some(&coupler), &SessionParams::default())?;

    session.feed_text(&args[2])?;
    for chunk in session.stream(200) {
        print!("{}", chunk?);
        std::io::stdout().flush().ok();
    }
    let st = session.stats()?;
    println!(
        "\n{} tokens, acceptance {:.2}, {:.2} tokens per target pass, {:.0} tokens/s",
        st.n_generated, st.acceptance_rate, st.mean_accepted, st.tokens_per_second
    );
    Ok(())
}
