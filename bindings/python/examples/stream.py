"""Opens a target, picks a drafter and a coupler, streams text and prints the statistics.

    python3 examples/stream.py TRAINING_TEXT "PROMPT" [DRAFTER] [COUPLER]
"""
import sys

import specinfer


def main(argv):
    if len(argv) < 3:
        print(f"usage: {argv[0]} TRAINING_TEXT PROMPT [DRAFTER] [COUPLER]", file=sys.stderr)
        return 2
    drafter_name = argv[3] if len(argv) > 3 else "ngram"
    coupler_spec = argv[4] if len(argv) > 4 else "greedy"

    registry = specinfer.Registry()
    target = registry.open_target("kgram", f"path={argv[1]},k=6")
    drafter = registry.open_drafter(drafter_name, "", target)
    coupler = specinfer.Coupler(coupler_spec)
    with specinfer.Session(target, drafter, coupler) as session:
        session.feed_text(argv[2])
        for chunk in session.stream(200):
            print(chunk, end="", flush=True)
        st = session.stats()
    print(f"\n{st.n_generated} tokens, acceptance {st.acceptance_rate:.2f}, "
          f"{st.mean_accepted:.2f} tokens per target pass, {st.tokens_per_second:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except specinfer.SpecinferError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
